"""Layout-1 threads: read as they are, migrated by bounded steps on write (to layout 2, then 3:
tests/integration/test_migration_2_to_3.py), correct throughout."""

from __future__ import annotations

import json

import pytest

from kvstore import AssistantMessage, StoreConfig, UserMessage
from kvstore._engine.layout.formats import TurnHeader
from kvstore._engine.record import decode_records

from ..support.layout_check import check_layout


def write_layout_1(
    client,
    keys,
    count: int,
    turn: tuple[str, int] | None = None,
    *,
    ids: dict[int, str] | None = None,
    otids: dict[int, str] | None = None,
    last_seq: int | str | None = "count",
    outcome: str = "open",
    junk: tuple[str, ...] = (),
) -> list:
    """A layout-1 thread written with raw commands: version-1 JSON records, string content.

    `ids`/`otids` replace the made-up ids (and otids) of some sequences; `last_seq` is what meta
    says (None: no such field; the default is `count`); `junk` adds legacy fields that are not
    sequences."""
    records = {}
    id_map = {}
    otid_map = {}
    for sequence in range(1, count + 1):
        kind = "user_message" if sequence % 2 else "assistant_message"
        body = {
            "message_type": kind,
            "id": (ids or {}).get(sequence, f"message-legacy-{sequence}"),
            "date": "2026-01-02T03:04:05+00:00",
            "content": f"legacy {sequence} " + "z" * (sequence % 50),
        }
        if sequence % 3 == 0 or sequence in (otids or {}):
            body["otid"] = (otids or {}).get(sequence, f"legacy-otid-{sequence}")
            otid_map[body["otid"]] = sequence
        records[sequence] = json.dumps(body).encode()
        id_map[body["id"]] = sequence
    pipe = client.pipeline(transaction=False)
    for start in range(1, count + 1, 1000):
        chunk = {s: records[s] for s in range(start, min(start + 1000, count + 1))}
        pipe.hset(keys.legacy, mapping=chunk)
    for field in junk:
        pipe.hset(
            keys.legacy, field, json.dumps({"message_type": "user_message", "content": field})
        )
    pipe.hset(keys.ids, mapping=id_map)
    if otid_map:
        pipe.hset(keys.otids, mapping=otid_map)
    meta = {"layout": "1"}
    if last_seq is not None:
        meta["last_seq"] = count if last_seq == "count" else last_seq
    if turn:
        meta.update(turn_id=turn[0], turn_seq=turn[1], turn_outcome=outcome)
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


def test_a_50_message_layout_1_thread_reads_as_it_is_and_migrates_on_write(
    make_thread, raw_client, namespace
):
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
    assert thread.stats().layout_version == 3  # through 2: the migration ends in the current one
    assert not raw_client.exists(thread.keys.legacy)
    check_reads(thread, expected)
    check_layout(
        raw_client, thread.keys, StoreConfig(namespace=namespace, window_size=8, chunk_size=4)
    )
    # An otid stored in layout 1 still makes a replay.
    replay = thread.append(UserMessage(content="again", otid="legacy-otid-3"))
    assert replay == [expected[2]]


def test_a_5000_message_layout_1_thread_with_a_turn_in_progress(
    make_thread, raw_client, namespace, server_only
):
    thread = make_thread("big-old-thread")
    expected = write_layout_1(raw_client, thread.keys, 5000, turn=("turn-old", 4990))
    check_reads(thread, expected, limits=(1, 50, 200))
    # The first new write moves exactly 4 chunks (4 x chunk_size messages), and nothing more.
    expected += thread.append(
        AssistantMessage(content="reply after the upgrade"), turn_id="turn-old"
    )
    assert raw_client.zcard(thread.keys.chunk_index) == 4
    assert raw_client.hlen(thread.keys.legacy) == 5000 - 4 * StoreConfig().chunk_size
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
    assert stats.layout_version == 3 and stats.stored_messages == 5006
    check_reads(thread, expected, limits=(1, 50, 200))
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace))


def test_replace_and_remove_turn_finish_the_migration_first(make_thread, raw_client):
    thread = make_thread("old", window_size=8, chunk_size=4)
    expected = write_layout_1(raw_client, thread.keys, 60)
    new = thread.replace(expected[5].id, UserMessage(content="replaced"))
    assert new.seq_id == 6 and thread.get(new.id) == new
    assert thread.stats().layout_version == 3
    assert [m.seq_id for m in thread.iter()] == list(range(1, 61))


@pytest.mark.parametrize("layout", ["4", "banana"])
def test_an_unknown_layout_is_refused(make_thread, raw_client, layout):
    from kvstore import errors

    thread = make_thread("future")
    raw_client.hset(thread.keys.meta, mapping={"layout": layout, "last_seq": 1})
    with pytest.raises(errors.LayoutError, match="layout"):
        thread.append(UserMessage(content="x"))


# ------------------------------------------------------------ ids that break the framing

# Layout-1 ids, otids and a turn id holding the bytes the manifest framing uses ("\t", "\n"),
# the ones it escapes besides ("\r", "\0", "%"), an escape that must stay literal, and line
# breaks of other kinds.
FRAMING_IDS = {
    2: "message-tab\there",
    5: "message-newline\nhere",
    7: "message-cr\rhere",
    11: "message-nul\0here",
    13: "message-percent%here",
    17: "message-escape%09stays-literal",
    19: "message-\t\n%\r\0-all",
    23: "message-vt\x0bff\x0cls\u2028",
    29: "%",
    34: "message-in-turn\tone",
    37: "message-in-turn\ntwo",
}
FRAMING_OTIDS = {3: "otid\twith tab", 6: "otid\nnewline", 9: "otid%25", 35: "otid\tin turn"}
FRAMING_TURN = "turn%09old"  # a turn id the client accepts: '%' is allowed


def test_ids_with_framing_bytes_survive_migration_reads_retention_and_remove_turn(
    make_thread, raw_client, namespace
):
    from kvstore import errors

    values = {"window_size": 8, "chunk_size": 4, "retained_message_limit": 8}
    config = StoreConfig(namespace=namespace, **values)
    thread = make_thread("framing", **values)
    expected = write_layout_1(
        raw_client, thread.keys, 40, turn=(FRAMING_TURN, 30), ids=FRAMING_IDS, otids=FRAMING_OTIDS
    )
    by_id = {m.id: m for m in expected}
    check_layout(raw_client, thread.keys, config)

    def check_all(stored):
        check_layout(raw_client, thread.keys, config)
        check_reads(thread, stored)
        for message_id in FRAMING_IDS.values():
            if message_id in {m.id for m in stored}:
                assert thread.get(message_id) == by_id[message_id]

    check_all(expected)
    expected += thread.append(UserMessage(content="after the upgrade"), turn_id=FRAMING_TURN)
    check_all(expected)  # half moved: chunks of framing ids, and the legacy rest
    thread.migrate()
    check_all(expected)
    # Replace rewrites the message's manifest line, escaped as before.
    replaced = thread.replace(FRAMING_IDS[19], UserMessage(content="replaced"))
    assert replaced.id == FRAMING_IDS[19] and replaced.seq_id == 19
    expected[18] = by_id[FRAMING_IDS[19]] = replaced
    check_all(expected)
    # An otid whose manifest text is escaped still makes a replay.
    assert thread.append(UserMessage(content="again", otid=FRAMING_OTIDS[9])) == [expected[8]]

    # Retention deletes the chunks 1-32 (their ids and otids leave the maps) and trims the turn.
    thread.compact("the first thirty-two", 36)
    check_layout(raw_client, thread.keys, config)
    assert thread.stats().deleted_before_sequence == 33
    kept = [m for m in expected if m.seq_id >= 33]
    for sequence, message_id in FRAMING_IDS.items():
        assert (raw_client.hget(thread.keys.ids, message_id) is None) == (sequence < 33)
        if sequence < 33:
            with pytest.raises(errors.MessageNotFound):
                thread.get(message_id)
    for sequence, otid in FRAMING_OTIDS.items():
        assert (raw_client.hget(thread.keys.otids, otid) is None) == (sequence < 33)
    assert thread.list(turn_id=FRAMING_TURN).messages == kept
    assert thread.finish_turn(FRAMING_TURN).reply_count == len(kept)

    # Turn removal finds the messages by the same (escaped) manifest lines.
    assert thread.remove_turn(FRAMING_TURN) == len(kept)
    check_layout(raw_client, thread.keys, config)
    for message_id in (FRAMING_IDS[34], FRAMING_IDS[37]):
        assert raw_client.hget(thread.keys.ids, message_id) is None
    assert raw_client.hget(thread.keys.otids, FRAMING_OTIDS[35]) is None
    summary = [m for m in thread.iter()]
    assert [m.message_type for m in summary] == ["summary_message"]


def test_a_legacy_turn_id_with_a_tab_is_trimmed_by_retention(make_thread, raw_client, namespace):
    values = {"window_size": 8, "chunk_size": 4, "retained_message_limit": 8}
    thread = make_thread("framing-turn", **values)
    write_layout_1(raw_client, thread.keys, 40, turn=("turn\twith\ntabs", 26), outcome="completed")
    thread.migrate()
    thread.append(UserMessage(content="new"))
    thread.compact("summary", 36)
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **values))
    # Turn ids that hold a tab cannot be asked for through the API; the record is trimmed.
    turn = TurnHeader.parse(raw_client.hget(thread.keys.turns, "turn\twith\ntabs"))
    assert (turn.kept, turn.a, turn.b) == (8, 33, 40)  # the newest range is a-b


@pytest.mark.parametrize("byte", ["\t", "\n"])
def test_a_malformed_manifest_is_a_record_error_and_retention_stops_before_it(
    make_thread, raw_client, byte
):
    """A manifest a migration before the escaping wrote: a raw tab or newline in an id."""
    from kvstore import errors

    thread = make_thread("malformed", window_size=8, chunk_size=4, retained_message_limit=4)
    stored = thread.append([UserMessage(content=f"m{i}") for i in range(1, 31)])
    key = thread.keys.chunk_manifest(5)
    manifest = raw_client.get(key)
    broken = manifest.replace(
        stored[5].id.encode(), stored[5].id.encode()[:10] + byte.encode() + b"x"
    )
    raw_client.set(key, broken)
    with pytest.raises(errors.RecordError):
        list(thread.iter())
    with pytest.raises(errors.RecordError):
        thread.get(stored[5].id)
    assert thread.get(stored[0].id) == stored[0]
    # Retention deletes the chunk before the malformed one, then stops: no raw Lua error, no
    # partial write, and the same on the next call.
    summary = thread.compact("summary", 24)
    assert summary.seq_id == 31
    assert not raw_client.exists(*thread.keys.chunk_keys(1)) and raw_client.get(key) == broken
    assert raw_client.hget(thread.keys.ids, stored[0].id) is None
    assert thread.stats().deleted_before_sequence == 5
    assert thread.stats().stored_messages == 27
    # Sent again, the compaction is a replay (same last_sequence) whose retention stops the same way.
    assert thread.compact("summary again", 24) == summary
    assert raw_client.get(key) == broken
    assert thread.stats().stored_messages == 27
    assert thread.stats().deleted_before_sequence == 5


# ------------------------------------------------- a meta that lags (or lacks) last_seq


@pytest.mark.parametrize("last_seq", [None, 0, 45, 49])
def test_the_legacy_range_comes_from_the_hash_not_meta(
    make_thread, raw_client, namespace, last_seq
):
    values = {"window_size": 8, "chunk_size": 4}
    config = StoreConfig(namespace=namespace, **values)
    thread = make_thread("lagging", **values)
    expected = write_layout_1(raw_client, thread.keys, 50, last_seq=last_seq)
    check_layout(raw_client, thread.keys, config)
    new = thread.append(UserMessage(content="the first new message"))
    assert new[0].seq_id == 51  # no legacy sequence is reused
    expected += new
    check_layout(raw_client, thread.keys, config)
    check_reads(thread, expected)
    thread.migrate()
    check_layout(raw_client, thread.keys, config)
    assert not raw_client.exists(thread.keys.legacy)
    check_reads(thread, expected)
    for message in expected:
        assert thread.get(message.id) == message
    stats = thread.stats()
    assert (stats.stored_messages, stats.next_sequence, stats.layout_version) == (51, 52, 3)


def test_a_large_lagging_thread_is_scanned_over_several_calls_before_any_write(
    make_thread, raw_client, namespace
):
    values = {"window_size": 8, "chunk_size": 4, "max_chunks_per_call": 2}
    config = StoreConfig(namespace=namespace, **values)
    thread = make_thread("lagging-big", **values)
    expected = write_layout_1(raw_client, thread.keys, 1500, turn=("turn-old", 1490), last_seq=10)
    # A scan step is bounded: a few calls find the range, and none moves a message.
    assert thread.migrate(max_calls=1) == 1
    assert raw_client.hlen(thread.keys.legacy) == 1500 and not raw_client.exists(
        thread.keys.chunk_index
    )
    assert thread.stats().next_sequence == 11  # the range is not known yet
    # start_turn waits for the scan (the client runs the steps), then starts after the range.
    assert thread.start_turn("turn-new") == 1501
    check_layout(raw_client, thread.keys, config)
    expected += thread.append(AssistantMessage(content="reply"), turn_id="turn-new")
    assert expected[-1].seq_id == 1501
    assert thread.finish_turn("turn-new").reply_count == 1
    check_layout(raw_client, thread.keys, config)
    assert thread.get("message-legacy-1500") == expected[1499]
    check_reads(thread, expected, limits=(1, 50))


def test_compact_waits_for_the_scan(make_thread, raw_client, namespace):
    values = {"window_size": 8, "chunk_size": 4, "max_chunks_per_call": 1}
    thread = make_thread("lagging-compact", **values)
    expected = write_layout_1(raw_client, thread.keys, 300, last_seq=100)
    summary = thread.compact("the first 250", 250)
    assert summary.seq_id == 301
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **values))
    assert list(thread.iter()) == [*expected, summary]
    assert thread.context() == [summary, *expected[250:]]


def test_legacy_fields_that_are_not_sequences_stay_and_are_reported(
    make_thread, raw_client, namespace, caplog
):
    values = {"window_size": 8, "chunk_size": 4}
    config = StoreConfig(namespace=namespace, **values)
    thread = make_thread("junk", **values)
    junk = ("abc", "0", "-3", "007", "1.5", " 4", "")
    expected = write_layout_1(raw_client, thread.keys, 20, junk=junk)
    expected += thread.append(UserMessage(content="new"))
    check_layout(raw_client, thread.keys, config)
    with caplog.at_level("WARNING", logger="kvstore"):
        thread.migrate()
    assert "7 legacy fields" in caplog.text
    check_layout(raw_client, thread.keys, config)
    assert sorted(raw_client.hkeys(thread.keys.legacy)) == sorted(j.encode() for j in junk)
    stats = thread.stats()
    assert (stats.stored_messages, stats.layout_version, stats.next_sequence) == (21, 3, 22)
    check_reads(thread, expected)


# -------------------------------------------------------- migrated turns keep their turn


@pytest.mark.parametrize("scenario", ["finished", "open, then a new turn"])
def test_a_migrated_layout_1_turn_is_trimmed_when_retained_away(
    make_thread, raw_client, namespace, scenario
):
    values = {"window_size": 8, "chunk_size": 4, "retained_message_limit": 8}
    config = StoreConfig(namespace=namespace, **values)
    thread = make_thread("old-turn", **values)
    outcome = "completed" if scenario == "finished" else "open"
    write_layout_1(raw_client, thread.keys, 40, turn=("turn-old", 26), outcome=outcome)
    if scenario == "finished":
        thread.append(UserMessage(content="new"))
    else:
        thread.start_turn("turn-new")  # the legacy turn is no longer the thread's current one
        thread.append(UserMessage(content="new"), turn_id="turn-new")
    check_layout(raw_client, thread.keys, config)
    thread.migrate()
    check_layout(raw_client, thread.keys, config)
    # Every moved message the legacy turn record covers names the turn in its manifest.
    for member in raw_client.zrange(thread.keys.chunk_index, 0, -1):
        first = int(member.split(b":")[0])
        manifest = raw_client.get(thread.keys.chunk_manifest(first))  # a layout-3 chunk
        for line in manifest.decode()[:-1].split("\n"):
            sequence, turn = int(line.split("\t")[0]), line.split("\t")[5]
            assert turn == ("turn-old" if sequence >= 26 else ""), line
    thread.compact("summary", 36)
    check_layout(raw_client, thread.keys, config)
    assert thread.stats().deleted_before_sequence == 33
    page = thread.list(turn_id="turn-old")
    assert [m.seq_id for m in page.messages] == list(range(33, 41))
    result = thread.finish_turn("turn-old")
    if scenario == "finished":
        # A turn finished before its migration keeps the result it was finished with.
        assert (result.reply_count, result.first_sequence, result.last_sequence) == (15, 26, 40)
    else:
        assert (result.reply_count, result.first_sequence, result.last_sequence) == (8, 33, 40)
