"""Multi-step operations stopped after each of their steps, then run again, end as if never
stopped (issue #25, item 3): a fork, an import, a delete, a migration (1 -> 3 and 2 -> 3), a
remove_turn and a compaction's retention backlog.

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
from ..support.facade import SyncFacade

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
        return (
            self.loop.run_until_complete(result)
            if self.loop is not None and asyncio.iscoroutine(result)
            else result
        )

    @contextlib.contextmanager
    def stopped_at(self, k, how: str = "raise"):
        """Counts the requests sent (the list's length); stops before request k (0-based; or
        before the first request for which k(request, sent) is true):
        `raise` raises Stop there, `cancel` raises CancelledError there, as a task cancelled at
        that request's await gets it. (Cancelling the task itself from the hook is no
        deterministic stop: on Python 3.11 a cancellation that meets the reply already read is
        lost inside redis-py's read, and the call completes.)"""
        sent: list = []

        def sink(request) -> None:
            if k == len(sent) or (callable(k) and k(request, sent)):
                raise (asyncio.CancelledError if how == "cancel" else Stop)(
                    f"stopped before request {k}"
                )
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
        name = key.decode()[len(prefix) :]
        kind = raw_client.type(key).decode()
        if kind == "hash":
            value = raw_client.hgetall(key)
            if name == ":meta":
                value.pop(b"born", None)  # the incarnation: the server's time the thread was made
        elif kind == "zset":
            value = raw_client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = raw_client.xlen(key)  # its ids are the time of writing
        else:
            value = raw_client.dump(key)
        state[name] = (kind, value, raw_client.pttl(key) > 0)
    return state


def view(thread, turns=()) -> dict:
    """What a reader sees: messages, stats (restore_unfinished among them), the snapshot's turn
    and the messages of each of `turns`."""
    stats = thread.stats()
    snapshot = thread.snapshot()
    return {
        "messages": [m.to_dict() for m in thread.iter()],
        "stats": stats.model_dump(),
        "snapshot_turn": snapshot.turn,
        "turns": {
            t: [m.seq_id for m in thread.list(turn_id=t, limit=1000).messages] for t in turns
        },
    }


def whole(raw_client, thread, turns=()) -> tuple:
    return view(thread, turns), raw_state(raw_client, thread)


def turned_thread(thread, turns: int, replies: int = 1, open_last: bool = True) -> None:
    """`turns` turns, each a question and `replies` answers, with fixed ids and dates (two
    threads built alike hold the same bytes); each finished but the last when `open_last`."""
    for n in range(turns):
        turn = f"turn-{n}"
        thread.append(
            UserMessage(id=f"message-q{n}", date=DATE, content=f"question {n}"), turn_id=turn
        )
        thread.start_turn(turn)
        thread.append(
            [
                AssistantMessage(id=f"message-a{n}.{i}", date=DATE, content=f"answer {n}.{i}")
                for i in range(replies)
            ],
            turn_id=turn,
        )
        if n < turns - 1 or not open_last:
            thread.finish_turn(turn, "completed")


# ------------------------------------------------------------------ fork


def test_a_fork_stopped_between_its_state_calls_is_not_finished(side, raw_client, server_only):
    """More turns than one restore_state call takes: the fork is marked finished only by the
    last call, so a fork stopped after the first is finished by running it again, and until
    then its turns refuse writes."""
    store = side(window_size=64, chunk_size=32)
    source = store.thread("source")
    turns = backup_module.RESTORE_TURNS + 10
    for n in range(turns):  # a question and a recorded result per turn
        source.append(
            UserMessage(id=f"message-q{n}", date=DATE, content=f"question {n}"), turn_id=f"turn-{n}"
        )
        source.start_turn(f"turn-{n}")
        source.finish_turn(f"turn-{n}", "completed")
    source.append(UserMessage(id="message-open", date=DATE, content="open"), turn_id="turn-open")
    at = turns + 1
    last = max(f"turn-{n}" for n in range(turns))  # the turns go to restore_state in name order
    reference = source.fork("reference", at=at)
    expected = whole(raw_client, reference, ["turn-0", last])

    def second_state_call(request, sent) -> bool:
        return (
            getattr(request, "script", None) is not None
            and request.script.name == "restore_state"
            and any(
                getattr(before, "script", None) and before.script.name == "restore_state"
                for before in sent
            )
        )

    with store.stopped_at(second_state_call), pytest.raises(Stop):
        source.fork("forked", at=at)
    half = store.thread("forked")
    assert half.stats().restore_unfinished and half.stats().forked_from is None
    with pytest.raises(errors.RestoreIncomplete):
        half.append(AssistantMessage(content="into a turn of the half-written fork"), turn_id=last)
    with pytest.raises(errors.RestoreIncomplete):
        half.finish_turn(last, "failed")
    fork = source.fork("forked", at=at)
    assert fork.stats().fork_sequence == at
    assert whole(raw_client, fork, ["turn-0", last]) == expected


# ------------------------------------------------------------------ stopped after every step


def stop_at_every_step(store: Side, raw_client, build, operation, *, how: str = "raise", turns=()):
    """Runs `operation(thread id)` whole on a thread `build(thread id)` made (the reference),
    counting its requests; then for each k, on a new thread built alike, stops it before request
    k, runs it again whole, and compares the thread with the reference. Returns the number of
    requests of a whole run."""
    build("reference")
    with store.stopped_at(None) as sent:
        operation("reference")
    expected = whole(raw_client, store.thread("reference"), turns)
    stops = {"raise": Stop, "cancel": asyncio.CancelledError}[how]
    for k in range(len(sent)):
        target = f"stopped-{k}"
        build(target)
        with store.stopped_at(k, how), pytest.raises(stops):
            operation(target)
        operation(target)
        assert whole(raw_client, store.thread(target), turns) == expected, (
            f"stopped before request {k}"
        )
    return len(sent)


# How the operation is stopped, by mode: a sync call meets an exception ('raise'), an asyncio
# call an exception or a cancellation ('cancel'). (On the real servers only, server_only: the
# in-process tier runs each script many times slower, and a stop at every step runs them by the
# thousand.)
STOPS = pytest.mark.parametrize(
    ("mode", "how"), [("sync", "raise"), ("async", "raise"), ("async", "cancel")]
)


@pytest.fixture
def small_steps(monkeypatch):
    """Steps of a few messages, turns and chunks, so that a small thread takes many."""
    monkeypatch.setattr("kvstore._engine.fork.RESTORE_RUN", 4)
    monkeypatch.setattr(backup_module, "RESTORE_TURNS", 2)
    monkeypatch.setattr("kvstore._engine.operation.DELETE_STEP", 2)
    monkeypatch.setattr("kvstore._engine.lifecycle.REMOVE_TURN_STEP", 3)


SMALL = dict(window_size=4, chunk_size=2, max_chunks_per_call=1)


@STOPS
def test_a_fork_stopped_after_any_step_and_run_again_is_whole(
    side, raw_client, how, server_only, small_steps
):
    store = side(**SMALL)
    source = store.thread("source")
    turned_thread(source, 5, replies=2)
    source.compact("the first turns", 4)
    steps = stop_at_every_step(
        store,
        raw_client,
        lambda target: None,
        lambda target: source.fork(target, at=13),
        how=how,
        turns=("turn-0", "turn-4"),
    )
    assert steps > 10


@pytest.mark.parametrize(("mode", "how"), [("sync", "raise")])  # kvstore import is a sync command
def test_an_import_stopped_after_any_step_and_run_again_is_whole(
    side, raw_client, how, server_only, mode, small_steps
):
    store = side(**SMALL)
    source = store.thread("source")
    turned_thread(source, 5, replies=2)
    source.compact("the first turns", 4)
    out = io.StringIO()
    backup.export(store.store, "source", out, progress_out=io.StringIO())

    def restore(target: str) -> None:
        backup.import_lines(
            store.store, target, io.StringIO(out.getvalue()), progress_out=io.StringIO()
        )

    assert (
        stop_at_every_step(
            store, raw_client, lambda target: None, restore, turns=("turn-0", "turn-4")
        )
        > 5
    )


@STOPS
def test_a_delete_stopped_after_any_step_and_run_again_is_whole(
    side, raw_client, how, server_only, small_steps
):
    store = side(**SMALL)

    def build(target: str) -> None:
        turned_thread(store.thread(target), 4, replies=3)

    assert (
        stop_at_every_step(
            store, raw_client, build, lambda target: store.thread(target).delete(), how=how
        )
        > 3
    )
    assert whole(raw_client, store.thread("reference"))[1] == {}


@STOPS
def test_a_remove_turn_stopped_after_any_step_and_run_again_is_whole(
    side, raw_client, how, server_only, small_steps
):
    store = side(**SMALL)

    def build(target: str) -> None:
        turned_thread(store.thread(target), 3, replies=10)

    def remove(target: str) -> None:
        store.thread(target).remove_turn("turn-1")

    assert (
        stop_at_every_step(store, raw_client, build, remove, how=how, turns=("turn-1", "turn-2"))
        > 3
    )


@STOPS
def test_a_migration_stopped_after_any_step_and_run_again_is_whole(
    side, raw_client, how, server_only, namespace
):
    from ..integration.test_migration import write_layout_1

    store = side(**SMALL)

    def build(target: str) -> None:
        write_layout_1(raw_client, store.thread(target).keys, 40, turn=("turn-l", 30))

    def migrate(target: str) -> None:
        store.thread(target).migrate()

    assert stop_at_every_step(store, raw_client, build, migrate, how=how, turns=("turn-l",)) > 3


def layout_2_template(server, namespace: str, raw_client, store: Side) -> object:
    """A layout-2 thread ("template") the previous release wrote, with a window of 13 messages
    (turns, otids) for SMALL's steps to drain two at a time; returns build(target), which
    copies it byte for byte to a thread of that name."""
    from ..support.old_release import copy_thread, run_previous

    code = """
t = store.thread("template")
for i in range(1, 16):
    t.append(UserMessage(content="old " + str(i), id="message-old-" + str(i), date="{date}",
                         otid="otid-" + str(i) if i % 3 == 0 else None), turn_id="turn-" + str(i // 6))
result = len(list(t.iter()))
""".replace("{date}", DATE)
    config = {"namespace": namespace, "window_size": 12, "chunk_size": 2}
    assert run_previous(server.url, config, code) == 15
    template = store.thread("template").keys
    assert raw_client.zcard(template.window) >= 12

    def build(target: str) -> None:
        copy_thread(raw_client, template, store.thread(target).keys)

    return build


@STOPS
def test_a_2_to_3_migration_stopped_after_any_step_and_run_again_is_whole(
    side, raw_client, how, server, server_only, namespace
):
    store = side(**SMALL)
    build = layout_2_template(server, namespace, raw_client, store)

    def migrate(target: str) -> None:
        store.thread(target).migrate()

    turns = ("turn-0", "turn-1", "turn-2")
    assert stop_at_every_step(store, raw_client, build, migrate, how=how, turns=turns) >= 6


@STOPS
def test_a_compaction_with_a_retention_backlog_stopped_after_any_step_and_run_again_is_whole(
    side, raw_client, how, server_only, monkeypatch
):
    # The summary's id and date as in the reference: the two threads then hold the same bytes.
    # (A summary's id is made from its thread, range and text: the same for both threads here.)
    monkeypatch.setattr(
        "kvstore._engine.lifecycle.summary_id", lambda thread, summary, last: "message-summary"
    )
    monkeypatch.setattr("kvstore._engine.prepare.stored_date", lambda: DATE)
    store = side(**SMALL, retained_message_limit=4)

    def build(target: str) -> None:
        store.thread(target).append(
            [UserMessage(id=f"message-{i}", date=DATE, content=f"m{i}") for i in range(40)]
        )

    def compact(target: str) -> None:
        store.thread(target).compact("the first 36", 36)

    assert stop_at_every_step(store, raw_client, build, compact, how=how) > 3


# ------------------------------------------------------------------ killed after every step


def _killed_before(k: int, url: str, config: StoreConfig, operation) -> None:
    """In a child process: a store of its own runs `operation(store)`, and the process dies
    (os._exit, nothing cleaned up) as it is about to send request k."""
    from kvstore import MessageStore

    store = MessageStore.from_url(url, config)
    sent = [0]

    def sink(request) -> None:
        if sent[0] == k:
            os._exit(KILLED)
        sent[0] += 1

    record(store, sink)
    operation(store)
    os._exit(0)


KILLED = 9


@pytest.mark.parametrize("layout", [1, 2])
def test_a_migration_whose_process_is_killed_after_any_step_is_finished_by_another(
    backend, server, server_only, namespace, raw_client, layout
):
    from ..integration.test_migration import write_layout_1

    config = StoreConfig(namespace=namespace, **SMALL)
    store = Side(backend, "sync", config)
    try:
        if layout == 2:
            build = layout_2_template(server, namespace, raw_client, store)
            turns: tuple[str, ...] = ("turn-0", "turn-1", "turn-2")
        else:

            def build(target: str) -> None:
                write_layout_1(raw_client, store.thread(target).keys, 40, turn=("turn-l", 30))

            turns = ("turn-l",)
        build("reference")
        with store.stopped_at(None) as sent:
            store.thread("reference").migrate()
        expected = whole(raw_client, store.thread("reference"), turns)
        processes = multiprocessing.get_context("fork")
        for k in range(len(sent)):
            target = f"killed-{k}"
            build(target)
            child = processes.Process(
                target=_killed_before,
                args=(k, server.url, config, lambda on, t=target: on.thread(t).migrate()),
            )
            child.start()
            child.join(30)
            assert child.exitcode == KILLED, f"stopped before request {k} with {child.exitcode}"
            store.thread(target).migrate()
            assert whole(raw_client, store.thread(target), turns) == expected, (
                f"killed before request {k}"
            )
    finally:
        store.close()


@pytest.mark.parametrize("operation", ["fork", "import"])
def test_a_fork_or_import_whose_process_is_killed_after_any_step_is_finished_by_another(
    backend, server, server_only, namespace, raw_client, small_steps, operation
):
    config = StoreConfig(namespace=namespace, **SMALL)
    store = Side(backend, "sync", config)
    try:
        source = store.thread("source")
        turned_thread(source, 5, replies=2)
        source.compact("the first turns", 4)
        out = io.StringIO()
        backup.export(store.store, "source", out, progress_out=io.StringIO())

        def run(target: str):
            def go(on) -> None:
                if operation == "fork":
                    on.thread("source").fork(target, at=13)
                else:
                    backup.import_lines(
                        on, target, io.StringIO(out.getvalue()), progress_out=io.StringIO()
                    )

            return go

        with store.stopped_at(None) as sent:
            run("reference")(store.store)
        expected = whole(raw_client, store.thread("reference"), ("turn-0", "turn-4"))
        processes = multiprocessing.get_context("fork")
        for k in range(len(sent)):
            target = f"killed-{k}"
            child = processes.Process(
                target=_killed_before, args=(k, server.url, config, run(target))
            )
            child.start()
            child.join(30)
            assert child.exitcode == KILLED, (
                f"the process stopped before request {k} with {child.exitcode}"
            )
            run(target)(store.store)
            assert whole(raw_client, store.thread(target), ("turn-0", "turn-4")) == expected, (
                f"killed before request {k}"
            )
    finally:
        store.close()
