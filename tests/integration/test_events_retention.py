"""The event stream bounded by what the thread keeps (docs/EVENTS.md, "Cursors"): retention
drops the events of the messages it deletes, and a watcher whose cursor is older than the stream
pages the messages the thread still keeps, once and in order, then goes on with the stream."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, StoreConfig, UserMessage
from kvstore.events import Compacted, MessagesAdded, TurnFinished

from ..conftest import make_sync_store


@pytest.fixture
def store(server_only, backend, namespace):
    config = StoreConfig(namespace=namespace, window_size=4, chunk_size=2, retained_message_limit=4)
    store = make_sync_store(backend, config)
    yield store
    store.close()


def chat(thread, turns: int, start: int = 1) -> None:
    """`turns` turns (a user message, the turn started, a reply, the turn finished), the thread
    compacted after every fifth: four events a turn, and retention after each compaction."""
    for turn in range(start, start + turns):
        turn_id = f"turn-{turn}"
        thread.append(UserMessage(content=f"q{turn}"), turn_id=turn_id)
        thread.start_turn(turn_id)
        (reply,) = thread.append(AssistantMessage(content=f"a{turn}"), turn_id=turn_id)
        thread.finish_turn(turn_id)
        if turn % 5 == 0:
            thread.compact(f"summary to {turn}", reply.seq_id)


def _entries(raw_client, thread) -> list[tuple[int, int]]:
    return [
        tuple(int(x) for x in entry_id.decode().split("-"))
        for entry_id, _ in raw_client.xrange(thread.keys.events)
    ]


def test_the_stream_holds_no_event_older_than_the_oldest_kept_message(store, raw_client):
    thread = store.thread("t")
    chat(thread, 40)
    stats = thread.stats()
    kept = [m.seq_id for m in thread.iter()]
    assert stats.deleted_before_sequence > 1 and kept[0] >= stats.deleted_before_sequence
    entries = _entries(raw_client, thread)
    # Every event made before the oldest kept message was stored is gone; the others stay, in
    # their order, with no gap.
    assert entries and min(s for _, s in entries) >= stats.deleted_before_sequence
    assert [n for n, _ in entries] == list(range(entries[0][0], entries[-1][0] + 1))
    assert entries[-1][0] == 40 * 4 + 40 // 5
    # Never longer than the events since the oldest kept message: about two a message here
    # (four a turn of two messages), against the 1,000 events_max_len allows.
    assert len(entries) <= 2 * (kept[-1] - stats.deleted_before_sequence + 1) + 8


def test_with_retention_the_stream_keeps_about_as_many_events_as_messages_kept(
    server_only, backend, namespace, raw_client
):
    """The stream keeps about the newest retained_message_limit events (MAXLEN ~ trims whole
    nodes: with nodes of one entry, exactly that many), also while retention deletes nothing."""
    (before,) = raw_client.config_get("stream-node-max-entries").values()
    raw_client.config_set("stream-node-max-entries", 1)
    try:
        config = StoreConfig(namespace=namespace, retained_message_limit=6)
        store = make_sync_store(backend, config)
        thread = store.thread("t")
        chat(thread, 4)  # no compaction: retention deletes nothing
        assert raw_client.xlen(thread.keys.events) == 6
        assert _entries(raw_client, thread)[-1][0] == 16
        store.close()
    finally:
        raw_client.config_set("stream-node-max-entries", before)


def test_an_added_event_names_its_sequences_and_not_its_ids(store, raw_client):
    thread = store.thread("t")
    stored = thread.append([UserMessage(content="a"), UserMessage(content="b")])
    ((_, fields),) = raw_client.xrange(thread.keys.events)
    assert fields[b"k"] == b"added" and (fields[b"a"], fields[b"b"]) == (b"1", b"2")
    assert b"i" not in fields
    # The watcher reads the ids with the messages.
    with thread.watch(after="0-0") as watch:
        event = next(watch)
    assert isinstance(event, MessagesAdded)
    assert event.message_ids == tuple(m.id for m in stored)


def test_a_resume_from_before_the_trimmed_stream_pages_what_the_thread_keeps(store, raw_client):
    thread = store.thread("t")
    chat(thread, 3)
    with thread.watch(after="0-0") as watch:
        first = next(watch)
    assert isinstance(first, MessagesAdded) and first.last_sequence == 1
    # Retention deletes messages, and the events of the span, the watcher's next among them.
    chat(thread, 37, start=4)
    oldest_event = _entries(raw_client, thread)[0][0]
    assert oldest_event > 2
    kept = [m.seq_id for m in thread.iter()]
    events = []
    with thread.watch(after=first.cursor, block_ms=100) as watch:
        for event in watch:
            events.append(event)
            if isinstance(event, TurnFinished) and event.turn_id == "turn-41":
                break
            if len(events) == 1:
                chat(thread, 1, start=41)  # the watcher goes on with the stream
    paged = [e for e in events if isinstance(e, MessagesAdded) and e.paged]
    live = [e for e in events if not (isinstance(e, MessagesAdded) and e.paged)]
    # The messages the thread keeps, paged once and in order; then the new turn's events.
    assert [m.seq_id for e in paged for m in e.messages] == kept
    assert [e.kind for e in live] == [
        "messages_added",
        "turn_started",
        "messages_added",
        "turn_finished",
    ]
    assert [m.content for e in live for m in getattr(e, "messages", [])] == ["q41", "a41"]
    assert not any(isinstance(e, Compacted) for e in live)
