"""The live tail: every write's event in the same atomic step, thread.watch() (sync and async),
publish() and the turn's lease (fencing), and resuming from any cursor with no gap and no repeat."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kvstore import AssistantMessage, StoreConfig, ToolCallMessage, UserMessage, errors
from kvstore.events import (
    Compacted,
    Delta,
    MessageReplaced,
    MessagesAdded,
    ThreadDeleted,
    TurnFinished,
    TurnRemoved,
    TurnStarted,
)
from kvstore.messages import ToolCallDelta

from ..conftest import make_async_store, make_sync_store


@pytest.fixture
def store(server_only, backend, namespace):
    store = make_sync_store(backend, StoreConfig(namespace=namespace, window_size=4, chunk_size=2))
    yield store
    store.close()


def take(watch, count: int) -> list:
    """The next `count` events; the watcher is closed."""
    events = []
    with watch:
        for event in watch:
            events.append(event)
            if len(events) == count:
                break
    return events


def position(cursor: str) -> str:
    """A cursor without the thread's incarnation ("<n>-<s>@<born>": "<n>-<s>")."""
    return cursor.partition("@")[0]


def wait_for(events: list, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(events) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_every_write_adds_its_event_in_order(store, raw_client):
    thread = store.thread("t")
    events = []
    watch = thread.watch(after="0-0", block_ms=500)  # from the thread's first event
    reader = threading.Thread(target=lambda: events.extend(watch))  # ends with the deletion
    reader.start()
    lease = thread.hold_turn("turn-1")
    stored = thread.append(
        [UserMessage(content="hi"), AssistantMessage(content="hello")], turn_id=lease
    )
    thread.publish(lease, "more")
    thread.publish(
        lease, ToolCallMessage(tool_call=ToolCallDelta(name="weather", arguments='{"ci'))
    )
    thread.finish_turn(lease)
    thread.replace(stored[0].id, UserMessage(content="hi!"))
    summary = thread.compact("what happened", last_sequence=2)
    # Deltas were never stored as messages.
    assert thread.stats().stored_messages == 3
    wait_for(events, 7)  # (the messages an event names are read when the watcher comes to it)
    thread.remove_turn("turn-1")
    wait_for(events, 8)
    time.sleep(0.3)
    # A watcher that has caught up is blocked on the stream when the delete's event comes.
    thread.delete()
    reader.join(10)
    assert not reader.is_alive()
    watch.close()
    kinds = [type(e) for e in events]
    assert kinds == [
        TurnStarted,
        MessagesAdded,
        Delta,
        Delta,
        TurnFinished,
        MessageReplaced,
        Compacted,
        TurnRemoved,
        ThreadDeleted,
    ]
    started, added, text, tool, finished, replaced, compacted, removed, _deleted = events
    assert (started.turn_id, started.reply_start, started.lease) == ("turn-1", 1, lease.lease)
    assert (added.first_sequence, added.last_sequence, added.turn_id) == (1, 2, "turn-1")
    assert [m.id for m in added.messages] == [m.id for m in stored]
    assert (
        text.message.content in ("more", [{"type": "text", "text": "more"}])
        or text.message.content[0].text == "more"
    )
    assert tool.message.tool_call.name == "weather"
    assert (
        finished.outcome,
        finished.reply_count,
        finished.first_sequence,
        finished.last_sequence,
    ) == ("completed", 2, 1, 2)
    assert (replaced.sequence, replaced.message_id) == (1, stored[0].id)
    assert (compacted.summary_sequence, compacted.last_sequence) == (summary.seq_id, 2)
    assert (removed.turn_id, removed.removed, removed.done) == ("turn-1", 2, True)
    # The cursors count the events: 1, 2, ... each with the thread's last sequence then.
    assert [int(position(e.cursor).split("-")[0]) for e in events] == list(range(1, 10))
    assert [int(position(e.cursor).split("-")[1]) for e in events] == [0, 2, 2, 2, 2, 2, 3, 3, 3]
    # Each names the thread's incarnation (the one meta's `born` holds while it lives).
    assert len({e.cursor.partition("@")[2] for e in events}) == 1
    # The delete removed the stream with the thread's other keys.
    assert raw_client.exists(thread.keys.events) == 0


def test_a_watcher_that_missed_the_deletion_learns_it(store):
    thread = store.thread("t")
    thread.append(UserMessage(content="hi"))
    cursor = take(thread.watch(after="0-0"), 1)[0].cursor
    thread.delete()
    with thread.watch(after=cursor, block_ms=100) as watch:
        assert [type(e) for e in watch] == [ThreadDeleted]


def test_a_watcher_gets_messages_as_they_are_stored(store):
    thread = store.thread("t")
    thread.append(UserMessage(content="before"))
    got = []
    with thread.watch(block_ms=200) as watch:

        def consume():
            got.extend(take(watch, 3))

        reader = threading.Thread(target=consume)
        reader.start()
        time.sleep(0.3)  # the watcher blocks on the server
        for i in range(3):
            thread.append(UserMessage(content=f"m{i}"))
        reader.join(10)
    assert [[m.content for m in e.messages] for e in got] == [["m0"], ["m1"], ["m2"]]
    assert [e.first_sequence for e in got] == [2, 3, 4]


def test_a_stale_lease_is_refused_and_writes_nothing(store):
    thread = store.thread("t")
    first = thread.hold_turn("turn-1")
    thread.publish(first, "a")
    second = thread.hold_turn("turn-1")  # another worker takes the turn over
    assert (second.lease, second.reply_start) == (first.lease + 1, first.reply_start)
    for refused in (
        lambda: thread.publish(first, "b"),
        lambda: thread.append(AssistantMessage(content="stale"), turn_id=first),
        lambda: thread.finish_turn(first),
    ):
        with pytest.raises(errors.TurnFenced) as caught:
            refused()
        assert caught.value.http_status == 409
    thread.publish(second, "c")
    thread.append(AssistantMessage(content="fresh"), turn_id=second)
    assert thread.finish_turn(second).reply_count == 1
    events = take(thread.watch(after="0-0"), 6)
    assert [type(e).__name__ for e in events] == [
        "TurnStarted",
        "Delta",
        "TurnStarted",
        "Delta",
        "MessagesAdded",
        "TurnFinished",
    ]
    assert [m.content for m in events[4].messages] == ["fresh"]
    # A finished turn takes no delta, so its finish is its last event; nor can it be held.
    with pytest.raises(errors.TurnFinished):
        thread.publish(second, "late")
    with pytest.raises(errors.TurnFinished):
        thread.hold_turn("turn-1")
    with pytest.raises(errors.TurnNotFound):
        thread.publish("never-started", "x")
    # start_turn's callers are unchanged: the sequence, and no fencing without a lease.
    assert thread.start_turn("turn-2") == 2
    thread.append(AssistantMessage(content="unfenced"), turn_id="turn-2")


def test_resuming_after_any_event_gets_the_rest_once(store):
    thread = store.thread("t")
    for i in range(20):
        if i % 5 == 0:
            thread.start_turn(f"turn-{i}")
        thread.append(UserMessage(content=f"m{i}"), turn_id=f"turn-{i - i % 5}")
        if i % 5 == 4:
            thread.finish_turn(f"turn-{i - 4}")
    full = take(thread.watch(after="0-0"), 28)
    assert len(full) == 28
    for cut in range(len(full)):
        rest = (
            take(thread.watch(after=full[cut].cursor), len(full) - cut - 1)
            if cut < len(full) - 1
            else []
        )
        assert [e.cursor for e in rest] == [e.cursor for e in full[cut + 1 :]]


def test_a_cursor_older_than_the_stream_pages_then_goes_on(server_only, backend, namespace):
    store = make_sync_store(backend, StoreConfig(namespace=namespace, events_max_len=5))
    thread = store.thread("t")
    first = thread.append(UserMessage(content="m0"))
    for i in range(1, 400):
        thread.append(UserMessage(content=f"m{i}"))
    watch = thread.watch(after="1-1", block_ms=200)
    seen: list[int] = []
    cursors = []

    def consume():
        for event in watch:
            assert isinstance(event, MessagesAdded)
            seen.extend(m.seq_id for m in event.messages)
            cursors.append(event.cursor)
            if seen and seen[-1] == 410:
                break

    reader = threading.Thread(target=consume)
    reader.start()
    for i in range(400, 410):
        thread.append(UserMessage(content=f"m{i}"))
    reader.join(20)
    watch.close()
    assert first.messages[0].seq_id == 1 if hasattr(first, "messages") else True
    assert seen == list(range(2, 411))
    # A sequence cursor pages too: from 100 on.
    resumed = []
    with thread.watch(after=100) as again:
        for event in again:
            resumed.extend(m.seq_id for m in event.messages)
            if resumed[-1] == 410:
                break
    assert resumed == list(range(101, 411))
    store.close()


def test_events_can_be_turned_off(store, server_only, backend, namespace, raw_client):
    off = make_sync_store(backend, StoreConfig(namespace=namespace + "x", events=False))
    thread = off.thread("t")
    thread.append(UserMessage(content="hi"))
    assert raw_client.exists(thread.keys.events) == 0
    with pytest.raises(errors.ConfigError):
        next(thread.watch())
    off.close()


def test_the_stream_expires_with_the_thread(server_only, backend, namespace, raw_client):
    store = make_sync_store(
        backend, StoreConfig(namespace=namespace, thread_ttl=100, events_max_age=3600)
    )
    thread = store.thread("t")
    thread.append(UserMessage(content="hi"))
    # The thread's deadline, as every key of the thread (docs/LAYOUT.md, "Idle expiry").
    assert (
        raw_client.pexpiretime(thread.keys.events) == raw_client.pexpiretime(thread.keys.meta) > 0
    )
    store.close()


def _clients(raw_client) -> dict[str, str]:
    return {c["id"]: c["cmd"] for c in raw_client.client_list()}


def test_cancelling_an_async_watcher_leaves_no_connection(
    server_only, backend, namespace, raw_client
):
    async def main():
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        thread = store.thread("t")
        await thread.append(UserMessage(content="hi"))
        before = _clients(raw_client)
        got = []

        async def consume():
            async for event in thread.watch(block_ms=30_000):
                got.append(event)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)
        during = _clients(raw_client)
        await thread.append(UserMessage(content="seen"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)
        after = _clients(raw_client)
        await store.close()
        return before, during, after, got

    before, during, after, got = asyncio.run(main())
    (watcher,) = set(during) - set(before)  # the watcher's own connection, blocked in XREAD
    assert during[watcher] == "xread"
    assert watcher not in after
    assert [m.content for m in got[0].messages] == ["seen"]


def test_closing_a_sync_watcher_closes_its_connection(store, raw_client):
    thread = store.thread("t")
    thread.append(UserMessage(content="hi"))
    before = _clients(raw_client)
    watch = thread.watch(after="0-0")
    assert isinstance(next(watch), MessagesAdded)
    assert len(set(_clients(raw_client)) - set(before)) == 1
    watch.close()
    assert _gone(raw_client, before)
    assert list(watch) == []


def _gone(raw_client, before: dict[str, str]) -> bool:
    """Whether the server lists no client `before` did not: a closed socket leaves its list
    once the server's event loop has seen the close, which may come a moment after it."""
    for _ in range(100):  # at most ~2 s
        if not set(_clients(raw_client)) - set(before):
            return True
        time.sleep(0.02)
    return False


def test_a_stream_past_its_age_is_gone_and_a_watcher_pages_across_the_gap(
    server_only, backend, namespace, raw_client
):
    store = make_sync_store(backend, StoreConfig(namespace=namespace, events_max_age=1))
    thread = store.thread("t")
    thread.append(UserMessage(content="m1"))
    thread.append(UserMessage(content="m2"))
    assert 1000 < raw_client.pttl(thread.keys.events) <= 1500  # 1 to 1.5 events_max_age
    time.sleep(1.7)
    assert raw_client.exists(thread.keys.events) == 0  # idle past events_max_age
    thread.append(UserMessage(content="m3"))
    # The count went on in meta: the new event is the third, so a watcher at the first sees
    # that the second is gone and pages the messages after its sequence, then reads on.
    with thread.watch(after="1-1", block_ms=200) as watch:
        paged = next(watch)
        # Its cursor names the event it reads on after (the stream's third), and m3.
        assert (type(paged), position(paged.cursor), paged.paged) == (MessagesAdded, "3-3", True)
        assert [m.content for m in paged.messages] == ["m2", "m3"]
        thread.append(UserMessage(content="m4"))
        after = next(watch)  # not m3's event again: m4's
        assert (position(after.cursor), [m.content for m in after.messages], after.paged) == (
            "4-4",
            ["m4"],
            False,
        )
    store.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_watcher_behind_a_stream_that_expired_pages_without_waiting_for_a_write(
    server_only, backend, namespace, raw_client, mode
):
    """A cursor whose next events went with the stream (idle past events_max_age) and no write
    since: the watcher sees the thread's count past its cursor with no stream to read, pages
    the messages after its sequence, then reads on (no new write is needed to wake it)."""
    config = StoreConfig(namespace=namespace, events_max_age=1)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append(UserMessage(content="m1"))
    thread.append([UserMessage(content="m2"), UserMessage(content="m3")])
    time.sleep(1.7)
    assert raw_client.exists(thread.keys.events) == 0  # idle past events_max_age
    if mode == "sync":
        with thread.watch(after="1-1", block_ms=200) as watch:
            bound = threading.Timer(10, watch.close)  # a watcher that waits ends the test
            bound.start()
            paged = next(watch, None)
            bound.cancel()
    else:

        async def first_event():
            async_store = make_async_store(backend, config)
            try:
                async with async_store.thread("t").watch(after="1-1", block_ms=200) as watch:
                    return await asyncio.wait_for(anext(watch), 10)
            finally:
                await async_store.close()

        paged = asyncio.run(first_event())
    # Its cursor names the event it reads on after (the thread counted two), and m3.
    assert (type(paged), position(paged.cursor), paged.paged) == (MessagesAdded, "2-3", True)
    assert [m.content for m in paged.messages] == ["m2", "m3"]
    store.close()


def test_watch_runs_on_every_backend_the_in_process_tier_too(backend, namespace):
    store = make_sync_store(backend, StoreConfig(namespace=namespace))
    thread = store.thread("t")
    thread.append(UserMessage(content="hi"))
    lease = thread.hold_turn("turn-1")
    thread.publish(lease, "he")
    thread.finish_turn(lease)
    events = take(thread.watch(after="0-0", block_ms=100), 4)
    assert [e.kind for e in events] == ["messages_added", "turn_started", "delta", "turn_finished"]
    assert [position(e.cursor) for e in events] == ["1-1", "2-1", "3-1", "4-1"]
    store.close()


def test_a_watcher_without_messages_gets_their_sequences(store):
    # Layout 3: an added event names its messages by sequence only (issue 27: the ids made up
    # most of the stream's bytes); the ids come with the messages, when they are read.
    thread = store.thread("t")
    stored = thread.append([UserMessage(content="a"), UserMessage(content="b")])
    (event,) = take(thread.watch(after="0-0", messages=False), 1)
    assert (event.messages, event.message_ids) == ([], ())
    assert (event.first_sequence, event.last_sequence) == (1, 2)
    (full,) = take(thread.watch(after="0-0"), 1)
    assert list(full.message_ids) == [m.id for m in full.messages] == [m.id for m in stored]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_refused_read_on_a_standalone_server_is_a_kvstore_error_at_once(
    server_only, backend, namespace, raw_client, mode
):
    """CLIENT UNBLOCK ... ERROR ends the watcher's blocked XREAD with an UNBLOCKED reply: a
    standalone watcher does not retry, and raises ServerError, never redis-py's ResponseError."""
    config = StoreConfig(namespace=namespace)
    outcome: list = []

    def unblock() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for client in raw_client.client_list():
                if client.get("cmd") == "xread":
                    raw_client.execute_command("CLIENT", "UNBLOCK", client["id"], "ERROR")
                    return
            time.sleep(0.01)

    async def watch_async() -> None:
        store = make_async_store(backend, config)
        try:
            async with store.thread("t").watch(block_ms=20000) as watch:
                async for _ in watch:
                    pass
        finally:
            await store.close()

    def watch() -> None:
        try:
            if mode == "async":
                asyncio.run(watch_async())
                return
            store = make_sync_store(backend, config)
            try:
                with store.thread("t").watch(block_ms=20000) as events:
                    for _ in events:
                        pass
            finally:
                store.close()
        except Exception as exc:
            outcome.append(exc)

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    unblock()
    reader.join(5)
    assert len(outcome) == 1 and type(outcome[0]) is errors.ServerError, outcome
    assert "UNBLOCKED" in str(outcome[0])
