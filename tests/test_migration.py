"""Layout-1 threads: read as they are, migrated by bounded steps on write, correct throughout."""

from __future__ import annotations

import json

import pytest

from kvstore import AssistantMessage, StoreConfig, UserMessage
from kvstore._record import decode_records

from .layout_check import check_layout


def write_layout_1(client, keys, count: int, turn: tuple[str, int] | None = None) -> list:
    """A layout-1 thread written with raw commands: version-1 JSON records, string content."""
    records = {}
    ids = {}
    otids = {}
    for sequence in range(1, count + 1):
        kind = "user_message" if sequence % 2 else "assistant_message"
        body = {
            "message_type": kind,
            "id": f"message-legacy-{sequence}",
            "date": "2026-01-02T03:04:05+00:00",
            "content": f"legacy {sequence} " + "z" * (sequence % 50),
        }
        if sequence % 3 == 0:
            body["otid"] = f"legacy-otid-{sequence}"
            otids[body["otid"]] = sequence
        records[sequence] = json.dumps(body).encode()
        ids[body["id"]] = sequence
    pipe = client.pipeline(transaction=False)
    for start in range(1, count + 1, 1000):
        chunk = {s: records[s] for s in range(start, min(start + 1000, count + 1))}
        pipe.hset(keys.legacy, mapping=chunk)
    pipe.hset(keys.ids, mapping=ids)
    if otids:
        pipe.hset(keys.otids, mapping=otids)
    meta = {"layout": "1", "last_seq": count}
    if turn:
        meta.update(turn_id=turn[0], turn_seq=turn[1], turn_outcome="open")
    pipe.hset(keys.meta, mapping=meta)
    pipe.execute()
    return decode_records(sorted(records.items()))


def check_reads(thread, expected, limits=(1, 7, 50, 200)):
    assert list(thread.iter()) == expected
    assert thread.context() == expected
    sequences = [m.seq_id for m in expected]
    by_seq = {m.seq_id: m for m in expected}
    anchors = [sequences[0], sequences[len(sequences) // 3], sequences[-1] - 3, sequences[-1]]
    for limit in limits:
        assert thread.list(limit=limit, order="desc").messages == expected[::-1][:limit]
        for anchor in anchors:
            page = thread.list(after=anchor, limit=limit)
            assert page.messages == [by_seq[s] for s in sequences if s > anchor][:limit]
            page = thread.list(before=anchor, limit=limit, order="desc")
            assert page.messages == [by_seq[s] for s in reversed(sequences) if s > anchor][-limit:]
    middle = expected[len(expected) // 2]
    assert thread.get(middle.id) == middle


def test_a_50_message_layout_1_thread_reads_as_it_is_and_migrates_on_write(make_thread, raw_client, namespace):
    thread = make_thread("old-thread", window_size=8, chunk_size=4)
    expected = write_layout_1(raw_client, thread.keys, 50)
    assert expected[0].content[0].text.startswith("legacy 1")  # a v1 string reads as a text part
    assert thread.stats().stored_messages == 50 and thread.stats().layout_version == 1
    check_reads(thread, expected)
    expected += thread.append(UserMessage(content="the first new message"))
    assert thread.stats().layout_version == 1
    assert raw_client.zcard(thread.keys.chunk_index) == 4  # the first write moved exactly 4 chunks
    check_reads(thread, expected)
    thread.migrate()
    assert thread.stats().layout_version == 2
    assert not raw_client.exists(thread.keys.legacy)
    check_reads(thread, expected)
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, window_size=8, chunk_size=4))
    # An otid stored in layout 1 still makes a replay.
    replay = thread.append(UserMessage(content="again", otid="legacy-otid-3"))
    assert replay == [expected[2]]


def test_a_5000_message_layout_1_thread_with_a_turn_in_progress(make_thread, raw_client, namespace, server_only):
    thread = make_thread("big-old-thread")
    expected = write_layout_1(raw_client, thread.keys, 5000, turn=("turn-old", 4990))
    check_reads(thread, expected, limits=(1, 50, 200))
    # The first new write moves exactly 4 chunks (4 x 32 messages), and nothing more.
    expected += thread.append(AssistantMessage(content="reply after the upgrade"), turn_id="turn-old")
    assert raw_client.zcard(thread.keys.chunk_index) == 4
    assert raw_client.hlen(thread.keys.legacy) == 5000 - 128
    check_reads(thread, expected, limits=(1, 50, 200))
    # Later writes go on moving; a half-moved thread pages and loads its context correctly.
    for i in range(5):
        expected += thread.append(AssistantMessage(content=f"more {i}"), turn_id="turn-old")
    assert raw_client.zcard(thread.keys.chunk_index) == 24
    check_reads(thread, expected, limits=(1, 50, 200))
    result = thread.finish_turn("turn-old")
    assert result.reply_count == 11 + 6  # sequences 4990..5000 and the six new replies
    assert (result.first_sequence, result.last_sequence) == (4990, 5006)
    calls = thread.migrate(max_calls=3)
    assert calls == 3 and thread.stats().layout_version == 1
    thread.migrate()
    stats = thread.stats()
    assert stats.layout_version == 2 and stats.stored_messages == 5006
    check_reads(thread, expected, limits=(1, 50, 200))
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace))


def test_replace_and_remove_turn_finish_the_migration_first(make_thread, raw_client):
    thread = make_thread("old", window_size=8, chunk_size=4)
    expected = write_layout_1(raw_client, thread.keys, 60)
    new = thread.replace(expected[5].id, UserMessage(content="replaced"))
    assert new.seq_id == 6 and thread.get(new.id) == new
    assert thread.stats().layout_version == 2
    assert [m.seq_id for m in thread.iter()] == list(range(1, 61))


@pytest.mark.parametrize("layout", ["3", "banana"])
def test_an_unknown_layout_is_refused(make_thread, raw_client, layout):
    from kvstore import errors

    thread = make_thread("future")
    raw_client.hset(thread.keys.meta, mapping={"layout": layout, "last_seq": 1})
    with pytest.raises(errors.LayoutError, match="layout"):
        thread.append(UserMessage(content="x"))
