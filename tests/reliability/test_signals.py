"""A signal's handler that raises in the middle of a sync call cannot crash the process.

hiredis's packer turns an int argument into text with a call (PyObject_Repr) that runs pending
signal handlers, and uses its result unchecked: a handler that raises there made the repr NULL
and the process die with a segmentation fault. kvstore hands redis-py no int (each is its
decimal bytes, made in Python), so the handler's exception surfaces in Python code and reaches
the caller (docs/RELIABILITY.md, "Signals").
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter

import hiredis
import redis
import redis.asyncio

from kvstore import AssistantMessage, AsyncMessageStore, MessageStore, StoreConfig, UserMessage

from .support import dedicated_server, fresh_namespace


def test_hiredis_dereferences_the_repr_a_raising_handler_cut_off():
    """The fault kvstore steers around, shown in a child (it dies of it): while hiredis packs an
    int, a signal's handler that raises kills the process with SIGSEGV."""
    code = (
        "import signal, hiredis\n"
        "class Interrupted(BaseException): pass\n"
        "def handler(signum, frame): raise Interrupted()\n"
        "signal.signal(signal.SIGALRM, handler)\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.0001)\n"
        "for _ in range(1_000_000):\n"
        "    try:\n"
        "        hiredis.pack_command((b'SET', b'k', 1))\n"
        "    except Interrupted:\n"
        "        pass\n"
    )
    # The handler also fires outside the try (an uncaught Interrupted ends the child with status
    # 1, not the fault): a few children, the fault shown by any of them.
    exits = []
    for _ in range(5):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
        exits.append(done.returncode)
        if done.returncode == -11:
            break
    print(
        f"\nhiredis {hiredis.__version__}: pack_command((b'SET', b'k', 1)) under a raising handler: exits {exits}"
    )
    assert exits[-1] == -11, done.stderr.decode(errors="replace")[-2000:]


HANDSHAKE = {"HELLO", "AUTH", "SELECT", "CLIENT"}


def _recording(base: type, packed: list) -> type:
    """`base` (a redis-py connection class) recording the arguments of every command it sends,
    alone or in a pipeline."""

    def send_command(self, *args, **kwargs):
        packed.append(args)
        return base.send_command(self, *args, **kwargs)

    def pack_commands(self, commands):
        commands = list(commands)
        packed.extend(commands)
        return base.pack_commands(self, commands)

    return type(
        base.__name__, (base,), {"send_command": send_command, "pack_commands": pack_commands}
    )


def _exercise(thread, summary_at: int) -> None:
    """A thread's calls: appends, turns, reads of every kind, compaction, fork, delete."""
    thread.append([UserMessage(content=f"message {i}") for i in range(12)])
    thread.start_turn("turn-1")
    thread.append(AssistantMessage(content="reply"), turn_id="turn-1")
    thread.finish_turn("turn-1")
    page = thread.list(limit=5)
    thread.list(after=page.next_cursor, limit=5, order="asc")
    thread.get(page.messages[0].id)
    thread.snapshot()
    thread.stats()
    thread.context(max_tokens=50)
    thread.compact("a summary", summary_at)
    thread.fork("forked", at=summary_at)
    thread.delete()


def test_kvstore_hands_the_packer_no_int(kind, mode):
    """Every argument of every command a store's calls send is bytes or str:
    an int would be turned into text inside hiredis (above)."""
    packed: list = []
    config = StoreConfig(namespace=fresh_namespace())
    with dedicated_server(kind) as server:
        if mode == "sync":
            pool = redis.ConnectionPool.from_url(
                server.url, connection_class=_recording(redis.Connection, packed)
            )
            store = MessageStore(redis.Redis(connection_pool=pool), config)
            try:
                _exercise(store.thread("calls"), 6)
            finally:
                store.close()
                pool.disconnect()
        else:

            async def run() -> None:
                pool = redis.asyncio.ConnectionPool.from_url(
                    server.url, connection_class=_recording(redis.asyncio.Connection, packed)
                )
                store = AsyncMessageStore(redis.asyncio.Redis(connection_pool=pool), config)
                try:
                    await _exercise_async(store.thread("calls"), 6)
                finally:
                    # A client built on a pool it was handed leaves that pool open when it
                    # closes: unclosed, its sockets are collected, warning, in a later test.
                    await store.close()
                    await pool.aclose()

            asyncio.run(run())
    commands = Counter(args[0] for args in packed)
    # redis-py's own handshake (HELLO 3) is not a command of kvstore's.
    ints = [
        args
        for args in packed
        if args[0] not in HANDSHAKE and any(type(arg) is int for arg in args)
    ]
    print(f"\npacked [{kind}, {mode}]: {dict(commands)}; {len(ints)} with an int")
    assert {"FCALL", b"FCALL"} & set(commands), commands  # the scripts' own calls were packed
    assert ints == []


async def _exercise_async(thread, summary_at: int) -> None:
    await thread.append([UserMessage(content=f"message {i}") for i in range(12)])
    await thread.start_turn("turn-1")
    await thread.append(AssistantMessage(content="reply"), turn_id="turn-1")
    await thread.finish_turn("turn-1")
    page = await thread.list(limit=5)
    await thread.list(after=page.next_cursor, limit=5, order="asc")
    await thread.get(page.messages[0].id)
    await thread.snapshot()
    await thread.stats()
    await thread.context(max_tokens=50)
    await thread.compact("a summary", summary_at)
    await thread.fork("forked", at=summary_at)
    await thread.delete()
