"""MessageStore and AsyncMessageStore: thin executors over the sans-IO core.

Each thread method hands one core operation to its store's executor. The executor calls a script
as a function of kvstore's library (FCALL, FCALL_RO; FUNCTION LOAD where the server lacks it) or
by SHA (EVALSHA; EVAL on NOSCRIPT), sends native commands in one pipeline, and maps server errors
to kvstore's typed errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Generator, Iterable, Iterator
from contextvars import ContextVar
from typing import Any, Literal

import redis
import redis.asyncio
from redis.exceptions import ClusterError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, NoPermissionError, NoScriptError, OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import errors
from ._engine import core
from ._engine.core import Batch, Cursor, Eval, Operation, ThreadRef
from ._engine.health import HealthReport, health
from ._engine.scripts import LIBRARY, SCRIPTS, Script, error_from_reply
from .config import StoreConfig
from .messages import CompactionStats, Message, SummaryMessage
from .models import AppendResult, MessagesPage, ThreadSnapshot, ThreadStats, TurnOutcome, TurnResult

# A cluster refuses a thread's calls while its slot migrates (TRYAGAIN, ASK, MOVED): redis-py
# retries briefly, then gives up with ClusterError, meaning no attempt ran. The store goes on
# re-sending, backing off, for this long.
CLUSTER_REFUSAL_SECONDS = 10.0
# A call whose function is missing is sent again right after a FUNCTION LOAD, on one pipeline.
# The server reads a library that large apart from the call after it, so a FUNCTION FLUSH can
# still run between the two (nothing ran then): the pair is sent up to this many times.
LOAD_ATTEMPTS = 10


# ------------------------------------------------------------------- what a call has sent
#
# A call that failed may have run only if its command reached a socket: a refused connection,
# a connect timeout or a full pool sent nothing, while a first attempt that timed out and a
# retry whose reconnect was refused may have run. The final exception does not tell them
# apart, so the connections of a standalone client's pool record it, per call, in _CALL.


class _Call:
    """What the current call did: used one of the tracked connections, wrote its command on
    the connections in `sent_on`."""

    __slots__ = ("touched", "sent_on")

    def __init__(self) -> None:
        self.touched = False
        self.sent_on: list[Any] = []


_CALL: ContextVar[_Call | None] = ContextVar("kvstore_call", default=None)


def _touched() -> None:
    call = _CALL.get()
    if call is not None:
        call.touched = True


def _sent(connection: Any) -> None:
    call = _CALL.get()
    if call is not None:
        call.touched = True
        call.sent_on.append(connection)


class _TracksSends:
    """Mixed into a sync connection class: marks the call as sent just before its command's
    bytes go to the socket. The handshake after a connect (HELLO, AUTH, SELECT, CLIENT
    SETINFO) and health-check PINGs are not the call's command."""

    _kvstore_internal = 0

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        _touched()
        self._kvstore_internal += 1
        try:
            return super().connect_check_health(*args, **kwargs)
        finally:
            self._kvstore_internal -= 1

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._kvstore_internal:
            # Connect and check health first, as super() would: what they send is not the call.
            self._kvstore_internal += 1
            try:
                if not self._sock:
                    self.connect_check_health(check_health=False)
                if check_health:
                    self.check_health()
            finally:
                self._kvstore_internal -= 1
            _sent(self)
            check_health = False
        return super().send_packed_command(command, check_health)


class _AsyncTracksSends:
    """The asyncio twin of :class:`_TracksSends`."""

    _kvstore_internal = 0

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        _touched()
        self._kvstore_internal += 1
        try:
            return await super().connect_check_health(*args, **kwargs)
        finally:
            self._kvstore_internal -= 1

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._kvstore_internal:
            self._kvstore_internal += 1
            try:
                if not self.is_connected:
                    await self.connect_check_health(check_health=False)
                if check_health:
                    await self.check_health()
            finally:
                self._kvstore_internal -= 1
            _sent(self)
            check_health = False
        return await super().send_packed_command(command, check_health)


def _track_sends(client: Any) -> bool:
    """Makes the connections a standalone client's pool opens from now on record what each call
    sent. A RedisCluster (its nodes' pools come and go) and fakeredis are not tracked."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or _is_cluster(client) or _is_fakeredis(client):
        return False
    mixin = _AsyncTracksSends if isinstance(client, redis.asyncio.Redis) else _TracksSends
    if not issubclass(pool.connection_class, mixin):
        base = pool.connection_class
        pool.connection_class = type(base.__name__, (mixin, base), {"__module__": base.__module__})
    return True


def _pool_had_none_free(exc: Exception) -> bool:
    """The pool refused to hand out a connection: raised before anything is sent."""
    return isinstance(exc, MaxConnectionsError) or str(exc) == "No connection available."


# ------------------------------------------------------------------- calling a script


def _call(target: Any, script: Script, request: Eval, functions: bool) -> Any:
    """Sends (on a client) or queues (on a pipeline) the call of `script`: FCALL of its function,
    FCALL_RO for a script that declares no-writes (so a replica may serve it), or EVALSHA."""
    keys, args = request.keys, request.args
    if not functions:
        return target.evalsha(script.sha, len(keys), *keys, *args)
    if script.writes:
        return target.fcall(script.function, len(keys), *keys, *args)
    return target.fcall_ro(script.function, len(keys), *keys, *args)


def _queue_reload(pipe: Any, script: Script, request: Eval, functions: bool) -> int:
    """Queues the call after the server lacked its script: FUNCTION LOAD of the library, then the
    call; or EVAL, which sends the source and caches it. Returns where the call's reply is."""
    if functions:
        pipe.function_load(LIBRARY.source)
        _call(pipe, script, request, functions)
        return 1
    pipe.eval(script.source, len(request.keys), *request.keys, *request.args)
    return 0


def _lacks_function(reply: Any) -> bool:
    """The server has no function of that name (FUNCTION FLUSH, a restart without persistence,
    a new kvstore version): nothing ran."""
    return isinstance(reply, ResponseError) and str(reply).startswith("Function not found")


def _knows_no_functions(reply: Any) -> bool:
    """The server, or a proxy in front of it, does not know FCALL or FUNCTION: nothing ran."""
    text = str(reply).lower()
    return isinstance(reply, ResponseError) and text.startswith(("unknown command", "unknown subcommand"))


class _Executor:
    """What both executors share: script variants, how scripts are called, and error mapping."""

    def __init__(self, client: Any, config: StoreConfig | None) -> None:
        self.client = client
        self.config = config if config is not None else StoreConfig()
        if _decodes_responses(client):
            raise errors.ConfigError("the client must return bytes: create it with decode_responses=False")
        self._scripts = {name: s for name, s in SCRIPTS.items()}
        if _is_fakeredis(client):
            # fakeredis's Lua does not parse the shebang line.
            self._scripts = {name: s.without_shebang() for name, s in SCRIPTS.items()}
        # FCALL needs the server's functions (Redis 7, Valkey 7.2); a RedisCluster client finds
        # an FCALL's slot with COMMAND GETKEYS round trips, an EVALSHA's from its arguments.
        self.functions = self.config.scripting == "functions" and not _is_cluster(client)
        self._durability_checked = False
        self._tracks_sends = _track_sends(client)
        if self.config.durability != "default" and _is_cluster(client):
            raise errors.ConfigError(
                "durability modes need a standalone client: WAIT and WAITAOF must follow the write"
                " on its own connection, which a cluster pipeline does not guarantee"
            )

    def script(self, request: Eval) -> Script:
        return self._scripts[request.script.name]

    def durable(self, script: Script) -> bool:
        return script.writes and self.config.durability != "default"

    def missed(self, reply: Any) -> bool:
        """Whether a call did not run because the server lacks its script or function, or knows
        no functions at all: this store then uses the EVAL path from now on."""
        if isinstance(reply, NoScriptError) or _lacks_function(reply):
            return True
        if self.functions and _knows_no_functions(reply):
            self.functions = False
            return True
        return False

    def load_failed(self, script: Script, loaded: Any) -> errors.KVStoreError | None:
        """What a FUNCTION LOAD reply means for a call that still found no function (nothing
        ran): None where the call may be sent again (loaded, loaded by another client, or a
        server without functions, which the EVAL path serves)."""
        if isinstance(loaded, NoPermissionError):
            return errors.PermissionDenied(
                f"{script.name}: the server lacks kvstore's function library {LIBRARY.name} and this"
                f" user may not load it ({loaded}): run `kvstore preload-scripts` as a user allowed"
                " to, or allow function|load"
            )
        if not isinstance(loaded, ResponseError) or "already exists" in str(loaded) or self.missed(loaded):
            return None
        return self.script_error(script, loaded, _Call())

    def still_missing(self, script: Script) -> errors.KVStoreError:
        return errors.ServerError(
            f"{script.name}: kvstore's functions were gone again each of the {LOAD_ATTEMPTS} times"
            " they were loaded (FUNCTION FLUSH in a loop?); nothing ran"
        )

    def wait_command(self) -> tuple[Any, ...]:
        """What a durable write sends right after its script, on the same connection."""
        timeout = self.config.durability_timeout_ms
        if self.config.durability == "fsync":
            return ("WAITAOF", 1, 0, timeout)
        return ("WAIT", self.config.durability_replicas, timeout)

    def durability_probe_failed(self, exc: Exception) -> errors.KVStoreError:
        mode = self.config.durability
        return errors.ConfigError(
            f"durability={mode!r} is not available on this server ({exc}); 'fsync' needs"
            " WAITAOF (Redis or Valkey 7.2 or newer) and appendonly yes"
        )

    def check_durable(self, script: Script, waited: Any) -> None:
        if isinstance(waited, Exception):
            raise errors.NotDurable(f"{script.name}: the write happened; waiting for it failed: {waited}")
        if self.config.durability == "fsync":
            if int(waited[0]) < 1:
                raise errors.NotDurable(
                    f"{script.name}: the write happened but the AOF fsync was not confirmed within"
                    f" {self.config.durability_timeout_ms} ms"
                )
        elif int(waited) < self.config.durability_replicas:
            raise errors.NotDurable(
                f"{script.name}: the write happened but reached {int(waited)} of"
                f" {self.config.durability_replicas} replicas within {self.config.durability_timeout_ms} ms"
            )

    def nothing_sent(self, call: _Call, exc: Exception) -> bool:
        """Whether a call that failed to connect certainly sent nothing (else it may have run).

        Only a tracked client knows: a standalone client takes its connection from the pool once
        per command, before any attempt, so a full pool means nothing was sent; a RedisCluster
        may have sent an earlier attempt to another node."""
        if not self._tracks_sends or call.sent_on:
            return False
        return call.touched or _pool_had_none_free(exc)

    def batch_error(self, exc: Exception, call: _Call) -> errors.KVStoreError:
        """A native read that failed: nothing was written, so the error is plain."""
        if isinstance(exc, NoPermissionError):
            return errors.PermissionDenied(str(exc))
        if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
            if self.nothing_sent(call, exc):
                return _not_connected("the read", exc)
            return errors.ServerError(f"the read could not reach the server: {exc}")
        return errors.ServerError(f"the read failed: {exc}")

    def script_error(self, script: Script, exc: Exception, call: _Call) -> errors.KVStoreError:
        if isinstance(exc, OutOfMemoryError):
            return errors.ServerError(f"{script.name}: the server is out of memory (maxmemory); nothing was written: {exc}")
        if isinstance(exc, NoPermissionError):
            return errors.PermissionDenied(f"{script.name}: {exc}")
        if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
            if self.nothing_sent(call, exc):
                return _not_connected(script.name, exc)
            if script.writes:
                return errors.OutcomeUnknown(
                    f"{script.name}: the connection failed after the call was sent ({exc}); it may"
                    " or may not have run. Re-send the same call (same message ids or otids):"
                    " nothing is stored twice."
                )
            return errors.ServerError(f"{script.name}: {exc}")
        return error_from_reply(script, str(exc))


def _not_connected(what: str, exc: Exception) -> errors.ConnectionFailed:
    return errors.ConnectionFailed(
        f"{what}: no connection to the server could be used ({exc}); the call was not sent and"
        " nothing was written"
    )


def _decodes_responses(client: Any) -> bool:
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if not kwargs and hasattr(client, "get_connection_kwargs"):
        kwargs = client.get_connection_kwargs()
    return bool(kwargs.get("decode_responses"))


def _refused(exc: Exception) -> errors.KVStoreError:
    return errors.ServerError(
        f"the cluster refused the call for {CLUSTER_REFUSAL_SECONDS:.0f} s (its slot is moving or"
        f" unserved); nothing was written: {exc}"
    )


def _is_cluster(client: Any) -> bool:
    return "cluster" in type(client).__module__


def _is_fakeredis(client: Any) -> bool:
    return type(client).__module__.startswith("fakeredis")


class MessageStore(_Executor):
    """A store over a synchronous client (redis.Redis, RedisCluster or fakeredis)."""

    @classmethod
    def from_url(cls, url: str, config: StoreConfig | None = None, **client_kwargs: Any) -> MessageStore:
        return cls(redis.Redis.from_url(url, decode_responses=False, **client_kwargs), config)

    @classmethod
    def in_memory(cls, config: StoreConfig | None = None) -> MessageStore:
        """A store on an in-process fakeredis server with Lua, for users' own tests."""
        import fakeredis

        return cls(fakeredis.FakeRedis(), config)

    def thread(self, thread_id: str) -> Thread:
        return Thread(self, ThreadRef.of(self.config, thread_id))

    def health(self) -> HealthReport:
        """The server's settings that kvstore's guarantees depend on, with warnings."""
        return health(self.client)

    def stream(self, operation: Generator[Any, Any, Any]) -> Iterator[Any]:
        """Drives a core operation that also yields outputs (core.pages), handing them out."""
        operation = core.finishing_deletes(operation)
        reply: Any = None
        failure: errors.KVStoreError | None = None
        while True:
            try:
                item = operation.throw(failure) if failure is not None else operation.send(reply)
            except StopIteration:
                return
            reply, failure = None, None
            if isinstance(item, (Eval, Batch)):
                try:
                    reply = self._execute(item)
                except errors.KVStoreError as exc:
                    failure = exc
            else:
                yield item

    def run(self, operation: Operation) -> Any:
        """Drives a core operation; a typed error is thrown back into it (it may handle it)."""
        operation = core.finishing_deletes(operation)
        try:
            request = next(operation)
            while True:
                try:
                    result = self._execute(request)
                except errors.KVStoreError as exc:
                    request = operation.throw(exc)
                else:
                    request = operation.send(result)
        except StopIteration as done:
            return done.value

    def _execute(self, request: Eval | Batch) -> Any:
        deadline, delay = time.monotonic() + CLUSTER_REFUSAL_SECONDS, 0.02
        while True:
            try:
                return self._execute_once(request)
            except ClusterError as exc:  # every attempt was refused: nothing ran
                if time.monotonic() > deadline:
                    raise _refused(exc) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.25)

    def _execute_once(self, request: Eval | Batch) -> Any:
        call = _Call()
        token = _CALL.set(call)
        try:
            return self._send(request, call)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Interrupted (KeyboardInterrupt, a signal) between sending and reading: redis-py
                # puts the connection back in its pool with the reply unread, and the next call
                # on it would take that reply for its own. (The asyncio client closes a
                # connection cut off in a send or a read itself.)
                for connection in call.sent_on:
                    connection.disconnect()
            raise
        finally:
            _CALL.reset(token)

    def _send(self, request: Eval | Batch, call: _Call) -> Any:
        if isinstance(request, Batch):
            pipe = self.client.pipeline(transaction=False)
            for command in request.commands:
                pipe.execute_command(*command)
            try:
                return pipe.execute()
            except (ResponseError, RedisConnectionError, RedisTimeoutError) as exc:
                raise self.batch_error(exc, call) from exc
        script = self.script(request)
        try:
            if self.durable(script):
                return self._durable_call(script, request)
            functions = self.functions
            try:
                return _call(self.client, script, request, functions)
            except ResponseError as exc:
                if not self.missed(exc):
                    raise
            if functions:  # FUNCTION LOAD and the call again, in one round trip
                return self._reloaded_call(script, request, None)
            # EVAL sends the source and caches it again: no window for a second flush. (Sent
            # alone: a cluster client's pipeline does not take EVAL.)
            return self.client.eval(script.source, len(request.keys), *request.keys, *request.args)
        except (ResponseError, RedisConnectionError, RedisTimeoutError) as exc:
            raise self.script_error(script, exc, call) from exc

    def _durable_call(self, script: Script, request: Eval) -> Any:
        if not self._durability_checked and self.config.durability == "fsync":
            # Refuse before the first write where WAITAOF cannot work (no command, no AOF).
            try:
                self.client.execute_command("WAITAOF", 1, 0, 1)
            except ResponseError as exc:
                raise self.durability_probe_failed(exc) from exc
        self._durability_checked = True
        pipe = self.client.pipeline(transaction=False)
        _call(pipe, script, request, self.functions)
        pipe.execute_command(*self.wait_command())
        reply, waited = pipe.execute(raise_on_error=False)
        if self.missed(reply):
            return self._reloaded_call(script, request, self.wait_command())
        if isinstance(reply, Exception):
            raise reply
        self.check_durable(script, waited)
        return reply

    def _reloaded_call(self, script: Script, request: Eval, wait: tuple[Any, ...] | None) -> Any:
        """The call again, after the server lacked its script (nothing ran), on one pipeline with
        what loads the script first, and the durable write's WAIT after it."""
        for _ in range(LOAD_ATTEMPTS):
            pipe = self.client.pipeline(transaction=False)
            at = _queue_reload(pipe, script, request, self.functions)
            if wait:
                pipe.execute_command(*wait)
            replies = pipe.execute(raise_on_error=False)
            reply = replies[at]
            if self.missed(reply):
                failed = self.load_failed(script, replies[0]) if at else None
                if failed:
                    raise failed
                continue  # loaded, and flushed again before the call ran
            if isinstance(reply, Exception):
                raise reply
            if wait:
                self.check_durable(script, replies[-1])
            return reply
        raise self.still_missing(script)

    def close(self) -> None:
        self.client.close()


class Thread:
    """One conversation. Cheap to make; holds no state beyond its keys."""

    def __init__(self, store: MessageStore, ref: ThreadRef) -> None:
        self._store = store
        self._ref = ref

    @property
    def keys(self) -> core.ThreadKeys:
        return self._ref.keys

    def append(self, messages: Message | dict | Iterable[Message | dict], turn_id: str | None = None) -> AppendResult:
        """Stores the messages in one atomic call; returns the stored copies (id, date, seq_id).

        Idempotent: every message the call sends carries an id, the call's token. A message of
        yours without an id (a model or a dict; JSON text cannot carry it back) gets the one the
        store made set on it before the call is sent, so sending the same messages again, after
        any interruption (a timeout, cancellation, KeyboardInterrupt, OutcomeUnknown, a retried
        request), is a replay: it writes nothing and returns the messages as first stored, with
        ``replayed`` true. To store the same content again as a new message, send a new message
        (or a copy without its id). Otids work the same way across processes: a batch whose
        otids are all stored is a replay.
        """
        return self._store.run(core.append(self._ref, messages, turn_id))

    def start_turn(self, turn_id: str) -> int:
        return self._store.run(core.start_turn(self._ref, turn_id))

    def finish_turn(self, turn_id: str, outcome: TurnOutcome = "completed") -> TurnResult:
        return self._store.run(core.finish_turn(self._ref, turn_id, outcome))

    def list(
        self,
        after: Cursor = None,
        before: Cursor = None,
        limit: int = 50,
        order: Literal["asc", "desc"] = "asc",
        turn_id: str | None = None,
    ) -> MessagesPage:
        return self._store.run(core.list_page(self._ref, after, before, limit, order, turn_id))

    def iter(self, order: Literal["asc", "desc"] = "asc") -> Iterator[Message]:
        for page in self._store.stream(core.pages(self._ref, order)):
            yield from page.messages

    def get(self, message_id: str) -> Message:
        return self._store.run(core.get(self._ref, message_id))

    def get_by_otid(self, otid: str) -> Message:
        """The stored message with that otid; MessageNotFound if none is (or it was deleted)."""
        return self._store.run(core.get_by_otid(self._ref, otid))

    def snapshot(self) -> ThreadSnapshot:
        return self._store.run(core.snapshot(self._ref))

    def context(self) -> list[Message]:
        return self._store.run(core.context(self._ref))

    def compact(self, summary: str, last_sequence: int, stats: CompactionStats | dict | None = None) -> SummaryMessage:
        return self._store.run(core.compact(self._ref, summary, last_sequence, stats))

    def replace(self, message_id: str, message: Message | dict) -> Message:
        return self._store.run(core.replace(self._ref, message_id, message))

    def remove_turn(self, turn_id: str) -> int:
        return self._store.run(core.remove_turn(self._ref, turn_id))

    def migrate(self, max_calls: int | None = None) -> int:
        return self._store.run(core.migrate(self._ref, max_calls))

    def stats(self) -> ThreadStats:
        return self._store.run(core.stats(self._ref))

    def delete(self) -> None:
        self._store.run(core.delete(self._ref))


class AsyncMessageStore(_Executor):
    """A store over an asyncio client (redis.asyncio.Redis or RedisCluster)."""

    @classmethod
    def from_url(cls, url: str, config: StoreConfig | None = None, **client_kwargs: Any) -> AsyncMessageStore:
        return cls(redis.asyncio.Redis.from_url(url, decode_responses=False, **client_kwargs), config)

    @classmethod
    def in_memory(cls, config: StoreConfig | None = None) -> AsyncMessageStore:
        import fakeredis

        return cls(fakeredis.FakeAsyncRedis(), config)

    def thread(self, thread_id: str) -> AsyncThread:
        return AsyncThread(self, ThreadRef.of(self.config, thread_id))

    async def stream(self, operation: Generator[Any, Any, Any]) -> AsyncIterator[Any]:
        """Drives a core operation that also yields outputs (core.pages), handing them out."""
        operation = core.finishing_deletes(operation)
        reply: Any = None
        failure: errors.KVStoreError | None = None
        while True:
            try:
                item = operation.throw(failure) if failure is not None else operation.send(reply)
            except StopIteration:
                return
            reply, failure = None, None
            if isinstance(item, (Eval, Batch)):
                try:
                    reply = await self._execute(item)
                except errors.KVStoreError as exc:
                    failure = exc
            else:
                yield item

    async def run(self, operation: Operation) -> Any:
        """Drives a core operation; a typed error is thrown back into it (it may handle it)."""
        operation = core.finishing_deletes(operation)
        try:
            request = next(operation)
            while True:
                try:
                    result = await self._execute(request)
                except errors.KVStoreError as exc:
                    request = operation.throw(exc)
                else:
                    request = operation.send(result)
        except StopIteration as done:
            return done.value

    async def _execute(self, request: Eval | Batch) -> Any:
        deadline, delay = time.monotonic() + CLUSTER_REFUSAL_SECONDS, 0.02
        while True:
            try:
                return await self._execute_once(request)
            except ClusterError as exc:  # every attempt was refused: nothing ran
                if time.monotonic() > deadline:
                    raise _refused(exc) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)

    async def _execute_once(self, request: Eval | Batch) -> Any:
        call = _Call()
        token = _CALL.set(call)
        try:
            return await self._send(request, call)
        finally:
            _CALL.reset(token)

    async def _send(self, request: Eval | Batch, call: _Call) -> Any:
        if isinstance(request, Batch):
            pipe = self.client.pipeline(transaction=False)
            for command in request.commands:
                pipe.execute_command(*command)
            try:
                return await pipe.execute()
            except (ResponseError, RedisConnectionError, RedisTimeoutError) as exc:
                raise self.batch_error(exc, call) from exc
        script = self.script(request)
        try:
            if self.durable(script):
                return await self._durable_call(script, request)
            functions = self.functions
            try:
                return await _call(self.client, script, request, functions)
            except ResponseError as exc:
                if not self.missed(exc):
                    raise
            if functions:  # FUNCTION LOAD and the call again, in one round trip
                return await self._reloaded_call(script, request, None)
            # EVAL sends the source and caches it again: no window for a second flush. (Sent
            # alone: a cluster client's pipeline does not take EVAL.)
            return await self.client.eval(script.source, len(request.keys), *request.keys, *request.args)
        except (ResponseError, RedisConnectionError, RedisTimeoutError) as exc:
            raise self.script_error(script, exc, call) from exc

    async def _durable_call(self, script: Script, request: Eval) -> Any:
        if not self._durability_checked and self.config.durability == "fsync":
            # Refuse before the first write where WAITAOF cannot work (no command, no AOF).
            try:
                await self.client.execute_command("WAITAOF", 1, 0, 1)
            except ResponseError as exc:
                raise self.durability_probe_failed(exc) from exc
        self._durability_checked = True
        pipe = self.client.pipeline(transaction=False)
        _call(pipe, script, request, self.functions)
        pipe.execute_command(*self.wait_command())
        reply, waited = await pipe.execute(raise_on_error=False)
        if self.missed(reply):
            return await self._reloaded_call(script, request, self.wait_command())
        if isinstance(reply, Exception):
            raise reply
        self.check_durable(script, waited)
        return reply

    async def _reloaded_call(self, script: Script, request: Eval, wait: tuple[Any, ...] | None) -> Any:
        """The call again, after the server lacked its script (nothing ran), on one pipeline with
        what loads the script first, and the durable write's WAIT after it."""
        for _ in range(LOAD_ATTEMPTS):
            pipe = self.client.pipeline(transaction=False)
            at = _queue_reload(pipe, script, request, self.functions)
            if wait:
                pipe.execute_command(*wait)
            replies = await pipe.execute(raise_on_error=False)
            reply = replies[at]
            if self.missed(reply):
                failed = self.load_failed(script, replies[0]) if at else None
                if failed:
                    raise failed
                continue  # loaded, and flushed again before the call ran
            if isinstance(reply, Exception):
                raise reply
            if wait:
                self.check_durable(script, replies[-1])
            return reply
        raise self.still_missing(script)

    async def close(self) -> None:
        await self.client.aclose()


class AsyncThread:
    """The asyncio twin of :class:`Thread`: same methods, awaited."""

    def __init__(self, store: AsyncMessageStore, ref: ThreadRef) -> None:
        self._store = store
        self._ref = ref

    @property
    def keys(self) -> core.ThreadKeys:
        return self._ref.keys

    async def append(
        self, messages: Message | dict | Iterable[Message | dict], turn_id: str | None = None
    ) -> AppendResult:
        """Stores the messages in one atomic call: see :meth:`Thread.append`.

        A call cut off by ``asyncio.wait_for``, ``asyncio.timeout`` or ``task.cancel()`` may
        still run on the server; the messages you passed already carry their ids, so sending
        them again stores them once::

            try:
                await asyncio.wait_for(thread.append(messages), 1)
            except TimeoutError:
                await thread.append(messages)  # a replay if the first call ran
        """
        return await self._store.run(core.append(self._ref, messages, turn_id))

    async def start_turn(self, turn_id: str) -> int:
        return await self._store.run(core.start_turn(self._ref, turn_id))

    async def finish_turn(self, turn_id: str, outcome: TurnOutcome = "completed") -> TurnResult:
        return await self._store.run(core.finish_turn(self._ref, turn_id, outcome))

    async def list(
        self,
        after: Cursor = None,
        before: Cursor = None,
        limit: int = 50,
        order: Literal["asc", "desc"] = "asc",
        turn_id: str | None = None,
    ) -> MessagesPage:
        return await self._store.run(core.list_page(self._ref, after, before, limit, order, turn_id))

    async def iter(self, order: Literal["asc", "desc"] = "asc") -> AsyncIterator[Message]:
        async for page in self._store.stream(core.pages(self._ref, order)):
            for message in page.messages:
                yield message

    async def get(self, message_id: str) -> Message:
        return await self._store.run(core.get(self._ref, message_id))

    async def get_by_otid(self, otid: str) -> Message:
        """The stored message with that otid; MessageNotFound if none is (or it was deleted)."""
        return await self._store.run(core.get_by_otid(self._ref, otid))

    async def snapshot(self) -> ThreadSnapshot:
        return await self._store.run(core.snapshot(self._ref))

    async def context(self) -> list[Message]:
        return await self._store.run(core.context(self._ref))

    async def compact(self, summary: str, last_sequence: int, stats: CompactionStats | dict | None = None) -> SummaryMessage:
        return await self._store.run(core.compact(self._ref, summary, last_sequence, stats))

    async def replace(self, message_id: str, message: Message | dict) -> Message:
        return await self._store.run(core.replace(self._ref, message_id, message))

    async def remove_turn(self, turn_id: str) -> int:
        return await self._store.run(core.remove_turn(self._ref, turn_id))

    async def migrate(self, max_calls: int | None = None) -> int:
        return await self._store.run(core.migrate(self._ref, max_calls))

    async def stats(self) -> ThreadStats:
        return await self._store.run(core.stats(self._ref))

    async def delete(self) -> None:
        await self._store.run(core.delete(self._ref))
