"""The one container reader (kvstore/_engine/layout/reader.py): what it sends for each kind of
container, and what it makes of the replies: records by sequence, cut to a range."""

from __future__ import annotations

from kvstore._engine.layout.reader import Containers, WindowRead, cut, fetch, just_appended
from kvstore._engine.record import encode_record

from .driver import batch, drive
from .layout import chunk_hash, message


def record(seq: int) -> bytes:
    return encode_record(message(seq))


def test_one_round_trip_reads_chunks_window_and_legacy_then_the_checks(thread):
    keys = thread.keys
    containers = Containers(
        windows=[WindowRead("(4", "(9", descending=True, limit=3)],
        chunks=[1, 1, 3],
        legacy=[7],
    )
    chunk_1 = chunk_hash({1: record(1), 2: record(2)})
    chunk_3 = chunk_hash({3: record(3)})
    replies = [
        [chunk_1[b"_m"], chunk_1[b"d"]],
        [chunk_3[b"_m"], chunk_3[b"d"]],
        [record(8), b"8", record(6), b"6"],
        [b"legacy 7"],
        b"12",
    ]
    expected = [
        ("HMGET", keys.chunk(1), "_m", "d"),  # a chunk named twice is read once
        ("HMGET", keys.chunk(3), "_m", "d"),
        ("ZRANGE", keys.window, "(9", "(4", "BYSCORE", "REV", "LIMIT", 0, 3, "WITHSCORES"),
        ("HMGET", keys.legacy, 7),
        ("HGET", keys.meta, "gen"),
    ]
    found = drive(
        fetch(thread, containers, [("HGET", keys.meta, "gen")]), batch(expected, reply=replies)
    )
    assert sorted(found.records) == [1, 2, 3, 6, 7, 8]
    assert found.records[7] == b"legacy 7" and found.checks == [b"12"]
    assert [s for s, _ in cut(found.records, 1, 8)] == [2, 3, 6, 7]
    assert [s for s, _ in cut(found.records, 1, 8, descending=True)] == [7, 6, 3, 2]


def test_a_window_read_without_scores_holds_its_range_only_when_whole(thread):
    keys = thread.keys
    command = ("ZRANGE", keys.window, 5, 7, "BYSCORE")
    whole = drive(fetch(thread, just_appended(5, 7)), batch([command], reply=[[b"a", b"b", b"c"]]))
    assert whole.records == {5: b"a", 6: b"b", 7: b"c"}
    short = drive(fetch(thread, just_appended(5, 7)), batch([command], reply=[[b"a", b"b"]]))
    assert short.records == {}


def test_chunk_token_counts_come_with_the_records_when_asked(thread):
    keys = thread.keys
    chunk = chunk_hash({4: b"x" * 10})
    found = drive(
        fetch(thread, Containers(chunks=[4], tokens=True)),
        batch([("HMGET", keys.chunk(4), "_m", "d")], reply=[[chunk[b"_m"], chunk[b"d"]]]),
    )
    # A manifest line without a count counts a token per 4 record bytes, rounded up.
    assert found.records == {4: b"x" * 10} and found.tokens == {4: 3}


def test_locate_places_name_the_containers_in_order():
    containers, wanted = Containers.located([b"3", b"-1", b"9", b"0", b"2", b"1", b"5", b"-2"])
    assert wanted == [3, 2, 5]
    assert containers.windows == [WindowRead(3, 3, scores=False)]
    assert list(containers.chunks) == [1] and list(containers.legacy) == [5]
    assert not Containers()
