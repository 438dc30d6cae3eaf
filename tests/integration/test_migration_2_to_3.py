"""Layout-2 threads (written by the previous release): read as they are, made layout 3 by their
first write, their window drained into closed layout-3 chunks by bounded steps (each write, or
migrate), correct throughout; and layout-1 threads all the way to layout 3."""

from __future__ import annotations

import threading

from kvstore import AssistantMessage, StoreConfig, UserMessage

from ..conftest import make_sync_store
from ..support.layout_check import check_layout
from ..support.old_release import run_previous
from .test_migration import check_reads, write_layout_1

DATE = "2026-01-02T03:04:05Z"

# The previous release's code that writes `count` messages into thread `tid` (two turns' worth of
# replies, some otids, sizes that vary) and leaves the thread's messages, as it reads them, in
# `result`.
WRITE = """
t = store.thread({tid!r})
for i in range(1, {count} + 1):
    text = "message " + str(i) + " " + "x" * (i * 37 % {spread})
    if i % 2:
        m = UserMessage(content=text, id="message-old-" + str(i), date="{date}",
                        otid=("otid-" + str(i)) if i % 3 == 0 else None)
        t.append(m)
    else:
        t.append(AssistantMessage(content=text, id="message-old-" + str(i), date="{date}"),
                 turn_id="turn-" + str(i // 10))
result = [m.model_dump(mode="json") for m in t.iter()]
"""


def old_thread(server, namespace, tid, count, spread=60, **config) -> list[dict]:
    """A layout-2 thread of `count` messages written by the previous release; its messages."""
    code = WRITE.format(tid=tid, count=count, spread=spread, date=DATE)
    return run_previous(server.url, {"namespace": namespace, **config}, code)


def stored(client, keys) -> dict[int, tuple[bytes, str]]:
    """Every stored message as raw commands find it, wherever it is (the window, a chunk of
    either kind, an oversized message's chunk, the open chunk): sequence -> (record, side info
    without its bytes field's neighbours changed). Asserts no sequence is stored twice."""
    found: dict[int, tuple[bytes, str]] = {}

    def add(sequence: int, record: bytes, side: str) -> None:
        assert sequence not in found, f"sequence {sequence} is stored twice"
        found[sequence] = (record, side)

    sides = {int(k): v.decode() for k, v in client.hgetall(keys.window_side).items()}
    for record, score in client.zrange(keys.window, 0, -1, withscores=True):
        add(int(score), record, sides[int(score)])
    firsts = [int(s) for _, s in client.zrange(keys.chunk_index, 0, -1, withscores=True)]
    firsts += [int(s) for _, s in client.zrange(keys.large_index, 0, -1, withscores=True)]
    pairs = [client.mget(keys.chunk_manifest(f), keys.chunk_data(f)) for f in firsts]
    for first, pair in zip(firsts, pairs, strict=True):
        if pair[0] is None:
            pair = client.hmget(keys.chunk(first), "_m", "d")
        assert pair[0] is not None, f"chunk {first} is listed but missing"
        cut(pair[0], pair[1], add)
    manifest, data = client.mget(keys.open_manifest, keys.open_data)
    if manifest:
        cut(manifest, data, add)
    return found


def cut(manifest: bytes, data: bytes, add) -> None:
    offset = 0
    for line in manifest.decode().split("\n")[:-1]:
        sequence, side = line.split("\t", 1)
        size = int(side.split("\t")[3])
        add(int(sequence), data[offset : offset + size], side)
        offset += size
    assert offset == len(data)


def dumps(messages) -> list[dict]:
    return [m.model_dump(mode="json") for m in messages]


def window_of(raw_client, keys) -> int:
    return raw_client.zcard(keys.window)


def test_a_layout_2_thread_reads_as_it_is_then_drains_one_step_per_write(
    make_thread, raw_client, namespace, server, server_only
):
    config = dict(window_size=8, chunk_size=4, max_chunks_per_call=1)
    written = old_thread(server, namespace, "old", 30, **config)
    thread = make_thread("old", **config)
    assert thread.stats().layout_version == 2
    before = stored(raw_client, thread.keys)
    expected = list(thread.iter())
    assert dumps(expected) == written
    check_reads(thread, expected)
    left = window_of(raw_client, thread.keys)
    assert left >= 8
    chunks = raw_client.zcard(thread.keys.chunk_index)
    writes = 0
    while left:
        expected += thread.append(UserMessage(content=f"new {writes}", id=f"message-new-{writes}"))
        writes += 1
        assert raw_client.hget(thread.keys.meta, "layout") == b"3"
        now = window_of(raw_client, thread.keys)
        assert left - 4 <= now < left  # one chunk of at most chunk_size moved, no more
        left = now
        after = stored(raw_client, thread.keys)
        assert {s: after[s] for s in before} == before  # nothing lost, changed or doubled
        assert len(after) == len(before) + writes
        # The newest pages while a window is left between the open chunk and the drained
        # chunks (the store has seen the thread at layout 3 after the first of them).
        for limit in (3, 7, 3, 7):
            page = thread.list(limit=limit, order="desc")
            assert [m.id for m in page.messages] == [m.id for m in expected[::-1][:limit]]
    check_reads(thread, expected, limits=(1, 7, 50))
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **config))
    assert raw_client.zcard(thread.keys.chunk_index) >= chunks + writes
    assert int(raw_client.hget(thread.keys.meta, "window_bytes") or 0) == 0
    assert not raw_client.exists(thread.keys.window, thread.keys.window_side)
    # The layout-2 hash chunks stay as they are; the drained ones are layout-3 strings.
    first = int(raw_client.zrange(thread.keys.chunk_index, 0, 0, withscores=True)[0][1])
    assert raw_client.type(thread.keys.chunk(first)) == b"hash"
    last_drained = int(raw_client.zrange(thread.keys.chunk_index, -1, -1, withscores=True)[0][1])
    assert raw_client.type(thread.keys.chunk_data(last_drained)) == b"string"
    assert thread.migrate() == 1  # nothing left to do: one call that finds it so
    check_reads(thread, expected)


def test_migrate_drains_a_large_window_in_bounded_calls(
    make_thread, raw_client, namespace, server, server_only
):
    config = dict(window_size=200, chunk_size=8, max_chunks_per_call=2)
    written = old_thread(server, namespace, "wide", 150, **config)
    thread = make_thread("wide", **config)
    before = stored(raw_client, thread.keys)
    assert window_of(raw_client, thread.keys) == 150
    assert thread.migrate(max_calls=1) == 1
    assert window_of(raw_client, thread.keys) == 150 - 16  # two chunks of 8
    assert raw_client.hget(thread.keys.meta, "layout") == b"3"
    assert stored(raw_client, thread.keys) == before
    calls = thread.migrate()
    assert calls == (150 - 16 + 15) // 16
    assert window_of(raw_client, thread.keys) == 0
    assert stored(raw_client, thread.keys) == before
    assert int(raw_client.hget(thread.keys.meta, "window_bytes")) == 0
    assert dumps(thread.iter()) == written
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **config))


def test_a_drain_step_stops_at_the_bytes_cap_and_cuts_at_the_byte_limit(
    make_thread, raw_client, namespace, server, server_only
):
    config = dict(window_size=100, chunk_size=16, chunk_max_bytes=2000, max_chunks_per_call=8)
    written = old_thread(server, namespace, "heavy", 60, spread=900, **config)
    thread = make_thread("heavy", max_bytes_per_call=3000, **config)
    before = stored(raw_client, thread.keys)
    thread.migrate(max_calls=1)
    members = [m.decode().split(":") for m in raw_client.zrange(thread.keys.chunk_index, 0, -1)]
    assert 1 <= len(members) <= 2  # 3000 bytes a call: two chunks of at most 2000 bytes
    assert all(int(m[3]) <= 2000 for m in members)
    thread.migrate()
    assert window_of(raw_client, thread.keys) == 0
    assert stored(raw_client, thread.keys) == before
    assert dumps(thread.iter()) == written
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **config))


def test_a_layout_1_thread_migrates_to_layout_2_then_to_3(make_thread, raw_client, namespace):
    config = dict(window_size=8, chunk_size=4)
    thread = make_thread("older", **config)
    expected = write_layout_1(raw_client, thread.keys, 50, turn=("turn-old", 45))
    legacy = {int(k): v for k, v in raw_client.hgetall(thread.keys.legacy).items()}
    thread.migrate()
    assert raw_client.hget(thread.keys.meta, "layout") == b"3"
    assert not raw_client.exists(thread.keys.legacy)
    first = int(raw_client.zrange(thread.keys.chunk_index, 0, 0, withscores=True)[0][1])
    assert raw_client.type(thread.keys.chunk_data(first)) == b"string"
    records = stored(raw_client, thread.keys)
    assert sorted(records) == list(range(1, 51))
    assert {s: record for s, (record, _) in records.items()} == legacy
    check_reads(thread, expected)
    expected += thread.append(AssistantMessage(content="after"), turn_id="turn-old")
    check_reads(thread, expected)
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **config))


def test_the_migration_under_concurrent_appends_from_several_workers(
    backend, raw_client, namespace, server, server_only
):
    """Four workers (a store and a thread each) append and take migrate steps while another
    runs the migration to its end: every message is stored once, the old ones unchanged."""
    config = dict(window_size=40, chunk_size=4, max_chunks_per_call=1)
    written = old_thread(server, namespace, "busy", 60, **config)
    stores = [
        make_sync_store(backend, StoreConfig(namespace=namespace, **config)) for _ in range(5)
    ]
    workers = [store.thread("busy") for store in stores[:4]]
    before = stored(raw_client, workers[0].keys)
    added: list[list] = [[] for _ in workers]

    def work(n: int) -> None:
        for i in range(15):
            added[n] += workers[n].append(UserMessage(content=f"w{n}-{i}", id=f"message-w{n}-{i}"))
            if i % 5 == 0:
                workers[n].migrate(max_calls=1)

    runs = [threading.Thread(target=work, args=(n,)) for n in range(len(workers))]
    for run in runs:
        run.start()
    stores[4].thread("busy").migrate()  # meanwhile, to the end
    for run in runs:
        run.join()
    for store in stores:
        store.close()
    final = make_sync_store(backend, StoreConfig(namespace=namespace, **config))
    try:
        thread = final.thread("busy")
        thread.migrate()
        assert window_of(raw_client, thread.keys) == 0
        after = stored(raw_client, thread.keys)
        assert {s: after[s] for s in before} == before
        assert sorted(after) == list(range(1, 60 + 4 * 15 + 1))
        check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **config))
        kept = list(thread.iter())
    finally:
        final.close()
    assert dumps(kept[:60]) == written
    new = {m.id: m for batch in added for m in batch}
    assert {m.id: m for m in kept[60:]} == new and len(kept) == 60 + len(new)


def test_retention_keeps_every_chunk_newer_than_a_window_message(
    make_thread, raw_client, namespace, server, server_only
):
    """While the window drains, chunks closed from the open chunk are newer than it: a summary
    covering them does not let retention delete them before the window's messages."""
    config = dict(window_size=40, chunk_size=4, max_chunks_per_call=1, retained_message_limit=0)
    old_thread(server, namespace, "kept", 44, **config)
    thread = make_thread("kept", **config)
    expected = list(thread.iter())
    for i in range(6):  # each moves one chunk of 4 from the window: 24 of its 40 or more
        expected += thread.append(UserMessage(content=f"new {i}", id=f"message-new-{i}"))
    assert window_of(raw_client, thread.keys) > 0
    assert raw_client.zcard(thread.keys.chunk_index) > 0
    before = stored(raw_client, thread.keys)
    thread.compact("everything so far", expected[-1].seq_id)  # (a drain step first)
    oldest_in_window = int(raw_client.zrange(thread.keys.window, 0, 0, withscores=True)[0][1])
    deleted_before = int(raw_client.hget(thread.keys.meta, "deleted_before") or 0)
    # The chunk closed from the open chunk (45 to 48) is newer than the window: it stays.
    assert 0 < deleted_before <= oldest_in_window
    after = stored(raw_client, thread.keys)
    assert {s: after[s] for s in before if s >= deleted_before} == {
        s: v for s, v in before.items() if s >= deleted_before
    }
    assert all(s >= deleted_before for s in after)
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **config))
    kept = list(thread.iter())
    assert [m.seq_id for m in kept][:-1] == [
        m.seq_id for m in expected if m.seq_id >= deleted_before
    ]


def test_a_layout_1_thread_the_previous_release_was_migrating_ends_in_layout_3(
    make_thread, raw_client, namespace, server, server_only
):
    """The previous release's writes moved part of a layout-1 thread into chunks and put their
    own messages in a window: this release finishes the legacy hash, then drains the window."""
    config = dict(window_size=8, chunk_size=4, max_chunks_per_call=1)
    thread = make_thread("halfway", **config)
    write_layout_1(raw_client, thread.keys, 80)
    code = """
t = store.thread("halfway")
for i in range(12):
    t.append(UserMessage(content="old worker " + str(i), id="message-w-" + str(i), date="{date}"))
result = [m.model_dump(mode="json") for m in t.iter()]
""".replace("{date}", DATE)
    written = run_previous(server.url, {"namespace": namespace, **config}, code)
    assert len(written) == 92
    assert raw_client.hget(thread.keys.meta, "layout") == b"1"
    assert raw_client.exists(thread.keys.legacy) and raw_client.zcard(thread.keys.window) > 0
    legacy = {int(k): v for k, v in raw_client.hgetall(thread.keys.legacy).items()}
    before = stored(raw_client, thread.keys)
    assert dumps(thread.iter()) == written
    thread.migrate()
    assert raw_client.hget(thread.keys.meta, "layout") == b"3"
    assert not raw_client.exists(thread.keys.legacy, thread.keys.window, thread.keys.window_side)
    after = stored(raw_client, thread.keys)
    assert sorted(after) == list(range(1, 93))
    assert {s: after[s] for s in before} == before
    assert {s: after[s][0] for s in legacy} == legacy
    assert dumps(thread.iter()) == written
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **config))


def test_kvstore_migrate_finds_layout_1_and_2_threads_and_finishes_them(
    make_thread, raw_client, namespace, server, server_only
):
    from .test_cli import kvstore

    config = dict(window_size=8, chunk_size=4)
    written = old_thread(server, namespace, "two", 30, **config)
    one = write_layout_1(raw_client, make_thread("one", **config).keys, 30)
    make_thread("three", **config).append(UserMessage(content="already layout 3"))
    result = kvstore("migrate", "--url", server.url, "--namespace", namespace)
    assert result.returncode == 0, result.stderr
    assert "migrated 2 threads to layout 3" in result.stdout
    for tid in ("one", "two", "three"):
        keys = make_thread(tid, **config).keys
        assert raw_client.hget(keys.meta, "layout") == b"3"
        assert not raw_client.exists(keys.legacy, keys.window, keys.window_side)
    assert dumps(make_thread("two", **config).iter()) == written
    assert list(make_thread("one", **config).iter()) == one
    result = kvstore("migrate", "--url", server.url, "--namespace", namespace)
    assert "no threads to migrate" in result.stdout
    result = kvstore(
        "migrate", "one", "two", "three", "--url", server.url, "--namespace", namespace
    )
    assert "migrated 0 threads to layout 3 (3 already in layout 3)" in result.stdout
