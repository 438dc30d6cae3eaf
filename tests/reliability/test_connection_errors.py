"""Which error a call gets when the server cannot be used: only a call that may have reached it
is OutcomeUnknown.

A connection that never opened (refused, no free connection in the pool) sent nothing, so every
operation raises `errors.ConnectionFailed` and nothing is written. A call whose command reached
the server before the connection died may have run: a write is OutcomeUnknown, even when
redis-py's retry then meets a refused connection (the last error is a refusal, yet the first
attempt was sent).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import Counter

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstore import StoreConfig, UserMessage, errors
from kvstore._engine.scripts import SCRIPTS

from ..support.servers import free_port
from .support import dedicated_server, fresh_namespace, thread_in_mode

RETRIES = 3  # redis-py's retry on, without its backoff sleeps


def _client(mode: str, **kwargs):
    if mode == "sync":
        return redis.Redis(retry=Retry(NoBackoff(), RETRIES), **kwargs)
    return redis.asyncio.Redis(retry=AsyncRetry(NoBackoff(), RETRIES), **kwargs)


def _writes(thread) -> dict:
    return {
        "append": lambda: thread.append(UserMessage(content="one")),
        "append batch": lambda: thread.append(
            [UserMessage(content="a", otid="o-a"), {"message_type": "user_message", "content": "b"}]
        ),
        "start_turn": lambda: thread.start_turn("turn-1"),
        "finish_turn": lambda: thread.finish_turn("turn-1"),
        "compact": lambda: thread.compact("so far", 1),
        "replace": lambda: thread.replace("message-1", UserMessage(content="new")),
        "remove_turn": lambda: thread.remove_turn("turn-1"),
        "migrate": lambda: thread.migrate(),
        "delete": lambda: thread.delete(),
    }


def _reads(thread) -> dict:
    return {
        "list": lambda: thread.list(limit=5),
        "get": lambda: thread.get("message-1"),
        "get_by_otid": lambda: thread.get_by_otid("o-a"),
        "stats": thread.stats,
        "context": thread.context,
        "snapshot": thread.snapshot,
    }


def _outcomes(calls: dict) -> dict[str, str]:
    seen = {}
    for name, call in calls.items():
        try:
            call()
            seen[name] = "succeeded"
        except Exception as exc:
            seen[name] = f"{type(exc).__name__}: {exc}"
    return seen


def _unexpected(seen: dict[str, str], expected: type) -> list[str]:
    return [
        f"{name}: {outcome}"
        for name, outcome in seen.items()
        if not outcome.startswith(expected.__name__ + ":")
    ]


def test_a_refused_connection_is_connection_failed_for_every_operation(mode):
    port = free_port()  # nothing listens there
    config = StoreConfig(namespace=fresh_namespace())
    failures = []
    for durability in ("default", "fsync"):
        client = _client(mode, host="127.0.0.1", port=port, socket_connect_timeout=0.5)
        with thread_in_mode(
            mode, "", StoreConfig(namespace=config.namespace, durability=durability), "down", client
        ) as thread:
            seen = _outcomes({**_writes(thread), **_reads(thread)})
        failures += [
            f"durability={durability}: {f}" for f in _unexpected(seen, errors.ConnectionFailed)
        ]
    print(
        f"\nrefused connection [{mode}]: {2 * len(seen)} calls, {len(failures)} not ConnectionFailed;"
        f" e.g. {seen['append']}"
    )
    assert not failures, "\n".join(failures)
    assert issubclass(errors.ConnectionFailed, errors.ServerError)


@pytest.mark.parametrize("pool_kind", ["BlockingConnectionPool", "ConnectionPool"])
def test_a_full_connection_pool_is_connection_failed(plain_server, mode, pool_kind):
    module = redis if mode == "sync" else redis.asyncio
    options = {"timeout": 0.1} if pool_kind == "BlockingConnectionPool" else {}
    pool = getattr(module, pool_kind)(
        host="127.0.0.1", port=plain_server.port, max_connections=1, **options
    )
    client = module.Redis(connection_pool=pool)
    config = StoreConfig(namespace=fresh_namespace())
    with thread_in_mode(mode, plain_server.url, config, "full", client) as thread:
        thread.append(UserMessage(content="warm up", otid="o-a"))
        run = (lambda c: c) if mode == "sync" else thread._loop.run_until_complete
        held = run(pool.get_connection())  # the pool's only connection, taken
        try:
            seen = _outcomes({**_writes(thread), **_reads(thread)})
        finally:
            run(pool.release(held)) if mode == "async" else pool.release(held)
        after = [m.content for m in thread.iter()]
        # The client closes a pool it made, not one it was given.
        run(pool.disconnect()) if mode == "async" else pool.disconnect()
    failures = _unexpected(seen, errors.ConnectionFailed)
    print(
        f"\nfull pool [{mode}, {pool_kind}]: {len(seen)} calls, {len(failures)} not ConnectionFailed;"
        f" e.g. {seen['append']}"
    )
    assert not failures, "\n".join(failures)
    assert after == ["warm up"], "a call that raised ConnectionFailed wrote something"


def test_a_server_killed_after_receiving_the_call_is_outcome_unknown(kind, mode):
    """The command is in the server (held by DEBUG SLEEP) when the server is killed: redis-py's
    retry then finds the port refusing connections, yet the first attempt was sent."""
    seen = Counter()
    for name in ("append", "compact", "start_turn"):
        with dedicated_server(kind, "--enable-debug-command", "yes") as server:
            config = StoreConfig(namespace=fresh_namespace())
            client = _client(mode, host="127.0.0.1", port=server.port, socket_connect_timeout=0.5)
            with thread_in_mode(mode, server.url, config, "killed", client) as thread:
                thread.append(
                    UserMessage(content="warm up")
                )  # loads the script, opens the connection
                admin = redis.Redis(port=server.port, retry=Retry(NoBackoff(), 0))
                sleep = functools.partial(admin.execute_command, "DEBUG", "SLEEP", 2)
                sleeper = threading.Thread(target=_ignore, args=(sleep,))
                sleeper.start()
                time.sleep(0.05)
                killer = threading.Timer(0.3, server.kill)
                killer.start()
                with pytest.raises(errors.OutcomeUnknown) as unknown:
                    _writes(thread)[name]()
                killer.join()
                sleeper.join()
                seen[type(unknown.value).__name__] += 1
                if name == "append":
                    assert unknown.value.messages and unknown.value.messages[0].id
    print(f"\nkilled with the call inside [{kind}, {mode}]: {dict(seen)}")


def _ignore(call) -> None:
    with contextlib.suppress(redis.ConnectionError):
        call()


def _dies_after_a_replay(mode: str, server, watched: str):
    """A client whose first reply to the `watched` script is lost: it sends the call again, as
    redis-py's retry does, gets the "already stored" reply, and the server dies right then."""
    function = SCRIPTS[watched].function

    def lose_the_reply(reply) -> bool:
        return seen.pop() if seen else False  # once per arm()

    seen: list[bool] = []
    if mode == "sync":

        class Client(redis.Redis):
            def execute_command(self, *args, **options):
                reply = super().execute_command(*args, **options)
                if args[:2] == ("FCALL", function) and lose_the_reply(reply):
                    reply = super().execute_command(*args, **options)
                    server.kill()
                return reply
    else:

        class Client(redis.asyncio.Redis):
            async def execute_command(self, *args, **options):
                reply = await super().execute_command(*args, **options)
                if args[:2] == ("FCALL", function) and lose_the_reply(reply):
                    reply = await super().execute_command(*args, **options)
                    server.kill()
                return reply

    client = Client(
        host="127.0.0.1",
        port=server.port,
        socket_connect_timeout=0.5,
        retry=(Retry if mode == "sync" else AsyncRetry)(NoBackoff(), RETRIES),
    )
    return client, lambda: seen.append(True)


@pytest.mark.parametrize("operation", ["append", "compact"])
def test_a_failed_read_after_a_replayed_write_is_outcome_unknown_with_the_messages(
    kind, mode, operation
):
    """The issue's chain: a write's reply is lost, the re-send is answered "already stored", and
    the read of the stored messages that follows fails. The write happened: the caller gets
    OutcomeUnknown with the messages as sent (never a bare ServerError), and re-sending them
    after the server is back stores nothing twice."""
    with dedicated_server(kind, "--appendonly", "yes", "--appendfsync", "always") as server:
        config = StoreConfig(namespace=fresh_namespace())
        client, arm = _dies_after_a_replay(mode, server, operation)
        with thread_in_mode(mode, server.url, config, "replayed", client) as thread:
            thread.append(UserMessage(content="warm up"))
            arm()
            message = UserMessage(content="stored once")
            with pytest.raises(errors.OutcomeUnknown) as unknown:
                if operation == "append":
                    thread.append(message)
                else:
                    thread.compact("the summary", 1)
        sent = unknown.value.messages
        server.start()
        with thread_in_mode(mode, server.url, config, "replayed") as patient:
            if operation == "append":
                assert [m.id for m in sent] == [message.id]
                again = patient.append(sent)
                assert again.replayed and [m.id for m in again] == [message.id]
                stored = [m.content for m in patient.iter()]
                assert stored == ["warm up", "stored once"], stored
            else:
                assert sent[0].message_type == "summary_message" and sent[0].id
                context = patient.context()
                assert context[0].id == sent[0].id, context
                assert [m.message_type for m in patient.iter()].count("summary_message") == 1
    print(
        f"\nread after a replayed {operation} failed [{kind}, {mode}]: {type(unknown.value).__name__}"
        f" with {len(sent)} message(s) as sent; stored once after the re-send"
    )
