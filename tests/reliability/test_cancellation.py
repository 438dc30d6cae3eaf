"""Appends interrupted while their script is in flight, then re-sent as the caller holds them.

asyncio code bounds a call with `asyncio.wait_for`, `asyncio.timeout` or `task.cancel()`; sync
code meets KeyboardInterrupt or a signal. The call raises, its script may still run, and the
caller has nothing but its own message objects: re-sending them must store every message once.
The server is paused (`CLIENT PAUSE WRITE`, `DEBUG SLEEP`) at random so that many calls are
cut off after their command was sent and before the reply came back.
"""

from __future__ import annotations

import asyncio
import gc
import random
import signal
import threading
import time
from collections import Counter

import pytest
import redis
from redis.connection import HiredisRespSerializer

from kvstore import AsyncMessageStore, MessageStore, StoreConfig, UserMessage

from ..support.layout_check import check_layout
from .support import dedicated_server, fresh_namespace

# A signal landing inside pydantic's serializer is swallowed there with this warning (the call
# then simply completes).
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")

CALLS = 600
WORKERS = 16


def _delay(rng: random.Random) -> float:
    """Mostly within one call's own time (about 200 µs), so calls are cut off before, while
    and after their command is sent; sometimes long enough to outlast a pause."""
    return rng.uniform(0, 0.0004) if rng.random() < 0.8 else rng.uniform(0, 0.006)


class Interrupted(BaseException):
    """What a signal handler raises in the middle of a sync call, like KeyboardInterrupt."""


def _text(message) -> str:
    return message.content if isinstance(message.content, str) else message.content[0].text


def _batch(i: int, rng: random.Random) -> list:
    """1-3 messages without otids, some as dicts: the case where the ids are the only token."""
    batch = []
    for j in range(rng.choice((1, 1, 2, 3))):
        content = f"call {i} message {j}"
        batch.append(
            {"message_type": "user_message", "content": content}
            if j == 1
            else UserMessage(content=content)
        )
    return batch


def _content(message) -> str:
    return message["content"] if isinstance(message, dict) else message.content


class Pauser:
    """Pauses the server for 5-40 ms every 1-10 ms, so calls are held in flight."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.pauses: Counter = Counter()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        rng = random.Random(11)
        control = redis.Redis(port=self.port)
        while not self.stop.is_set():
            time.sleep(rng.uniform(0.001, 0.01))
            if rng.random() < 0.6:
                control.execute_command("CLIENT", "PAUSE", rng.randint(5, 40), "WRITE")
                self.pauses["CLIENT PAUSE WRITE"] += 1
            else:
                control.execute_command("DEBUG", "SLEEP", round(rng.uniform(0.005, 0.04), 3))
                self.pauses["DEBUG SLEEP"] += 1

    def __enter__(self) -> Pauser:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        redis.Redis(port=self.port).execute_command("CLIENT", "UNPAUSE")


async def _bounded(thread, batch, how: str, delay: float):
    """One append bounded the way asyncio code bounds calls; raises when it was cut off."""
    if how == "wait_for":
        return await asyncio.wait_for(thread.append(batch), delay)
    if how == "timeout":
        async with asyncio.timeout(delay):
            return await thread.append(batch)
    # task.cancel() after a few turns of the event loop: the call is cut off at each of its
    # awaits in turn (taking a connection, sending, waiting for the reply), whatever the clock.
    task = asyncio.create_task(thread.append(batch))
    for _ in range(int(delay * 20_000)):
        await asyncio.sleep(0)
    task.cancel()
    return await task


def _interrupted_sync(thread, batch, delay: float):
    """One append that a signal interrupts after `delay` seconds, wherever the call then is."""
    signal.setitimer(signal.ITIMER_REAL, delay)
    try:
        return thread.append(batch)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _inside_hiredis_pack(frame) -> bool:
    """Whether the interrupted code runs inside hiredis's packer, at any depth of the stack."""
    while frame is not None:
        if frame.f_code is HiredisRespSerializer.pack.__code__:
            return True
        frame = frame.f_back
    return False


def _inside_gc_callback(frame) -> bool:
    """Whether the interrupted code is a garbage collector's callback (one a library installed):
    Python reports an exception raised there as unraisable and drops it, so the interruption
    would reach neither the call nor the test."""
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks:
            return True
        frame = frame.f_back
    return False


def _check_stored_once(sent: list[list], stored: list) -> list[str]:
    copies = Counter(_text(m) for m in stored)
    expected = [_content(m) for batch in sent for m in batch]
    failures = [f"{c!r} is stored {copies[c]} times" for c in expected if copies[c] != 1]
    failures += [f"{c!r} was never sent" for c in set(copies) - set(expected)]
    return failures


def test_an_interrupted_append_re_sent_as_the_caller_holds_it_stores_once(kind, mode):
    with dedicated_server(kind, "--enable-debug-command", "yes") as server:
        config = StoreConfig(namespace=fresh_namespace(), window_size=8, chunk_size=4)
        rng = random.Random(7)
        sent: list[list] = []
        outcomes: Counter = Counter()

        def record(batch, first, resent) -> None:
            sent.append(batch)
            if first is not None:
                outcomes["completed"] += 1
            else:
                outcomes[
                    "re-sent: a replay"
                    if getattr(resent, "replayed", False)
                    else "re-sent: stored now"
                ] += 1

        if mode == "async":

            async def run() -> list:
                store = AsyncMessageStore.from_url(server.url, config)
                thread = store.thread("cancelled")
                await thread.append(UserMessage(content="warm up"))  # loads the script
                sent.append([{"content": "warm up"}])

                async def worker(w: int) -> None:
                    for i in range(w, CALLS, WORKERS):
                        batch, how = _batch(i, rng), ("wait_for", "timeout", "cancel")[i % 3]
                        first = resent = None
                        try:
                            first = await _bounded(thread, batch, how, _delay(rng))
                        except (TimeoutError, asyncio.CancelledError):
                            outcomes[f"cut off by {how}"] += 1
                            resent = await thread.append(batch)  # the same objects, no timeout
                        record(batch, first, resent)

                with Pauser(server.port) as pauser:
                    # Concurrent requests, as in a server: one pause holds several calls at once.
                    await asyncio.gather(*(worker(w) for w in range(WORKERS)))
                outcomes.update({f"pauses: {k}": v for k, v in pauser.pauses.items()})
                stored = [m async for m in thread.iter()]
                await store.close()
                return stored

            stored = asyncio.run(run())
        else:

            def interrupt(signum, frame):
                if _inside_hiredis_pack(frame) or _inside_gc_callback(frame):
                    # hiredis's packer crashes the interpreter when an exception is raised inside
                    # it, or inside anything it calls back (a hiredis bug); a gc callback would
                    # swallow it: let this signal land a moment later.
                    signal.setitimer(signal.ITIMER_REAL, 0.00005)
                    return
                raise Interrupted()

            previous = signal.signal(signal.SIGALRM, interrupt)
            try:
                store = MessageStore.from_url(server.url, config)
                thread = store.thread("cancelled")
                thread.append(UserMessage(content="warm up"))
                sent.append([{"content": "warm up"}])
                with Pauser(server.port) as pauser:
                    for i in range(CALLS):
                        batch = _batch(i, rng)
                        first = resent = None
                        try:
                            first = _interrupted_sync(thread, batch, max(_delay(rng), 0.00001))
                        except Interrupted:
                            outcomes["cut off by a signal"] += 1
                            resent = thread.append(batch)
                        record(batch, first, resent)
                outcomes.update({f"pauses: {k}": v for k, v in pauser.pauses.items()})
            finally:
                signal.signal(signal.SIGALRM, previous)
            stored = list(thread.iter())

        failures = _check_stored_once(sent, stored)
        check_layout(
            redis.Redis(port=server.port),
            MessageStore.from_url(server.url, config).thread("cancelled").keys,
            config,
        )
        print(
            f"\ncancellation [{kind}, {mode}]: {CALLS} appends of 1-3 messages without otids, cut off"
            f" at random 0-6 ms (most within 0.4 ms) under 5-40 ms pauses every 1-10 ms: {dict(outcomes)};"
            f" {len(stored)} messages stored, {len(failures)} not exactly once"
        )
        assert not failures, "\n".join(failures[:20])
        # The run reached the case it is about: calls cut off after their script had run.
        assert sum(v for k, v in outcomes.items() if k.startswith("cut off")) >= CALLS // 6, (
            outcomes
        )
        assert outcomes["re-sent: a replay"] > 0, outcomes


def _interrupting_client(port: int, command: bytes) -> tuple[redis.Redis, list[bool]]:
    """A client whose connections, once armed, raise Interrupted as they are about to send
    `command` (the re-send after the server lacked the script), like a signal landing there."""
    marker = b"\r\n" + command + b"\r\n"
    armed = [False]

    class Connection(redis.Connection):
        def send_packed_command(self, packed, check_health=True):
            data = packed if isinstance(packed, (bytes, str)) else b"".join(packed)
            if armed[0] and marker in data:
                raise Interrupted()
            return super().send_packed_command(packed, check_health)

    return redis.Redis(
        connection_pool=redis.ConnectionPool(port=port, connection_class=Connection)
    ), armed


@pytest.mark.parametrize(("scripting", "command"), [("eval", b"EVAL"), ("functions", b"FUNCTION")])
def test_an_interrupt_while_the_script_is_sent_again_reaches_the_caller(
    plain_server, scripting, command
):
    """The server lacked the script (SCRIPT FLUSH, FUNCTION FLUSH), so the call is sent again
    with what loads it; an interrupt right then reaches the caller as itself, and the connection
    that met the miss is closed, not handed to the next call."""
    admin = redis.Redis(port=plain_server.port)
    config = StoreConfig(namespace=fresh_namespace(), scripting=scripting)
    client, armed = _interrupting_client(plain_server.port, command)
    store = MessageStore(client, config)
    thread = store.thread("interrupted")
    thread.append(UserMessage(content="first"))
    admin.script_flush()
    admin.function_flush()
    armed[0] = True
    with pytest.raises(Interrupted):
        thread.append(UserMessage(content="second"))
    pool = store.client.connection_pool
    assert all(not connection.is_connected for connection in pool._available_connections)
    print(
        f"\ninterrupted re-send [{plain_server.name}, {scripting}]: Interrupted reached the caller,"
        f" {len(pool._available_connections)} pooled connection(s), none left open"
    )
