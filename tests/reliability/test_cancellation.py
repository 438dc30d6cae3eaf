"""Appends interrupted while their script is in flight, then re-sent as the caller holds them.

asyncio code bounds a call with `asyncio.wait_for`, `asyncio.timeout` or `task.cancel()`; sync
code meets KeyboardInterrupt or a signal. The call raises, its script may still run, and the
caller has nothing but its own message objects: re-sending them must store every message once.

asyncio's cut-offs come from the clock: the server is paused (`CLIENT PAUSE WRITE`, `DEBUG
SLEEP`) at random so that many calls are cut off after their command was sent and before the
reply came back. A sync call is interrupted at chosen points of its script call instead (before,
during and after the write, before the read): an exception raised by a timer's signal handler at a
random moment inside redis-py and hiredis can crash the interpreter (docs/RELIABILITY.md,
"Signals"), and a test must not.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter

import pytest
import redis

from kvstore import AsyncMessageStore, MessageStore, StoreConfig, UserMessage

from ..support.layout_check import check_layout
from .support import dedicated_server, fresh_namespace

# A signal landing inside pydantic's serializer is swallowed there with this warning (the call
# then simply completes).
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")

CALLS = 600
WORKERS = 16
# Sync appends, each interrupted at one of POINTS in turn.
SYNC_CALLS = 200


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


def _check_stored_once(sent: list[list], stored: list) -> list[str]:
    copies = Counter(_text(m) for m in stored)
    expected = [_content(m) for batch in sent for m in batch]
    failures = [f"{c!r} is stored {copies[c]} times" for c in expected if copies[c] != 1]
    failures += [f"{c!r} was never sent" for c in set(copies) - set(expected)]
    return failures


def test_a_cancelled_append_re_sent_as_the_caller_holds_it_stores_once(kind):
    """asyncio's own ways to cut a call off (no signal): re-sending the same objects stores once."""
    with dedicated_server(kind, "--enable-debug-command", "yes") as server:
        config = StoreConfig(namespace=fresh_namespace(), window_size=8, chunk_size=4)
        rng = random.Random(7)
        sent: list[list] = []
        outcomes: Counter = Counter()

        async def worker(thread, w: int) -> None:
            for i in range(w, CALLS, WORKERS):
                batch, how = _batch(i, rng), ("wait_for", "timeout", "cancel")[i % 3]
                first = resent = None
                try:
                    first = await _bounded(thread, batch, how, _delay(rng))
                except (TimeoutError, asyncio.CancelledError):
                    outcomes[f"cut off by {how}"] += 1
                    resent = await thread.append(batch)  # the same objects, no timeout
                sent.append(batch)
                outcomes[_outcome(first, resent)] += 1

        async def run() -> list:
            store = AsyncMessageStore.from_url(server.url, config)
            thread = store.thread("cancelled")
            await thread.append(UserMessage(content="warm up"))  # loads the script
            sent.append([{"content": "warm up"}])
            with Pauser(server.port) as pauser:
                # Concurrent requests, as in a server: one pause holds several calls at once.
                await asyncio.gather(*(worker(thread, w) for w in range(WORKERS)))
            outcomes.update({f"pauses: {k}": v for k, v in pauser.pauses.items()})
            stored = [m async for m in thread.iter()]
            await store.close()
            return stored

        stored = asyncio.run(run())
        failures = _check_stored_once(sent, stored)
        check_layout(
            redis.Redis(port=server.port),
            MessageStore.from_url(server.url, config).thread("cancelled").keys,
            config,
        )
        print(
            f"\ncancellation [{kind}, async]: {CALLS} appends of 1-3 messages without otids, cut off"
            f" at random 0-6 ms (most within 0.4 ms) under 5-40 ms pauses every 1-10 ms: {dict(outcomes)};"
            f" {len(stored)} messages stored, {len(failures)} not exactly once"
        )
        assert not failures, "\n".join(failures[:20])
        # The run reached the case it is about: calls cut off after their script had run.
        assert sum(v for k, v in outcomes.items() if k.startswith("cut off")) >= CALLS // 6, (
            outcomes
        )
        assert outcomes["re-sent: a replay"] > 0, outcomes


def _outcome(first, resent) -> str:
    if first is not None:
        return "completed"
    return "re-sent: a replay" if getattr(resent, "replayed", False) else "re-sent: stored now"


# Where a sync call is interrupted (a KeyboardInterrupt, a signal's handler raising) in the life
# of its script call on its connection, and whether the script has then run on the server.
POINTS = {
    "before its command is written": False,
    "halfway through writing its command": False,
    "after its command is written": True,
    "as its reply is about to be read": True,
}
SCRIPT_COMMANDS = (b"\r\nFCALL\r\n", b"\r\nEVALSHA\r\n", b"\r\nEVAL\r\n")


class Interrupter:
    """The point at which the next script call is interrupted (None: not armed)."""

    def __init__(self) -> None:
        self.point: str | None = None
        self.reading: redis.Connection | None = None

    def take(self, data: bytes) -> str | None:
        """The armed point if `data` is a script call; disarms."""
        if self.point is None or not any(command in data for command in SCRIPT_COMMANDS):
            return None
        point, self.point = self.point, None
        return point


def _interrupted_client(port: int, interrupter: Interrupter) -> redis.Redis:
    """A client whose connections raise Interrupted where `interrupter` says, as a handler of a
    signal landing there would, at a point chosen rather than at a moment on the clock."""

    class Connection(redis.Connection):
        def send_packed_command(self, packed, check_health=True):
            data = packed if isinstance(packed, bytes) else b"".join(packed)
            point = interrupter.take(data)
            if point == "before its command is written":
                raise Interrupted()
            if point == "halfway through writing its command":
                self._sock.sendall(data[: len(data) // 2])
                self.disconnect()  # what redis-py does when its send is cut off
                raise Interrupted()
            super().send_packed_command(packed, check_health)
            if point == "after its command is written":
                raise Interrupted()
            if point is not None:
                interrupter.reading = self

        def read_response(self, *args, **kwargs):
            if interrupter.reading is self:
                interrupter.reading = None
                raise Interrupted()
            return super().read_response(*args, **kwargs)

    return redis.Redis(connection_pool=redis.ConnectionPool(port=port, connection_class=Connection))


def test_an_interrupted_append_re_sent_as_the_caller_holds_it_stores_once(plain_server):
    """A sync append interrupted at each point of its script call (in turn, SYNC_CALLS times),
    then re-sent with the same objects: a replay exactly when the script had run, stored once.

    The interruption is raised where it is chosen, not by a timer: a signal's handler raising
    at a random moment inside redis-py and hiredis can crash the interpreter (docs/RELIABILITY.md,
    "Signals")."""
    config = StoreConfig(namespace=fresh_namespace(), window_size=8, chunk_size=4)
    interrupter = Interrupter()
    store = MessageStore(_interrupted_client(plain_server.port, interrupter), config)
    thread = store.thread("interrupted")
    thread.append(UserMessage(content="warm up"))  # loads the script
    rng = random.Random(7)
    sent: list[list] = [[{"content": "warm up"}]]
    outcomes: Counter = Counter()
    for i in range(SYNC_CALLS):
        batch, point = _batch(i, rng), list(POINTS)[i % len(POINTS)]
        interrupter.point = point
        with pytest.raises(Interrupted):
            thread.append(batch)
        assert interrupter.point is None and interrupter.reading is None, point  # it was reached
        resent = thread.append(batch)  # the same objects
        sent.append(batch)
        outcomes[point, resent.replayed] += 1
    stored = list(thread.iter())
    failures = _check_stored_once(sent, stored)
    check_layout(redis.Redis(port=plain_server.port), thread.keys, config)
    store.close()
    print(
        f"\ninterrupted sync appends [{plain_server.name}]: {SYNC_CALLS} appends of 1-3 messages"
        f" without otids, each interrupted once then re-sent: {dict(outcomes)};"
        f" {len(stored)} messages stored, {len(failures)} not exactly once"
    )
    assert not failures, "\n".join(failures[:20])
    each = SYNC_CALLS // len(POINTS)
    assert outcomes == Counter({(point, ran): each for point, ran in POINTS.items()})


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
