"""Idle expiry follows the server's clock: a client whose clock is off sets the same deadlines as
one whose clock is right (issue #11, item 8). Checked with PTTL and PEXPIRETIME of every key, not
with sleeps."""

from __future__ import annotations

import time

import pytest

from kvstore import UserMessage

from ..support.layout_check import to_hash_chunk
from .test_migration_2_to_3 import old_thread

SMALL = dict(window_size=4, chunk_size=2, chunk_max_bytes=2048)
TTL_MS = 60_000


def expiries(client, namespace: str) -> dict[bytes, tuple[int, int]]:
    """(PTTL, PEXPIRETIME) of every key of the namespace."""
    return {
        key: (client.pttl(key), client.pexpiretime(key))
        for key in client.scan_iter(match=f"{namespace}:*", count=1000)
    }


def assert_one_deadline(client, namespace: str, low_ms: int, high_ms: int) -> int:
    """Every key carries the same absolute deadline, `low_ms` to `high_ms` from now."""
    times = expiries(client, namespace)
    assert len(times) >= 8, times  # fixed keys, chunks and an oversized message's chunk
    assert len({deadline for _, deadline in times.values()}) == 1, times
    assert all(low_ms < left <= high_ms for left, _ in times.values()), times
    return next(iter(times.values()))[1]


def expire_all_at(client, namespace: str, deadline_ms: int) -> None:
    for key in client.scan_iter(match=f"{namespace}:*", count=1000):
        client.pexpireat(key, deadline_ms)


def server_ms(client) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


@pytest.mark.parametrize("skew_s", [-120, 120], ids=["clock-behind", "clock-ahead"])
def test_thread_ttl_follows_the_servers_clock(
    make_thread, raw_client, namespace, server_only, monkeypatch, skew_s
):
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + skew_s)  # this process only
    thread = make_thread(thread_ttl=TTL_MS // 1000, **SMALL)
    thread.append([UserMessage(content=f"m{i} " + "x" * 200) for i in range(12)])
    thread.append(UserMessage(content="O" * 5000))  # an oversized message: a chunk of its own
    thread.start_turn("t")
    # The thread lives between ttl and 1.5 ttl after its last write.
    assert_one_deadline(raw_client, namespace, TTL_MS - 5_000, TTL_MS * 3 // 2)

    # Less than ttl left (as if 40 s had passed): the next write moves every key's deadline.
    expire_all_at(raw_client, namespace, server_ms(raw_client) + 50_000)
    thread.append([UserMessage(content=f"n{i} " + "x" * 200) for i in range(4)])
    assert_one_deadline(raw_client, namespace, TTL_MS * 3 // 2 - 5_000, TTL_MS * 3 // 2)

    # More than ttl left: a write keeps the deadline, and a chunk it writes gets the same one.
    deadline = server_ms(raw_client) + 70_000
    expire_all_at(raw_client, namespace, deadline)
    chunks = raw_client.zcard(thread.keys.chunk_index)
    thread.append([UserMessage(content=f"p{i} " + "x" * 200) for i in range(4)])
    assert raw_client.zcard(thread.keys.chunk_index) > chunks
    assert assert_one_deadline(raw_client, namespace, 60_000, 70_000) == deadline


def test_every_chunk_of_either_kind_keeps_the_threads_deadline(
    make_thread, raw_client, namespace, server_only
):
    """A chunk closed by COPY carries the open chunk's deadline; the pass that moves the deadline
    reaches a layout-2 hash chunk (a thread migrated from layout 2) as well as the strings."""
    thread = make_thread(thread_ttl=TTL_MS // 1000, **SMALL)
    for i in range(9):  # one message a call: each close copies the open chunk the server holds
        thread.append(UserMessage(content=f"m{i} " + "x" * 200))
    assert raw_client.zcard(thread.keys.chunk_index) >= 3
    assert raw_client.exists(thread.keys.open_data)
    assert_one_deadline(raw_client, namespace, TTL_MS - 5_000, TTL_MS * 3 // 2)
    to_hash_chunk(raw_client, thread.keys, 1)
    assert raw_client.type(thread.keys.chunk(1)) == b"hash"
    # More than ttl left: the closes keep the deadline.
    deadline = server_ms(raw_client) + 70_000
    expire_all_at(raw_client, namespace, deadline)
    for i in range(3):
        thread.append(UserMessage(content=f"n{i} " + "x" * 200))
    assert assert_one_deadline(raw_client, namespace, 60_000, 70_000) == deadline
    # Less than ttl left: the next write moves every key's deadline, the hash chunk's too.
    expire_all_at(raw_client, namespace, server_ms(raw_client) + 50_000)
    thread.append(UserMessage(content="moves the deadline"))
    assert_one_deadline(raw_client, namespace, TTL_MS * 3 // 2 - 5_000, TTL_MS * 3 // 2)


def test_a_store_without_a_ttl_writing_a_thread_with_one_keeps_its_deadline_on_every_key(
    make_thread, raw_client, namespace, server_only
):
    """A tool or a worker of a rolling config change without thread_ttl, writing a thread that
    has one: it neither sets nor clears the deadline, and every key it makes carries it, or
    they would outlive the thread and leave its id unusable."""
    with_ttl = make_thread(thread_ttl=TTL_MS // 1000, **SMALL)
    with_ttl.append(UserMessage(content="from the app"))
    deadline = raw_client.pexpiretime(with_ttl.keys.meta)
    assert deadline > 0
    # Every path a write may take: single appends opening and closing chunks (with otids), a
    # batch, an oversized message, a turn, a compaction, an edit.
    without = make_thread(**SMALL)
    for i in range(7):
        without.append(UserMessage(content=f"m{i} " + "x" * 200, otid=f"o-{i}"))
    without.append([UserMessage(content=f"b{i} " + "x" * 200) for i in range(5)])
    without.append(UserMessage(content="O" * 5000))
    without.start_turn("t")
    without.append(UserMessage(content="in the turn"), turn_id="t")
    without.finish_turn("t")
    stored = without.append(UserMessage(content="to be edited"))
    without.replace(stored[0].id, UserMessage(content="edited " + "y" * 300))
    without.compact("a summary", last_sequence=10)
    assert raw_client.zcard(with_ttl.keys.chunk_index) >= 3
    assert assert_one_deadline(raw_client, namespace, 0, TTL_MS * 3 // 2) == deadline


def test_a_thread_given_its_deadline_before_meta_said_so_keeps_it_on_every_key(
    make_thread, raw_client, namespace, server, server_only
):
    """A thread whose deadline an earlier release set (meta without `expires`: the previous
    release's layout-2 thread, or a layout-3 one from before the field), then written by a store
    without a ttl: every key those writes make carries the thread's deadline, so it expires
    whole and its id can be used again."""
    old_thread(server, namespace, "old", 20, thread_ttl=TTL_MS // 1000, **SMALL)
    with_ttl = make_thread("new", thread_ttl=TTL_MS // 1000, **SMALL)
    with_ttl.append(UserMessage(content="from the app"))
    raw_client.hdel(with_ttl.keys.meta, "expires")
    for tid in ("old", "new"):
        meta = f"{namespace}:{{{tid}}}:meta"
        assert raw_client.hget(meta, "expires") is None
        deadline = raw_client.pexpiretime(meta)
        without = make_thread(tid, **SMALL)
        for i in range(12):  # single appends that open and close chunks, with otids
            without.append(UserMessage(content=f"m{i} " + "x" * 200, otid=f"o-{i}"))
        without.append([UserMessage(content=f"b{i} " + "x" * 200) for i in range(5)])
        keys = list(raw_client.scan_iter(match=f"{namespace}:{{{tid}}}:*", count=1000))
        assert len(keys) >= 8
        assert {key: raw_client.pexpiretime(key) for key in keys} == dict.fromkeys(keys, deadline)
