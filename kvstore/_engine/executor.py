"""The executor: how a store sends the core's requests, written once for sync and asyncio.

A core operation yields requests, Eval (a script) and Batch (native commands), and takes their
replies. The executor decides how each goes out: FCALL, FCALL_RO or EVALSHA; FUNCTION LOAD
pipelined with the call again where the function is missing; EVAL after NOSCRIPT; WAIT or
WAITAOF after a durable write; the call re-sent while a cluster refuses it. Those decisions are
generators of IO steps (Send, Pipeline, Sleep). A driver (kvstore/_engine/drivers.py) makes
each step on the store's client and sends the reply back in, or throws the exception in. The
sync driver calls ``step(store)``, the asyncio driver awaits it: that, and ``close``, is all the
two stores do differently. Which typed error a failure is, and whether its command was sent at
all, is kvstore/_engine/failures.py's part.

Why steps rather than a sync module generated from the async one (unasync): one module to read,
nothing generated to keep fresh and no build step, the sans-IO pattern of the core carried one
level down, and the decisions can be followed (and driven) without a server. The cost is a few
generator frames per request: about 0.7 µs of Python per call more than two hand-written
executors (measured with a client that answers at once), under 1 % of a sync append's round trip.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import (
    ClusterError,
    NoPermissionError,
    NoScriptError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import errors
from ..config import StoreConfig
from . import core
from .core import Batch, Eval, ThreadRef
from .drivers import Pipeline, Send, Sleep, Steps
from .failures import (
    CALL,
    Call,
    batch_error,
    check_durable,
    decodes_responses,
    durability_unavailable,
    failed_on_stale_connection,
    is_cluster,
    is_fakeredis,
    script_error,
    track_sends,
)
from .primary import OnPrimary
from .scripts import LIBRARY, SCRIPTS, Script

# A cluster refuses a thread's calls while its slot migrates (TRYAGAIN, ASK, MOVED): redis-py
# retries briefly, then gives up with ClusterError, meaning no attempt ran. The store goes on
# re-sending, backing off, for this long.
CLUSTER_REFUSAL_SECONDS = 10.0
# A call whose function is missing is sent again right after a FUNCTION LOAD, on one pipeline.
# The server reads a library that large apart from the call after it, so a FUNCTION FLUSH can
# still run between the two (nothing ran then): the pair is sent up to this many times.
LOAD_ATTEMPTS = 10
# The writing scripts a call of which, sent again after it ran, is a replay: an append carries
# its messages' ids (made by the client when the caller gave none), a compact its summary's id
# (made from the summary and its range); start_turn and finish_turn return what the first call
# recorded, a held turn's start and a publish carry their call id; retain and migrate do what is
# left to do, and renew_turn renews or expires again. Only these are sent again after a stale
# pooled connection failed (and reads): replace, remove_turn, delete and the restores are not.
RETRY_SAFE_WRITES = frozenset(
    {"append", "compact", "start_turn", "finish_turn", "publish", "retain", "migrate", "renew_turn"}
)

# ------------------------------------------------------------------- what a store keeps

# The threads whose ThreadRef (keys, limits, read hints) a store keeps: ~2 KB each at most.
KEPT_THREADS = 1024


class Executor:
    """What a store keeps between calls: its client, config, script variants, whether the server
    has functions."""

    def __init__(
        self,
        client: Any,
        config: StoreConfig | None = None,
        count_tokens: Callable[[Any], int] | None = None,
    ) -> None:
        self.client = client
        self.config = config if config is not None else StoreConfig()
        if count_tokens is not None and not callable(count_tokens):
            raise errors.ConfigError(
                f"count_tokens must be a function of a message, not {type(count_tokens).__name__}"
            )
        self._count_tokens = count_tokens
        if decodes_responses(client):
            raise errors.ConfigError(
                "the client must return bytes: create it with decode_responses=False"
            )
        self._scripts = dict(SCRIPTS)
        if is_fakeredis(client):
            # fakeredis's Lua does not parse the shebang line.
            self._scripts = {name: s.without_shebang() for name, s in SCRIPTS.items()}
        # FCALL needs the server's functions (Redis 7, Valkey 7.2); a RedisCluster client finds
        # an FCALL's slot with COMMAND GETKEYS round trips (redis-py before 8.2), an EVALSHA's from
        # its arguments.
        self.functions = self.config.scripting == "functions" and not is_cluster(client)
        self._durability_checked = False
        self._tracks_sends = track_sends(client)
        self._on_request: Callable[[Eval | Batch], Any] | None = None
        # The store's open watchers (watch_drivers.py), which close() stops.
        self._watchers: weakref.WeakSet[Any] = weakref.WeakSet()
        # Each thread's ThreadRef, kept: its keys and limits are computed once (~8 us), and its
        # read hints (ThreadRef.hints) are shared by the store's handles of it, so a backend that
        # takes a new handle per request still reads ahead. Bounded, emptied when full.
        self._refs: dict[tuple[str, str | None], ThreadRef] = {}

    def _thread_ref(self, thread_id: str, owner: str | None = None) -> ThreadRef:
        """The ThreadRef of `thread_id` (of `owner`) every handle of this store shares."""
        if type(thread_id) is not str or not (owner is None or type(owner) is str):
            # Not kept: ThreadRef.of refuses it typed (a list is not even a key of the dict).
            return ThreadRef.of(self.config, thread_id, self._count_tokens, owner)
        ref = self._refs.get((thread_id, owner))
        if ref is None:
            if len(self._refs) >= KEPT_THREADS:
                self._refs.clear()
            ref = ThreadRef.of(self.config, thread_id, self._count_tokens, owner)
            self._refs[(thread_id, owner)] = ref
        return ref

    if TYPE_CHECKING:
        # A store's driver (kvstore/_engine/drivers.py), mixed in beside this class, makes steps.
        def _finish(self, steps: Steps) -> Any: ...

    def _script(self, request: Eval) -> Script:
        return self._scripts[request.script.name]

    def _missed(self, reply: Any) -> bool:
        """Whether a call did not run because the server lacks its script or function, or knows
        no functions at all: this store then uses the EVAL path from now on."""
        if isinstance(reply, NoScriptError):
            return True
        if not isinstance(reply, ResponseError):
            return False
        # No function of that name: FUNCTION FLUSH, a restart without persistence, a new version.
        if str(reply).startswith("Function not found"):
            return True
        # The server, or a proxy in front of it, does not know FCALL or FUNCTION.
        if self.functions and str(reply).lower().startswith(
            ("unknown command", "unknown subcommand")
        ):
            self.functions = False
            return True
        return False

    def _load_failed(self, script: Script, loaded: Any) -> errors.KVStoreError | None:
        """What a FUNCTION LOAD reply means for a call that still found no function (nothing
        ran): None where the call may be sent again (loaded, loaded by another client, or a
        server without functions, which the EVAL path serves)."""
        if isinstance(loaded, NoPermissionError):
            return errors.PermissionDenied(
                f"{script.name}: the server lacks kvstore's function library {LIBRARY.name} and this"
                f" user may not load it ({loaded}): run `kvstore preload-scripts` as a user allowed"
                " to, or allow function|load"
            )
        if (
            not isinstance(loaded, ResponseError)
            or "already exists" in str(loaded)
            or self._missed(loaded)
        ):
            return None
        return script_error(script, loaded, Call())

    def _wait_command(self) -> tuple[Any, ...]:
        """What a durable write sends right after its script, on the same connection."""
        timeout = self.config.durability_timeout_ms
        if self.config.durability == "fsync":
            return ("WAITAOF", 1, 0, timeout)
        return ("WAIT", self.config.durability_replicas, timeout)


# ------------------------------------------------------------------- the decisions


def operate(store: Executor, operation: Generator[Any, Any, Any]) -> Steps:
    """The steps of a core operation, each request's in turn: a typed error goes back into the
    operation (it may handle it); an output (core.pages' pages) passes through."""
    operation = core.finishing_deletes(operation)
    reply: Any = None
    failure: errors.KVStoreError | None = None
    while True:
        try:
            item = operation.send(reply) if failure is None else operation.throw(failure)
        except StopIteration as done:
            return done.value
        reply = failure = None
        if not isinstance(item, (Eval, Batch)):
            yield item
            continue
        try:
            reply = yield from execute(store, item)
        except errors.KVStoreError as exc:
            failure = exc


def execute(store: Executor, request: Eval | Batch) -> Steps:
    """The steps of one request, sent again, backing off, while a cluster refuses it; sent again
    once, on a fresh connection, where it is retry-safe and failed on a stale pooled one."""
    if store._on_request is not None:
        store._on_request(request)
    deadline, delay = None, 0.02
    stale: errors.KVStoreError | None = None  # the failure the fresh attempt follows
    while True:
        call = Call(store._tracks_sends, fresh=stale is not None)
        token = CALL.set(call)
        try:
            return (yield from _attempt(store, request, call))
        except ClusterError as exc:  # every attempt was refused: nothing ran
            refused = exc
        except errors.KVStoreError as exc:
            if stale is None and retry_safe(request) and failed_on_stale_connection(exc, call):
                stale = exc
                continue
            # A fresh attempt that could not connect says less than the first attempt's error.
            if stale is not None and isinstance(exc, errors.ConnectionFailed):
                raise stale from exc.__cause__
            raise
        except BaseException as exc:
            if not isinstance(exc, Exception):  # KeyboardInterrupt, a signal, cancellation
                for connection in call.sent_on:
                    connection.kvstore_unread()
            raise
        finally:
            CALL.reset(token)
        # The clock starts at the first refusal: nothing to read on a call that goes through.
        deadline = deadline or time.monotonic() + CLUSTER_REFUSAL_SECONDS
        if time.monotonic() > deadline:
            raise errors.ServerError(
                f"the cluster refused the call for {CLUSTER_REFUSAL_SECONDS:.0f} s (its slot is"
                f" moving or unserved); nothing was written: {refused}"
            ) from refused
        yield Sleep(delay)
        delay = min(delay * 2, 0.25)


def _attempt(store: Executor, request: Eval | Batch, call: Call) -> Steps:
    if isinstance(request, Batch):
        try:
            return (yield Pipeline(request.commands))
        except (ResponseError, RedisConnectionError, RedisTimeoutError) as exc:
            raise batch_error(exc, call) from exc
    return (yield from _script_call(store, request, call))


def retry_safe(request: Eval | Batch) -> bool:
    """Whether sending `request` again after it ran is a replay: a read, or a write in
    RETRY_SAFE_WRITES."""
    if isinstance(request, Batch):
        return True  # native reads
    return not request.script.writes or request.script.name in RETRY_SAFE_WRITES


def _script_call(store: Executor, request: Eval, call: Call) -> Steps:
    script = store._script(request)
    try:
        if script.writes and store.config.durability != "default":
            return (yield from _durable_call(store, script, request))
        functions = store.functions
        try:
            return (yield Send(request_command(store, request)))
        except ResponseError as exc:
            if not store._missed(exc):
                raise
        if functions:  # FUNCTION LOAD and the call again, in one round trip
            return (yield from _reloaded_call(store, script, request, None))
        # EVAL sends the source and caches it again: no window for a second flush. (Sent
        # alone: a cluster client's pipeline does not take EVAL.)
        return (yield Send(_eval_command(script, request)))
    except (ResponseError, RedisConnectionError, RedisTimeoutError) as exc:
        raise script_error(script, exc, call) from exc


def _durable_call(store: Executor, script: Script, request: Eval) -> Steps:
    """The write and, on the same connection, WAIT or WAITAOF."""
    if not store._durability_checked and store.config.durability == "fsync":
        # Refuse before the first write where WAITAOF cannot work (no command, no AOF).
        (probe,) = yield _on_thread_primary(store, request, [("WAITAOF", 1, 0, 1)])
        if isinstance(probe, ResponseError):
            raise durability_unavailable(store.config, probe) from probe
        if isinstance(probe, Exception):
            raise probe
    store._durability_checked = True
    wait = store._wait_command()
    reply, waited = yield _on_thread_primary(
        store, request, (request_command(store, request), wait)
    )
    if store._missed(reply):
        return (yield from _reloaded_call(store, script, request, wait))
    if isinstance(reply, Exception):
        raise reply
    check_durable(store.config, script, waited)
    return reply


def _on_thread_primary(
    store: Executor, request: Eval, commands: Sequence[Sequence[Any]]
) -> Pipeline | OnPrimary:
    """A durable write's commands on one connection: the client's own pipeline, or on a cluster
    the connection of the primary that owns the thread's slot (kvstore/_engine/primary.py)."""
    if is_cluster(store.client):
        return OnPrimary(request.keys[0], commands)
    return Pipeline(commands, raise_on_error=False)


def _reloaded_call(
    store: Executor, script: Script, request: Eval, wait: tuple[Any, ...] | None
) -> Steps:
    """The call again, after the server lacked its script (nothing ran), on one pipeline with
    what loads the script first (FUNCTION LOAD, or EVAL instead of the call), and the durable
    write's WAIT after it."""
    for _ in range(LOAD_ATTEMPTS):
        if store.functions:
            commands = [("FUNCTION LOAD", LIBRARY.source), request_command(store, request)]
        else:
            commands = [_eval_command(script, request)]
        sent = [*commands, *([wait] if wait else [])]
        replies = yield (
            _on_thread_primary(store, request, sent)
            if wait
            else Pipeline(sent, raise_on_error=False)
        )
        reply = replies[len(commands) - 1]
        if store._missed(reply):
            failed = store._load_failed(script, replies[0]) if len(commands) > 1 else None
            if failed:
                raise failed
            continue  # loaded, and flushed again before the call ran
        if isinstance(reply, Exception):
            raise reply
        if wait:
            check_durable(store.config, script, replies[-1])
        return reply
    raise errors.ServerError(
        f"{script.name}: kvstore's functions were gone again each of the {LOAD_ATTEMPTS} times"
        " they were loaded (FUNCTION FLUSH in a loop?); nothing ran"
    )


def request_command(store: Executor, request: Eval) -> tuple[Any, ...]:
    """The command `store` sends for a script request: FCALL of its function, FCALL_RO for a
    script that declares no-writes (so a replica may serve it), or EVALSHA on the EVAL path."""
    script, keys, args = store._script(request), request.keys, request.args
    if not store.functions:
        return ("EVALSHA", script.sha, len(keys), *keys, *args)
    if script.writes:
        return ("FCALL", script.function, len(keys), *keys, *args)
    return ("FCALL_RO", script.function, len(keys), *keys, *args)


def _eval_command(script: Script, request: Eval) -> tuple[Any, ...]:
    return ("EVAL", script.source, len(request.keys), *request.keys, *request.args)


# ------------------------------------------------------------------- hooks for tests and benchmarks


def send_request(store: Executor, request: Eval | Batch) -> Any:
    """Sends one core request as `store`'s operations send it (every path above, the same typed
    errors; an interrupted delete is not finished): the reply, or on an asyncio store an
    awaitable of it. For tests and benchmarks that drive an operation a request at a time."""
    return store._finish(execute(store, request))


def record(store: Executor, sink: Callable[[Eval | Batch], Any] | None) -> None:
    """From now on `store` hands each request its operations send to `sink` first (once, however
    often it is re-sent); None stops it. For benchmarks that replay what an operation sent, and
    tests that check it."""
    store._on_request = sink
