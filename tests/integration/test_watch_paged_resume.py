"""Resuming after a paged event's cursor gets every later event once, in order, as after any
other event's cursor: the turn events and deltas written since, and the messages the paging had
not reached yet (docs/EVENTS.md, "Cursors")."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from kvstore import AssistantMessage, StoreConfig, UserMessage
from kvstore.events import Delta, MessagesAdded, TurnFinished, TurnStarted

from ..conftest import make_async_store, make_sync_store


def _events_until_finished(watch) -> list:
    got = []
    bound = threading.Timer(10, watch.close)  # a watcher that waits for nothing ends the test
    bound.start()
    for event in watch:
        got.append(event)
        if isinstance(event, TurnFinished):
            break
    bound.cancel()
    return got


def _a_turn(thread) -> None:
    thread.append(UserMessage(content="q", otid="q1"))
    lease = thread.hold_turn("turn-1")
    thread.publish(lease, "Hel")
    thread.append(AssistantMessage(content="Hello", otid="a1"), turn_id=lease)
    thread.finish_turn(lease)


def _kinds(events) -> list[str]:
    return [type(e).__name__ for e in events]


def _sequences(events) -> list[int]:
    return [m.seq_id for e in events if isinstance(e, MessagesAdded) for m in e.messages]


def test_a_sync_watch_resumed_after_a_paged_event_gets_every_later_event(
    server_only, backend, namespace
):
    store = make_sync_store(backend, StoreConfig(namespace=namespace))
    thread = store.thread("t")
    thread.append([UserMessage(content=f"m{i}") for i in range(450)])  # three pages to page
    with thread.watch(after=0, block_ms=100) as watch:
        first = next(watch)  # the client goes away after the first page
    assert first.paged and first.messages[-1].seq_id == 200
    _a_turn(thread)
    with thread.watch(after=first.cursor, block_ms=100) as watch:
        got = _events_until_finished(watch)
    assert _sequences(got) == list(range(201, 453))  # the rest of the pages, then the turn's
    turn = [k for k in _kinds(got) if k != "MessagesAdded"]
    assert turn == ["TurnStarted", "Delta", "TurnFinished"]
    # From each of those pages' cursors, the same: the messages after its last, and the turn.
    for page in [e for e in got if isinstance(e, MessagesAdded) and e.paged]:
        with thread.watch(after=page.cursor, block_ms=100) as watch:
            again = _events_until_finished(watch)
        assert _sequences(again) == list(range(page.last_sequence + 1, 453))
        assert [k for k in _kinds(again) if k != "MessagesAdded"] == turn
    store.close()


def test_an_async_watch_resumed_after_a_paged_event_gets_every_later_event(
    server_only, backend, namespace
):
    async def main():
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        thread = store.thread("t")
        await thread.append([UserMessage(content=f"m{i}") for i in range(3)])
        async with thread.watch(after=0, block_ms=100) as watch:
            first = await anext(watch)
        lease = await thread.hold_turn("turn-1")
        await thread.publish(lease, "Hel")
        await thread.finish_turn(lease)
        got = []

        async def resume():
            async with thread.watch(after=first.cursor, block_ms=100) as watch:
                async for event in watch:
                    got.append(event)
                    if isinstance(event, TurnFinished):
                        return

        task = asyncio.ensure_future(resume())
        await asyncio.wait([task], timeout=10)  # a watcher that waits for nothing ends the test
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()
        return first, got

    first, got = asyncio.run(main())
    assert first.paged and [m.seq_id for m in first.messages] == [1, 2, 3]
    assert [type(e) for e in got] == [TurnStarted, Delta, TurnFinished]
