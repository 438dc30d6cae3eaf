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
        [None, None],
        [chunk_1[b"_m"], chunk_1[b"d"]],
        [chunk_3[b"_m"], chunk_3[b"d"]],  # layout-3 strings
        [None, None],
        [record(8), b"8", record(6), b"6"],
        [b"legacy 7"],
        b"12",
    ]
    expected = [
        # A chunk named twice is read once, as layout-3 strings and as a layout-2 hash.
        ("MGET", keys.chunk_manifest(1), keys.chunk_data(1)),
        ("HMGET", keys.chunk(1), "_m", "d"),
        ("MGET", keys.chunk_manifest(3), keys.chunk_data(3)),
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
    commands = [
        ("MGET", keys.open_manifest, keys.open_data),
        ("ZRANGE", keys.window, 5, 7, "BYSCORE"),
    ]
    whole = drive(
        fetch(thread, just_appended(5, 7)),
        batch(commands, reply=[[None, None], [b"a", b"b", b"c"]]),
    )
    assert whole.records == {5: b"a", 6: b"b", 7: b"c"}
    short = drive(
        fetch(thread, just_appended(5, 7)), batch(commands, reply=[[None, None], [b"a", b"b"]])
    )
    assert short.records == {}


def test_just_appended_keeps_only_its_range_of_the_open_chunk(thread):
    keys = thread.keys
    open_chunk = chunk_hash({s: record(s) for s in range(3, 9)})
    commands = [
        ("MGET", keys.open_manifest, keys.open_data),
        ("ZRANGE", keys.window, 5, 7, "BYSCORE"),
    ]
    found = drive(
        fetch(thread, just_appended(5, 7)),
        batch(commands, reply=[[open_chunk[b"_m"], open_chunk[b"d"]], []]),
    )
    assert found.records == {s: record(s) for s in (5, 6, 7)}


def test_without_hashes_a_chunk_in_no_string_is_read_as_a_hash_in_a_second_round(thread):
    keys = thread.keys
    chunk_1 = chunk_hash({1: record(1), 2: record(2)})
    chunk_3 = chunk_hash({3: record(3)})
    first = [
        ("MGET", keys.chunk_manifest(1), keys.chunk_data(1)),
        ("MGET", keys.chunk_manifest(3), keys.chunk_data(3)),
        ("HGET", keys.meta, "gen"),
    ]
    second = [
        ("MGET", keys.chunk_manifest(1), keys.chunk_data(1)),
        ("HMGET", keys.chunk(1), "_m", "d"),
        ("HGET", keys.meta, "gen"),
    ]
    found = drive(
        fetch(thread, Containers(chunks=[1, 3], hashes=False), [("HGET", keys.meta, "gen")]),
        batch(first, reply=[[None, None], [chunk_3[b"_m"], chunk_3[b"d"]], b"4"]),
        batch(second, reply=[[None, None], [chunk_1[b"_m"], chunk_1[b"d"]], b"5"]),
    )
    assert sorted(found.records) == [1, 2, 3]
    # The checks are the second round's: read after every record.
    assert found.checks == [b"5"]


def test_chunk_token_counts_come_with_the_records_when_asked(thread):
    keys = thread.keys
    chunk = chunk_hash({4: b"x" * 10})
    found = drive(
        fetch(thread, Containers(chunks=[4], tokens=True)),
        batch(
            [
                ("MGET", keys.chunk_manifest(4), keys.chunk_data(4)),
                ("HMGET", keys.chunk(4), "_m", "d"),
            ],
            reply=[[None, None], [chunk[b"_m"], chunk[b"d"]]],
        ),
    )
    # A manifest line without a count counts a token per 4 record bytes, rounded up.
    assert found.records == {4: b"x" * 10} and found.tokens == {4: 3}


def test_locate_places_name_the_containers_in_order():
    containers, wanted = Containers.located(
        [b"3", b"-1", b"9", b"0", b"2", b"1", b"5", b"-2", b"12", b"-3"]
    )
    assert wanted == [3, 2, 5, 12] and containers.open
    assert containers.windows == [WindowRead(3, 3, scores=False)]
    assert list(containers.chunks) == [1] and list(containers.legacy) == [5]
    assert not Containers()
