"""Multi-step operations stopped after each of their steps, then run again, end as if never
stopped (issue #25, item 3): a fork, an import, a delete, a migration, a remove_turn and a
compaction's retention backlog.

Each operation is first run whole into a reference thread while a hook (executor.record) counts
its requests; then, for every k, the same operation is stopped as it is about to send request k
(an exception raised there, an asyncio cancellation there, or the process killed there) and run
again. The thread must then hold what the reference holds: its messages, stats, turns, and every
raw key (named apart from the thread id) with its contents.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import multiprocessing
import os

import pytest

from kvstore import AssistantMessage, StoreConfig, UserMessage, errors
from kvstore._engine import backup as backup_module
from kvstore._engine.executor import record
from kvstore.cli import backup

from ..conftest import make_async_store, make_sync_store
from ..facade import SyncFacade

DATE = "2026-01-02T03:04:05Z"


class Stop(Exception):
    """An interruption at a chosen request (a caller's own error, a dropped task)."""


class Side:
    """One store in `mode` with threads whose methods look sync (an async store behind a
    SyncFacade), and the hook that stops it before its k-th request."""

    def __init__(self, backend: str, mode: str, config: StoreConfig) -> None:
        self.mode = mode
        self.loop = asyncio.new_event_loop() if mode == "async" else None
        self.store = (make_sync_store if mode == "sync" else make_async_store)(backend, config)

    def thread(self, thread_id: str):
        thread = self.store.thread(thread_id)
        return thread if self.loop is None else SyncFacade(thread, self.loop)

    def run(self, call):
        """`call` (a function of no arguments) run to its end: its awaitable awaited."""
        result = call()
        return self.loop.run_until_complete(result) if self.loop is not None and asyncio.iscoroutine(result) else result

    @contextlib.contextmanager
    def stopped_at(self, k: int | None, how: str = "raise"):
        """Counts the requests sent (the list's length); stops before request k (0-based):
        `raise` raises Stop there, `cancel` cancels the running task, so that its next await
        raises CancelledError."""
        sent: list = []

        def sink(request) -> None:
            if k is not None and len(sent) == k:
                if how == "cancel":
                    asyncio.current_task().cancel()
                else:
                    raise Stop(f"stopped before request {k}")
            sent.append(request)

        record(self.store, sink)
        try:
            yield sent
        finally:
            record(self.store, None)

    def close(self) -> None:
        if self.loop is None:
            self.store.close()
        else:
            self.loop.run_until_complete(self.store.close())
            self.loop.close()


@pytest.fixture
def side(backend, mode, namespace):
    sides: list[Side] = []

    def make(**config) -> Side:
        sides.append(Side(backend, mode, StoreConfig(namespace=namespace, **config)))
        return sides[-1]

    yield make
    for made in sides:
        made.close()


def raw_state(raw_client, thread) -> dict:
    """Every key of the thread, named apart from the thread id, with its contents."""
    prefix = thread.keys.meta.rsplit(":", 1)[0]
    state = {}
    for key in raw_client.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + ":*"):
        name = key.decode()[len(prefix):]
        kind = raw_client.type(key).decode()
        if kind == "hash":
            value = raw_client.hgetall(key)
        elif kind == "zset":
            value = raw_client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = raw_client.xlen(key)  # its ids are the time of writing
        else:
            value = raw_client.dump(key)
        state[name] = (kind, value, raw_client.pttl(key) > 0)
    return state


def view(thread, turns=()) -> dict:
    stats = thread.stats()
    snapshot = thread.snapshot()
    return {
        "messages": [m.to_dict() for m in thread.iter()],
        "stats": stats.model_dump() if hasattr(stats, "model_dump") else vars(stats),
        "snapshot_turn": snapshot.turn,
        "turns": {t: [m.seq_id for m in thread.list(turn_id=t, limit=1000).messages] for t in turns},
    }


def whole(raw_client, thread, turns=()) -> tuple:
    return view(thread, turns), raw_state(raw_client, thread)


def turned_thread(thread, turns: int, replies: int = 1, open_last: bool = True) -> None:
    """`turns` turns, each a question and `replies` answers, with fixed ids and dates (two
    threads built alike hold the same bytes); each finished but the last when `open_last`."""
    for n in range(turns):
        turn = f"turn-{n}"
        thread.append(UserMessage(id=f"message-q{n}", date=DATE, content=f"question {n}"), turn_id=turn)
        thread.start_turn(turn)
        thread.append([AssistantMessage(id=f"message-a{n}.{i}", date=DATE, content=f"answer {n}.{i}")
                       for i in range(replies)], turn_id=turn)
        if n < turns - 1 or not open_last:
            thread.finish_turn(turn, "completed")


# ------------------------------------------------------------------ fork


def test_a_fork_stopped_between_its_state_calls_is_not_finished(side, raw_client, server_only):
    """More turns than one restore_state call takes: the fork is marked finished only by the
    last call, so a fork stopped after the first is finished by running it again, and until
    then its turns refuse writes."""
    store = side(window_size=64, chunk_size=32)
    source = store.thread("source")
    turns = backup_module.RESTORE_TURNS + 20
    turned_thread(source, turns, open_last=False)
    at = 2 * turns  # a question and a reply per turn
    last = max(f"turn-{n}" for n in range(turns))  # the turns go to restore_state in name order
    reference = source.fork("reference", at=at)
    expected = whole(raw_client, reference, ["turn-0", last])

    with store.stopped_at(None) as sent:
        source.fork("counted", at=at)
    states = [i for i, request in enumerate(sent) if getattr(request, "script", None)
              and request.script.name == "restore_state"]
    assert len(states) == 2
    with store.stopped_at(states[1]), pytest.raises(Stop):
        source.fork("forked", at=at)
    half = store.thread("forked")
    with pytest.raises(errors.RestoreIncomplete):
        half.append(AssistantMessage(content="into a turn of the half-written fork"), turn_id=last)
    fork = source.fork("forked", at=at)
    assert fork.stats().fork_sequence == at
    assert whole(raw_client, fork, ["turn-0", last]) == expected
