"""Resuming a watch: the seam between paging stored messages and reading the stream, driven
step by step with a writer injected before every request, and a thread deleted and made again
under a watcher or its cursor (docs/EVENTS.md, "Cursors")."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from kvstore import StoreConfig, UserMessage, errors
from kvstore._engine.core import watch as core_watch
from kvstore._engine.event_stream import Emit, ReadStream, Run
from kvstore._engine.stream_replies import stream_entries
from kvstore._engine.watch_drivers import AsyncWatch
from kvstore.events import ThreadDeleted

from ..conftest import make_async_store, make_sync_store
from ..support.facade import SyncFacade


@pytest.fixture
def small_stream_nodes(server_only, raw_client):
    """Stream nodes of one entry, so that MAXLEN ~ trims to the limit at once (the server
    trims whole nodes; with its default of 100 entries a node, a trim takes 100 events)."""
    (before,) = raw_client.config_get("stream-node-max-entries").values()
    raw_client.config_set("stream-node-max-entries", 1)
    yield
    raw_client.config_set("stream-node-max-entries", before)


def _counted(operation, tick):
    """`operation` with `tick()` called before each of its requests is served."""
    try:
        request = next(operation)
    except StopIteration as stop:
        return stop.value
    while True:
        tick()
        try:
            reply = yield request
        except BaseException as exc:  # a typed error goes back into the operation
            try:
                request = operation.throw(exc)
            except StopIteration as stop:
                return stop.value
            continue
        try:
            request = operation.send(reply)
        except StopIteration as stop:
            return stop.value


def drive_watch(store, raw, thread, after, tick, until, max_steps=400):
    """Runs core.watch by hand: every request (the store's reads and the stream reads) is served
    after tick(); returns the events emitted once until(events) holds (until=None: once a stream
    read finds nothing, the watcher caught up)."""
    steps = core_watch(thread._ref, after, 20)
    events, reply = [], None
    for _ in range(max_steps):
        step = steps.send(reply)
        reply = None
        if isinstance(step, Emit):
            events.append(step.event)
            if until is not None and until(events):
                steps.close()
                return events
        elif isinstance(step, Run):
            reply = store.run(_counted(step.operation, tick))
        else:
            assert isinstance(step, ReadStream)
            tick()
            reply = stream_entries(
                raw.execute_command(
                    "XREAD",
                    "COUNT",
                    step.count,
                    "BLOCK",
                    step.block_ms,
                    "STREAMS",
                    step.key,
                    step.after,
                )
            )
            if until is None and not reply:
                steps.close()
                return events
    steps.close()
    pytest.fail(f"the watch did not get there in {max_steps} steps: {events}")


def _sequences(events) -> list[int]:
    return [m.seq_id for e in events for m in getattr(e, "messages", [])]


@pytest.mark.parametrize("cursor", ["sequence", "old event", "old event, deltas since"])
def test_the_seam_between_paging_and_the_stream_loses_nothing_whatever_is_written_when(
    small_stream_nodes, backend, namespace, raw_client, cursor
):
    """A message appended at any point of the catch-up, its event trimmed before the watcher
    reads the stream, is still delivered: once, in order."""
    store = make_sync_store(backend, StoreConfig(namespace=namespace, events_max_len=2))
    # "1-1": event 2 is trimmed already; "5-5": the events since (a turn's deltas) are trimmed
    # past it, and no message came after it.
    after = {"sequence": 5, "old event": "1-1", "old event, deltas since": "5-5"}[cursor]

    def five_messages(name):
        thread = store.thread(name)
        for i in range(1, 6):
            thread.append(UserMessage(content=f"m{i}"))
        if cursor == "old event, deltas since":
            thread.start_turn("turn-1")
            for i in range(3):
                thread.publish("turn-1", f"d{i}")
        assert raw_client.xlen(thread.keys.events) <= 3
        return thread

    # The requests the watcher makes until it blocks on the stream: a writer before each of them.
    requests = [0]
    drive_watch(
        store,
        raw_client,
        five_messages("dry"),
        after,
        lambda: requests.__setitem__(0, requests[0] + 1),
        None,
    )
    assert requests[0] >= 3
    for at in range(requests[0] + 1):
        thread = five_messages(f"seam-{at}")
        steps = [0]

        def tick(thread=thread, steps=steps, at=at):
            if steps[0] == at:
                # A message, then enough others that its event is trimmed before the next read.
                for i in range(6, 10):
                    thread.append(UserMessage(content=f"m{i}"))
                assert raw_client.xlen(thread.keys.events) <= 3
            steps[0] += 1

        events = drive_watch(
            store,
            raw_client,
            thread,
            after,
            tick,
            until=lambda events, steps=steps, at=at: (
                steps[0] > at and _sequences(events)[-1:] == [9]
            ),
        )
        expected = list(range(2, 10)) if cursor == "old event" else list(range(6, 10))
        assert _sequences(events) == expected, f"writer before request {at}"
    store.close()


# ----------------------------------------------------------------------------- a thread made again


def watcher(thread, after, block_ms=100):
    """(next event or None once the watch ended, close) for a sync thread or an async one behind
    the test facade."""
    if isinstance(thread, SyncFacade):
        watch, loop = thread._thread.watch(after=after, block_ms=block_ms), thread._loop
        assert isinstance(watch, AsyncWatch)

        def following():
            try:
                return loop.run_until_complete(watch.__anext__())
            except StopAsyncIteration:
                return None

        return following, lambda: loop.run_until_complete(watch.aclose())
    watch = thread.watch(after=after, block_ms=block_ms)
    return (lambda: next(watch, None)), watch.close


def contents(events) -> list[str]:
    return [m.content for e in events for m in getattr(e, "messages", [])]


def test_a_live_watcher_of_a_deleted_thread_does_not_go_on_into_a_new_one(make_thread):
    thread = make_thread("t")
    for i in range(3):
        thread.append(UserMessage(content=f"old-{i}"))
    following, close = watcher(thread, "0-0")
    assert contents([following() for _ in range(3)]) == ["old-0", "old-1", "old-2"]
    # Deleted while the watcher is not blocked on the stream (so it misses the 'deleted' event,
    # which goes with the stream) and written again: the new thread's events 1, 2, ... past 3.
    thread.delete()
    for i in range(6):
        thread.append(UserMessage(content=f"new-{i}"))
    gone = following()
    assert isinstance(gone, ThreadDeleted)
    assert following() is None  # the watch ended
    close()
    # Its cursor names the deleted thread: resumed from it, the watch says so again and ends.
    again, close = watcher(thread, gone.cursor)
    assert isinstance(again(), ThreadDeleted) and again() is None
    close()
    # The new thread, from its beginning.
    fresh, close = watcher(thread, 0)
    assert contents([fresh()]) == [f"new-{i}" for i in range(6)]
    close()


@pytest.mark.parametrize("kind", ["event", "paged"])
def test_resuming_with_a_cursor_of_a_deleted_thread_says_so(make_thread, kind):
    thread = make_thread("t")
    for i in range(3):
        thread.append(UserMessage(content=f"old-{i}"))
    following, close = watcher(thread, "0-0" if kind == "event" else 0)
    first = following()  # event 1 ("1-1@..."), or the three messages paged ("3@...")
    close()
    thread.delete()
    for i in range(6):
        thread.append(UserMessage(content=f"new-{i}"))
    resumed, close = watcher(thread, first.cursor)
    assert isinstance(resumed(), ThreadDeleted)
    assert resumed() is None
    close()


def test_a_thread_made_again_by_a_fork_or_an_expiry_is_a_new_thread(
    make_thread, backend, raw_client
):
    thread = make_thread("t")
    for i in range(3):
        thread.append(UserMessage(content=f"old-{i}"))
    source = make_thread("source")
    for i in range(8):
        source.append(UserMessage(content=f"forked-{i}"))
    following, close = watcher(thread, "0-0")
    cursor = following().cursor
    close()
    # A fork writes the new thread with restores (no event), then its writes count from 1.
    thread.delete()
    source.fork("t", at=8)
    for i in range(4):
        thread.append(UserMessage(content=f"new-{i}"))
    resumed, close = watcher(thread, cursor)
    assert isinstance(resumed(), ThreadDeleted)
    close()
    following, close = watcher(thread, "0-0")
    cursor = following().cursor
    close()
    # An expiry (thread_ttl) leaves no key of the thread: what a DEL of them all leaves.
    raw_client.delete(*raw_client.keys(thread.keys.meta.rsplit(":", 1)[0] + ":*"))
    for i in range(4):
        thread.append(UserMessage(content=f"after-{i}"))
    resumed, close = watcher(thread, cursor)
    assert isinstance(resumed(), ThreadDeleted)
    close()


def test_a_thread_made_again_while_the_watcher_pages_it(
    small_stream_nodes, backend, namespace, raw_client
):
    """Deleted and written again before each request of a catch-up: the watcher delivers the
    old thread's messages (a prefix, in order), then ThreadDeleted, never a new one's."""
    store = make_sync_store(backend, StoreConfig(namespace=namespace, events_max_len=2))

    def old_thread(name):
        thread = store.thread(name)
        for i in range(5):
            thread.append(UserMessage(content=f"old-{i}"))
        return thread

    requests = [0]
    drive_watch(
        store,
        raw_client,
        old_thread("dry"),
        0,
        lambda: requests.__setitem__(0, requests[0] + 1),
        None,
    )
    # (From request 1: the first reads which thread the watcher follows.)
    for at in range(1, requests[0] + 1):
        thread = old_thread(f"again-{at}")
        steps = [0]

        def tick(thread=thread, steps=steps, at=at):
            if steps[0] == at:
                thread.delete()
                for i in range(8):
                    thread.append(UserMessage(content=f"new-{i}"))
            steps[0] += 1

        events = drive_watch(
            store,
            raw_client,
            thread,
            0,
            tick,
            max_steps=80,
            until=lambda events: isinstance(events[-1], ThreadDeleted),
        )
        got = contents(events)
        assert got == [f"old-{i}" for i in range(len(got))], (
            f"thread made again before request {at}"
        )
    store.close()


# ----------------------------------------------------------------------------- cut at any await


@pytest.mark.parametrize("how", ["cancelled", "timed out"])
def test_a_watch_cut_at_any_await_resumes_from_its_last_cursor(
    small_stream_nodes, backend, namespace, how
):
    """An async watcher (its catch-up too) cut at each of its awaits, before the awaited call or
    after it answered, then resumed from the last cursor it gave: every message once, in order."""

    def cut(exc_at: int, when: str, thread):
        raised = (
            errors.ConnectionFailed("timed out") if how == "timed out" else asyncio.CancelledError()
        )
        count = [0]

        async def awaited(call):
            count[0] += 1
            if count[0] == 3:
                await four_more(thread, 8)
            if count[0] == exc_at and when == "before":
                raise raised
            result = await call()
            if count[0] == exc_at and when == "after":
                raise raised
            return result

        return awaited, count

    async def eight_messages(store, name):
        thread = store.thread(name)
        for i in range(8):
            await thread.append(UserMessage(content=f"m{i}"))
        return thread

    async def four_more(thread, first):
        """Four more messages (once): written while the first watcher pages, it reads their
        events on the stream."""
        if (await thread.stats()).next_sequence == first + 1:
            for i in range(first, first + 4):
                await thread.append(UserMessage(content=f"m{i}"))

    def cutting(watch, exc_at, when, thread):
        awaited, count = cut(exc_at, when, thread)
        store_run, read = watch._store.run, watch._read
        watch._store = SimpleNamespace(
            run=lambda op: awaited(lambda: store_run(op)), client=watch._store.client
        )
        watch._read = lambda *args: awaited(lambda: read(*args))
        return count

    async def main():
        store = make_async_store(backend, StoreConfig(namespace=namespace, events_max_len=2))
        try:
            return await cut_everywhere(store)
        finally:
            await store.close()

    async def cut_everywhere(store):
        # The awaits of a watcher that pages the eight messages and reads the next four on the
        # stream, up to its next stream read.
        thread = await eight_messages(store, "dry")
        watch = thread.watch(after=0, block_ms=20)
        count, seen = cutting(watch, 0, "never", thread), []
        while len(seen) < 12:
            seen.extend(m.seq_id for m in (await watch.__anext__()).messages)
        await watch.aclose()
        awaits, cases = count[0] + 1, 0
        for when in ("before", "after"):
            for at in range(1, awaits + 1):
                thread = await eight_messages(store, f"cut-{when}-{at}")
                watch = thread.watch(after=0, block_ms=20)
                cutting(watch, at, when, thread)
                seen, cursor = [], 0
                try:
                    while True:  # until the cut
                        event = await watch.__anext__()
                        seen.extend(m.seq_id for m in event.messages)
                        cursor = event.cursor
                except (asyncio.CancelledError, errors.ConnectionFailed):
                    cases += 1
                await watch.aclose()
                # Written while no watcher ran; their events trimmed but the newest two.
                await four_more(thread, 8)  # when the cut came before them
                await four_more(thread, 12)
                async with thread.watch(after=cursor, block_ms=20) as resumed:
                    async for event in resumed:
                        seen.extend(m.seq_id for m in event.messages)
                        if seen[-1:] == [16]:
                            break
                assert seen == list(range(1, 17)), f"cut {when} await {at}"
        return cases, 2 * awaits

    cases, expected = asyncio.run(main())
    # Each await of the first watcher's run was cut in some case (the catch-up's and the stream's).
    assert cases == expected
