"""The open chunk stays bounded whatever the batch size: it closes by count (chunk_size) and by
bytes (before a record would take it past min(chunk_max_bytes, 65520), or where it fills an
allocator size class), on the server, into a chunk key that is never overwritten; the layout-2
window takes no new message."""

from __future__ import annotations

import random

import pytest

from kvstore import StoreConfig, UserMessage, errors

from ..support.layout_check import check_layout, read_layout
from .test_migration import check_reads, write_layout_1

DEFAULT = StoreConfig()
CAP = DEFAULT.max_chunks_per_call * DEFAULT.chunk_size  # what a migration step moves


def batch(tag: str, count: int) -> list[UserMessage]:
    return [UserMessage(content=f"{tag}.{i}") for i in range(count)]


def open_chunk(raw_client, keys) -> tuple[int, int]:
    """The open chunk's count and bytes, as meta frames them."""
    count, nbytes = raw_client.hmget(keys.meta, "open_count", "open_bytes")
    return int(count or 0), int(nbytes or 0)


def assert_bounded(raw_client, keys, config: StoreConfig) -> None:
    """The open chunk within its bounds, the window empty."""
    count, nbytes = open_chunk(raw_client, keys)
    assert 0 < count <= config.chunk_size, count
    assert count == 1 or nbytes <= min(config.chunk_max_bytes, 65520), (count, nbytes)
    assert raw_client.zcard(keys.window) == raw_client.hlen(keys.window_side) == 0


def test_batches_of_500_keep_the_open_chunk_bounded(make_thread, raw_client, namespace):
    thread = make_thread()
    config = StoreConfig(namespace=namespace)
    stored = 0
    for step in range(60):
        stored += len(thread.append(batch(str(step), 500)))
        assert_bounded(raw_client, thread.keys, config)
        if step % 20 == 19:
            check_layout(raw_client, thread.keys, config)
    assert thread.stats().stored_messages == stored == 30_000
    assert [m.seq_id for m in thread.list(limit=3, order="desc").messages] == [
        30_000,
        29_999,
        29_998,
    ]


def test_chunks_close_by_count_and_by_bytes(make_thread, raw_client, namespace):
    small = dict(window_size=8, chunk_size=4, chunk_max_bytes=2048, max_bytes_per_call=2048)
    thread = make_thread(**small)
    config = StoreConfig(namespace=namespace, **small)
    rng = random.Random(11)
    expected = []
    for step in range(20):
        sizes = [rng.choice([10, 300, 700, 1500]) for _ in range(rng.randint(50, 150))]
        expected += thread.append(
            [UserMessage(content=f"{step}.{i} " + "x" * n) for i, n in enumerate(sizes)]
        )
        assert_bounded(raw_client, thread.keys, config)
        layout = check_layout(raw_client, thread.keys, config)
    # Each chunk closed because it was full, or because the next record would take it past
    # the cap: by count, or by bytes.
    chunks = [layout.chunks[first] for first in sorted(layout.chunks)]
    following = [*chunks[1:], layout.open]
    by_count = by_bytes = 0
    for records, after in zip(chunks, following, strict=True):
        nbytes = sum(map(len, records.values()))
        if len(records) == config.chunk_size:
            by_count += 1
        else:
            assert nbytes + len(after[min(after)]) > config.chunk_max_bytes, (records, after)
            by_bytes += 1
    assert by_count and by_bytes
    assert list(thread.iter()) == expected


def test_a_chunk_key_is_never_overwritten(make_thread, raw_client, namespace):
    """COPY does not overwrite (it replies 0): an append that would close the open chunk onto a
    key that exists is refused before it writes anything."""
    small = dict(window_size=8, chunk_size=4, chunk_max_bytes=2048)
    thread = make_thread(**small)
    expected = thread.append(batch("a", 4))
    taken = thread.keys.chunk_data(1)
    raw_client.set(taken, b"not kvstore's")
    before = read_layout(raw_client, thread.keys)
    with pytest.raises(errors.LayoutError):
        thread.append(UserMessage(content="the fifth closes the open chunk"))
    assert raw_client.get(taken) == b"not kvstore's"
    after = read_layout(raw_client, thread.keys)
    assert (after.open, after.chunks, after.meta) == (before.open, before.chunks, before.meta)
    raw_client.delete(taken)
    expected += thread.append(UserMessage(content="now it closes"))
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **small))
    assert list(thread.iter()) == expected


def test_a_thread_after_big_batches_keeps_its_open_chunk_bounded(
    make_thread, raw_client, namespace
):
    thread = make_thread()
    config = StoreConfig(namespace=namespace)
    expected = []
    for step in range(2):
        expected += thread.append(batch(f"old{step}", 500))
        assert_bounded(raw_client, thread.keys, config)
    for i in range(40):
        expected += thread.append(UserMessage(content=f"single {i}"))
        assert_bounded(raw_client, thread.keys, config)
    check_layout(raw_client, thread.keys, config)
    assert list(thread.iter()) == expected


def test_a_layout_1_thread_receiving_batches_while_it_migrates(make_thread, raw_client, namespace):
    thread = make_thread()
    expected = write_layout_1(raw_client, thread.keys, 1500)
    legacy = 1500
    while thread.stats().layout_version == 1:
        expected += thread.append(batch(f"b{len(expected)}", 500))
        assert raw_client.zcard(thread.keys.window) == 0
        # The migration goes on at its own pace.
        now = raw_client.hlen(thread.keys.legacy)
        assert now == max(0, legacy - CAP)
        legacy = now
    assert not raw_client.exists(thread.keys.legacy)
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace))
    check_reads(thread, expected, limits=(1, 50, 200))


def test_retention_while_migrating_keeps_what_is_not_moved(make_thread, raw_client, namespace):
    # New messages close into chunks newer than the legacy part; retention must not delete
    # past the part already moved.
    thread = make_thread(retained_message_limit=10)
    expected = write_layout_1(raw_client, thread.keys, 1000)
    for step in range(2):
        expected += thread.append(batch(f"b{step}", 500))
    assert raw_client.hlen(thread.keys.legacy) > 0
    summary = thread.compact("everything so far", last_sequence=expected[-1].seq_id)
    moved = int(raw_client.hget(thread.keys.meta, "migrated") or 1000)
    deleted_before = int(raw_client.hget(thread.keys.meta, "deleted_before"))
    assert deleted_before <= moved + 1
    kept = [m for m in expected if m.seq_id >= deleted_before] + [summary]
    assert list(thread.iter()) == kept
    thread.migrate()
    assert list(thread.iter()) == kept
    assert thread.stats().stored_messages == len(kept)
    check_layout(
        raw_client, thread.keys, StoreConfig(namespace=namespace, retained_message_limit=10)
    )


def chunk_data_sizes(raw_client, keys) -> list[int]:
    return [
        raw_client.strlen(keys.chunk_data(int(score)))
        for _, score in raw_client.zrange(keys.chunk_index, 0, -1, withscores=True)
    ]


def size_class(size: int) -> int:
    """jemalloc's size class of an allocation of `size` bytes, from 16 KiB up: four per power
    of two."""
    step = 1 << (max(size - 1, 1).bit_length() - 3)
    return -(-size // step) * step


def test_a_chunk_of_large_records_ends_where_its_data_fills_a_size_class(
    make_thread, raw_client, namespace
):
    # Records of ~1.1 KB: each chunk closes where its data (and the string's 16 bytes of header)
    # fills its size class to within one record, never a record into the next class.
    thread = make_thread()
    stored = thread.append([UserMessage(content=f"{i:04d} " + "x" * 995) for i in range(400)])
    stats = thread.stats()
    record = stats.stored_bytes // stats.stored_messages
    sizes = chunk_data_sizes(raw_client, thread.keys)
    assert len(sizes) >= 6
    assert all(size_class(s + 16) - record < s + 16 <= size_class(s + 16) for s in sizes), (
        record,
        sizes,
    )
    assert all(s <= 65520 for s in sizes)
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace))
    assert list(thread.iter()) == stored
    assert thread.get(stored[100].id) == stored[100]


def test_a_chunk_under_16_kib_keeps_chunk_size_messages(make_thread, raw_client):
    # 64 records of ~225 bytes: 14.4 KB of data, under the sizes whose classes are fitted.
    thread = make_thread()
    thread.append([UserMessage(content=f"{i:04d} " + "x" * 100) for i in range(500)])
    counts = [
        int(member.split(b":")[2]) for member in raw_client.zrange(thread.keys.chunk_index, 0, -1)
    ]
    assert counts and set(counts) == {DEFAULT.chunk_size}
    assert max(chunk_data_sizes(raw_client, thread.keys)) < 16 * 1024


def test_a_chunk_index_entry_counts_the_inline_media_its_messages_carry(
    make_thread, raw_client, namespace
):
    """The index member's media is the sum of its messages' (retention and the budget read it)."""
    from .test_lifecycle import image

    config = StoreConfig(namespace=namespace, window_size=4, chunk_size=3)
    thread = make_thread("media", window_size=4, chunk_size=3)
    sizes = [0, 1000, 0, 70, 123456, 0, 5, 0, 0, 2048, 9, 0]
    for i, size in enumerate(sizes):
        content = [{"type": "text", "text": f"m{i}"}] + ([image(size)] if size else [])
        thread.append(UserMessage(content=content))
    layout = check_layout(raw_client, thread.keys, config)
    assert layout.chunks, "nothing closed into a chunk"
    from kvstore._engine.layout.formats import ChunkEntry

    entries = [ChunkEntry.parse(m) for m in raw_client.zrange(thread.keys.chunk_index, 0, -1)]
    assert [e.media for e in entries] == [sum(sizes[e.first - 1 : e.last]) for e in entries]
    assert any(e.media > 0 for e in entries)
