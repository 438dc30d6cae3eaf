"""Edges of a watch (docs/EVENTS.md): a watcher closed by its own caller from another thread or
task while it waits ends cleanly ("Shutting down"), and a watcher catching up by paging delivers
a compaction's summary once, with no repeat at the seam between its pages and the stream
("Cursors"); sync and async, on every backend."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kvstore import StoreConfig, UserMessage
from kvstore.events import Compacted, MessageReplaced, MessagesAdded, ThreadEvent

from ..conftest import make_async_store, make_sync_store

BLOCK_MS = 20_000  # far longer than the bound: only close() can end the read
BOUND_S = 1.0


def _blocked_clients(raw_client) -> int:
    return int(raw_client.info("clients")["blocked_clients"])


def _wait_blocked(backend: str, raw_client, before: int) -> None:
    """Until one more client than `before` waits in a blocking read (a real server); fakeredis
    counts none: a short pause instead (the close ends the watch wherever it is then)."""
    if backend == "fakeredis":
        time.sleep(0.05)
        return
    deadline = time.monotonic() + 5
    while _blocked_clients(raw_client) <= before:
        assert time.monotonic() < deadline, "the watcher never blocked"
        time.sleep(0.005)


def test_a_sync_watcher_closed_from_another_thread_while_it_waits_ends_cleanly(
    server_only, backend, namespace, raw_client
):
    # Real servers only: fakeredis's socket cannot be shut down from another thread while a
    # read waits on it (its parser raises "generator already executing"), as for store.close()
    # (tests/integration/test_watch_close.py).
    config = StoreConfig(namespace=namespace)
    store, writer = make_sync_store(backend, config), make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append(UserMessage(content="hi"))
    watch = thread.watch(after="0-0", block_ms=BLOCK_MS)
    delivered: list[ThreadEvent] = []
    failures: list[BaseException] = []
    first = threading.Event()
    before = _blocked_clients(raw_client) if backend != "fakeredis" else 0

    def iterate() -> None:
        try:
            for event in watch:
                delivered.append(event)
                first.set()
        except BaseException as exc:  # recorded: the test fails on it
            failures.append(exc)

    reader = threading.Thread(target=iterate, daemon=True)
    reader.start()
    try:
        assert first.wait(5), "the watcher got no event"
        _wait_blocked(backend, raw_client, before)
        started = time.monotonic()
        watch.close()  # from this thread, while the reader waits in its read
        writer.thread("t").append(UserMessage(content="after close"))
        reader.join(BOUND_S)
        took = time.monotonic() - started
        assert not reader.is_alive(), "the watcher still runs after close()"
    finally:
        watch.close()
        reader.join(BLOCK_MS / 1000 + 5)
        store.close()
        writer.close()
    print(f"\nsync watcher [{backend}] ended {took:.3f} s after close()")
    assert failures == []
    assert [type(e).__name__ for e in delivered] == ["MessagesAdded"]


def test_an_async_watcher_closed_from_another_task_while_it_waits_ends_cleanly(
    backend, namespace, raw_client
):
    async def scenario() -> tuple[float, list[ThreadEvent]]:
        config = StoreConfig(namespace=namespace)
        store, writer = make_async_store(backend, config), make_async_store(backend, config)
        thread = store.thread("t")
        await thread.append(UserMessage(content="hi"))
        watch = thread.watch(after="0-0", block_ms=BLOCK_MS)
        delivered: list[ThreadEvent] = []
        first = asyncio.Event()
        before = _blocked_clients(raw_client) if backend != "fakeredis" else 0

        async def iterate() -> None:
            async for event in watch:
                delivered.append(event)
                first.set()

        task = asyncio.create_task(iterate())
        try:
            await asyncio.wait_for(first.wait(), 5)
            await asyncio.to_thread(_wait_blocked, backend, raw_client, before)
            started = time.monotonic()
            await watch.aclose()  # from this task, while the other awaits its read
            await writer.thread("t").append(UserMessage(content="after close"))
            await asyncio.wait_for(task, BOUND_S)  # ends, and raises nothing
            return time.monotonic() - started, delivered
        finally:
            task.cancel()
            await watch.aclose()
            await store.close()
            await writer.close()

    took, delivered = asyncio.run(scenario())
    print(f"\nasync watcher [{backend}] ended {took:.3f} s after aclose()")
    assert [type(e).__name__ for e in delivered] == ["MessagesAdded"]


# ----------------------------------------------------------------------------- the seam


def _catch_up(
    backend: str, mode: str, namespace: str, between: Callable[[Any], None], marker: str
) -> list[ThreadEvent]:
    """Stores 300 messages, watches after=0 (the watcher pages them, 200 a page), calls
    between(thread) (a sync thread: another worker) once the first page is delivered, appends
    `marker` once the last page is (so that it comes on the stream, after the events of what
    the pages held), and returns the events up to the one that delivers it."""
    config = StoreConfig(namespace=namespace, retained_message_limit=None)
    other = make_sync_store(backend, config)
    worker = other.thread("t")
    for i in range(3):
        worker.append([UserMessage(content=f"m{i}-{j}") for j in range(100)])

    def done(event: ThreadEvent) -> bool:
        return isinstance(event, MessagesAdded) and any(
            getattr(m, "content", None) == marker for m in event.messages
        )

    events: list[ThreadEvent] = []
    try:
        if mode == "sync":
            store = make_sync_store(backend, config)
            try:
                with store.thread("t").watch(after=0, block_ms=200) as watch:
                    for event in watch:
                        events.append(event)
                        if len(events) == 1:
                            between(worker)
                        elif len(events) == 2:  # the last page: the marker comes on the stream
                            worker.append(UserMessage(content=marker))
                        if done(event) or len(events) > 20:
                            break
            finally:
                store.close()
        else:

            async def run() -> None:
                store = make_async_store(backend, config)
                try:
                    async with store.thread("t").watch(after=0, block_ms=200) as watch:
                        async for event in watch:
                            events.append(event)
                            if len(events) == 1:
                                between(worker)
                            elif len(events) == 2:
                                worker.append(UserMessage(content=marker))
                            if done(event) or len(events) > 20:
                                break
                finally:
                    await store.close()

            asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        other.close()
    assert done(events[-1]), events
    return events


def _delivered(events: list[ThreadEvent]) -> list[int]:
    """The sequences of the stored messages the events hand out, in order (a Compacted hands
    out its summary)."""
    sequences: list[int] = []
    for event in events:
        if isinstance(event, MessagesAdded):
            sequences += [m.seq_id for m in event.messages]
        elif isinstance(event, Compacted):
            sequences.append(event.summary_sequence)
    return sequences


def test_a_summary_paged_while_catching_up_is_not_delivered_again(backend, mode, namespace):
    stored: dict[str, int] = {}

    def compact(thread) -> None:
        stored["summary"] = thread.compact("summary of 1..250", 250).seq_id

    events = _catch_up(backend, mode, namespace, compact, "after")
    sequences = _delivered(events)
    summary = stored["summary"]
    assert summary == 301
    assert len(sequences) == len(set(sequences)), "a sequence was delivered twice"
    assert sequences == sorted(sequences) == list(range(1, 303))
    (paged,) = [e for e in events if isinstance(e, MessagesAdded) and summary in _delivered([e])]
    assert paged.paged
    assert [m.message_type for m in paged.messages if m.seq_id == summary] == ["summary_message"]
    assert not [e for e in events if isinstance(e, Compacted)]


def test_a_replacement_of_a_message_paged_before_it_is_delivered(backend, mode, namespace):
    """Decision (docs/EVENTS.md, "Cursors"): a MessageReplaced after the seam is delivered even
    when its message was paged: the page may have read it before the replacement."""

    def replace(thread) -> None:
        (first,) = thread.list(limit=1, order="asc").messages
        thread.replace(first.id, UserMessage(content="replaced"))

    events = _catch_up(backend, mode, namespace, replace, "after")
    replaced = [e for e in events if isinstance(e, MessageReplaced)]
    assert [(e.sequence, getattr(e.message, "content", None)) for e in replaced] == [
        (1, "replaced")
    ]
    sequences = _delivered(events)
    assert sequences == list(range(1, 302))


@pytest.mark.parametrize("messages", [True, False])
def test_a_compaction_after_the_seam_is_still_delivered(backend, mode, namespace, messages):
    """The skip is only for a summary a page delivered: one stored after the pages comes as its
    Compacted event."""
    config = StoreConfig(namespace=namespace, retained_message_limit=None)
    store = make_sync_store(backend, config)
    try:
        thread = store.thread("t")
        thread.append([UserMessage(content=f"m{j}") for j in range(10)])
        with thread.watch(after=0, block_ms=200, messages=messages) as watch:
            events = [next(watch)]
            summary = thread.compact("summary of 1..5", 5)
            events.append(next(watch))
    finally:
        store.close()
    assert isinstance(events[0], MessagesAdded) and events[0].paged
    assert isinstance(events[1], Compacted)
    assert events[1].summary_sequence == summary.seq_id == 11
