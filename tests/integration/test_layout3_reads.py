"""Reads of a layout-3 thread (docs/LAYOUT.md) on a real server: pages straddling the open chunk
and closed chunks, and a thread migrated from layout 2 holding layout-2 hash chunks, layout-3
string chunks, a window leftover, oversized messages (one inside the open chunk's span) and the
open chunk. Every page, every get and the one-step read agree with a plain model."""

from __future__ import annotations

import pytest

from kvstore import StoreConfig, UserMessage
from kvstore._engine.core import Batch, Eval, ThreadRef, list_page
from kvstore._engine.executor import send_request
from kvstore._engine.reads import fetch_sequences, read_range
from kvstore._engine.record import encode_record

from ..conftest import make_sync_store
from ..support import model

DATE = "2024-05-01T12:00:00Z"


def drive(store, operation):
    """Runs a core operation like the store does; returns its result and the requests it sent."""
    requests = []
    request = next(operation)
    try:
        while True:
            requests.append(request)
            request = operation.send(send_request(store, request))
    except StopIteration as done:
        return done.value, requests


def every_page_agrees(thread, sequences: list[int]) -> None:
    """Every page from every cursor (sequence and id), both orders, several limits, matches the
    model of the kept `sequences`."""
    cursors = [None, 0, *sequences, max(sequences) + 1]
    for limit in (1, 2, 3, 5, 7, 50):
        for order in ("asc", "desc"):
            for cursor in cursors:
                for side in ("after", "before"):
                    case = (cursor, limit, order, side)
                    kwargs = {} if cursor is None else {side: cursor}
                    page = thread.list(limit=limit, order=order, **kwargs)
                    after = cursor if side == "after" else None
                    before = cursor if side == "before" else None
                    want, more = model.page(sequences, after, before, limit, order)
                    assert [m.seq_id for m in page.messages] == want, case
                    assert page.has_more == more, case
                    if cursor in sequences:
                        by_id = thread.list(limit=limit, order=order, **{side: f"m{cursor}"})
                        assert by_id == page, case


# ------------------------------------------------------------------ written by this version


@pytest.mark.parametrize("total", [5, 20, 37])
def test_pages_straddle_the_open_chunk_and_closed_chunks(backend, namespace, total):
    config = StoreConfig(namespace=namespace, chunk_size=8)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    for seq in range(1, total + 1):
        thread.append(UserMessage(id=f"m{seq}", content=f"message {seq} " + "x" * (seq * 7)))
    keys = ThreadRef.of(config, "t").keys
    raw = store.client
    assert raw.hget(keys.meta, "layout") == b"3"
    assert raw.exists(keys.open_data) and raw.zcard(keys.chunk_index) == (total - 1) // 8
    every_page_agrees(thread, list(range(1, total + 1)))
    for seq in range(1, total + 1):
        assert thread.get(f"m{seq}").seq_id == seq
    store.close()


def test_the_newest_page_takes_one_round_trip_from_the_open_chunk_two_with_a_closed_one(
    backend, namespace
):
    config = StoreConfig(namespace=namespace, chunk_size=8)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([UserMessage(content=f"m{i}") for i in range(20)])  # chunks 1-8, 9-16; 17-20
    ref = ThreadRef.of(config, "t")
    page, requests = drive(store, list_page(ref, limit=3, order="desc"))
    assert [m.seq_id for m in page.messages] == [20, 19, 18] and page.has_more
    assert len(requests) == 1
    page, requests = drive(store, list_page(ref, limit=6, order="desc"))
    assert [m.seq_id for m in page.messages] == [20, 19, 18, 17, 16, 15] and page.has_more
    assert len(requests) == 2 and all(isinstance(r, Batch) for r in requests)
    store.close()


def reads_chunk(request, ref, first: int) -> bool:
    """Whether a request reads closed chunk `first`'s two strings in one MGET (the open
    chunk's, read beside them, or alone)."""
    keys = (ref.keys.chunk_manifest(first), ref.keys.chunk_data(first))
    return any(
        command[0] == "MGET" and keys in zip(command[1::2], command[2::2], strict=True)
        for command in request.commands
    )


def test_the_next_newest_page_reads_the_closed_chunk_ahead_in_one_round_trip(backend, namespace):
    config = StoreConfig(namespace=namespace, chunk_size=8)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([UserMessage(content=f"m{i}") for i in range(20)])  # chunks 1-8, 9-16; 17-20
    ref = ThreadRef.of(config, "t")
    page, requests = drive(store, list_page(ref, limit=6, order="desc"))
    assert len(requests) == 2  # the first read of this handle learns the chunk it needs
    again, requests = drive(store, list_page(ref, limit=6, order="desc"))
    assert again == page and len(requests) == 1
    assert reads_chunk(requests[0], ref, 9)
    # The open chunk fills: the same chunk is read ahead, one round trip still.
    thread.append([UserMessage(content="m20")])
    page, requests = drive(store, list_page(ref, limit=6, order="desc"))
    assert [m.seq_id for m in page.messages] == [21, 20, 19, 18, 17, 16] and len(requests) == 1
    store.close()


def test_a_short_newest_read_keeps_the_hint_and_reads_no_chunk_ahead(backend, namespace):
    """An append's look at the tail (a page the open chunk answers) between two long pages: it
    reads no closed chunk, and the next long page is still one round trip."""
    config = StoreConfig(namespace=namespace, chunk_size=8)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([UserMessage(content=f"m{i}") for i in range(20)])  # chunks 1-8, 9-16; 17-20
    ref = ThreadRef.of(config, "t")
    page, requests = drive(store, list_page(ref, limit=6, order="desc"))
    assert len(requests) == 2
    for limit in (1, 3):  # the open chunk holds 4: no chunk read ahead
        short, requests = drive(store, list_page(ref, limit=limit, order="desc"))
        assert short.messages == page.messages[:limit] and len(requests) == 1
        assert not reads_chunk(requests[0], ref, 9)
    again, requests = drive(store, list_page(ref, limit=6, order="desc"))
    assert again == page and len(requests) == 1 and reads_chunk(requests[0], ref, 9)
    store.close()


@pytest.mark.parametrize("change", ["close", "replace", "retention", "enough", "delete"])
def test_a_page_read_ahead_is_the_page_a_fresh_handle_reads(backend, namespace, change):
    """Whatever happened since the hint was left, the page is what a handle without one reads."""
    config = StoreConfig(namespace=namespace, chunk_size=8, retained_message_limit=4)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([UserMessage(id=f"m{i}", content=f"m{i}") for i in range(1, 21)])
    ref = ThreadRef.of(config, "t")
    drive(store, list_page(ref, limit=6, order="desc"))  # leaves the hint: chunk 9
    if change == "close":  # the open chunk closes: chunk 17 is now the newest closed one
        thread.append([UserMessage(content=f"n{i}") for i in range(6)])
    elif change == "replace":  # the chunk read ahead changes
        thread.replace("m16", UserMessage(content="replaced " * 20))
    elif change == "retention":  # retention deletes the chunks the summary covers
        thread.compact("summary", last_sequence=16)
    elif change == "enough":  # the open chunk alone holds the page now
        thread.append([UserMessage(content=f"n{i}") for i in range(3)])
    else:
        thread.delete()
        thread.append([UserMessage(content=f"n{i}") for i in range(3)])
    for limit in (1, 3, 6, 7, 12):
        page, _ = drive(store, list_page(ref, limit=limit, order="desc"))
        fresh, _ = drive(store, list_page(ThreadRef.of(config, "t"), limit=limit, order="desc"))
        assert page == fresh, limit
        assert page == thread.list(limit=limit, order="desc"), limit
    store.close()


def test_an_oversized_message_among_the_newest_is_read_through_the_plan(backend, namespace):
    config = StoreConfig(namespace=namespace, chunk_size=8, chunk_max_bytes=2048)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([UserMessage(id=f"m{i}", content=f"m{i}") for i in range(1, 11)])
    thread.append(UserMessage(id="m11", content="y" * 5000))  # its own chunk
    thread.append([UserMessage(id=f"m{i}", content=f"m{i}") for i in range(12, 15)])
    every_page_agrees(thread, list(range(1, 15)))
    assert thread.get("m11").content == "y" * 5000
    store.close()


# ------------------------------------------------------------------ migrated from layout 2


def _record(seq: int) -> bytes:
    return encode_record(UserMessage(id=f"m{seq}", content=f"message {seq}", date=DATE))


def _side(seq: int) -> bytes:
    return f"m{seq}\t\t0\t{len(_record(seq))}\t\t{seq}".encode()


def _manifest(sequences) -> bytes:
    return b"".join(b"%d\t%s\n" % (s, _side(s)) for s in sequences)


def _data(sequences) -> bytes:
    return b"".join(_record(s) for s in sequences)


def _member(sequences) -> str:
    size = sum(len(_record(s)) for s in sequences)
    return f"{min(sequences)}:{max(sequences)}:{len(sequences)}:{size}:0:{sum(sequences)}"


# Hash chunk 1-4 (layout 2); string chunk 5-8 without 6 (removed); the window 9-11 (layout 2's
# leftover); 12 oversized (a string chunk of its own); string chunk 13-15 (closed from the open
# chunk); the open chunk 16, 17, 19, 20 with 18 oversized inside its span.
HASHED, DRAINED, WINDOW, CLOSED = [1, 2, 3, 4], [5, 7, 8], [9, 10, 11], [13, 14, 15]
OPEN = [16, 17, 19, 20]
LARGE = [12, 18]
KEPT = sorted([*HASHED, *DRAINED, *WINDOW, *CLOSED, *OPEN, *LARGE])


def craft_migrated(raw, keys) -> None:
    raw.hset(keys.chunk(1), mapping={"_m": _manifest(HASHED), "d": _data(HASHED)})
    for first, sequences in ((5, DRAINED), (13, CLOSED), *((s, [s]) for s in LARGE)):
        raw.set(keys.chunk_manifest(first), _manifest(sequences))
        raw.set(keys.chunk_data(first), _data(sequences))
    raw.zadd(keys.chunk_index, {_member(s): s[0] for s in (HASHED, [5, 6, 7, 8], CLOSED)})
    # Chunk 5's member spans 5-8 and counts 3: 6 was removed.
    raw.zrem(keys.chunk_index, _member([5, 6, 7, 8]))
    raw.zadd(keys.chunk_index, {f"5:8:3:{len(_data(DRAINED))}:0:20": 5})
    raw.zadd(keys.large_index, {f"{s}:{len(_record(s))}:0:{s}": s for s in LARGE})
    raw.zadd(keys.window, {_record(s): s for s in WINDOW})
    raw.hset(keys.window_side, mapping={s: _side(s) for s in WINDOW})
    raw.set(keys.open_manifest, _manifest(OPEN))
    raw.set(keys.open_data, _data(OPEN))
    raw.hset(keys.ids, mapping={f"m{s}": s for s in KEPT})
    raw.hset(
        keys.meta,
        mapping={
            "layout": "3",
            "last_seq": 20,
            "stored": len(KEPT),
            "bytes": sum(len(_record(s)) for s in KEPT),
            "window_bytes": len(_data(WINDOW)),
            "media": 0,
            "tokens": sum(KEPT),
            "gen": 3,
            "open_first": 16,
            "open_last": 20,
            "open_count": 4,
            "open_bytes": len(_data(OPEN)),
            "open_media": 0,
            "open_tokens": sum(OPEN),
            "open_manifest_bytes": len(_manifest(OPEN)),
        },
    )


@pytest.fixture
def migrated(backend, namespace):
    config = StoreConfig(namespace=namespace, chunk_size=8)
    store = make_sync_store(backend, config)
    ref = ThreadRef.of(config, "t")
    craft_migrated(store.client, ref.keys)
    yield store, ref
    store.close()


def test_a_migrated_thread_pages_through_every_kind_of_container(migrated):
    store, _ = migrated
    every_page_agrees(store.thread("t"), KEPT)


def test_a_migrated_thread_gets_every_message_where_it_is(migrated):
    store, ref = migrated
    thread = store.thread("t")
    for seq in KEPT:
        message = thread.get(f"m{seq}")
        assert (message.seq_id, message.content) == (seq, f"message {seq}")
    found, _ = drive(store, fetch_sequences(ref, [20, 1, 6, 12, 9, 18, 14, 5], missing_ok=True))
    assert [m.seq_id for m in found] == [20, 1, 12, 9, 18, 14, 5]


@pytest.mark.parametrize("walk", ["up", "down"])
@pytest.mark.parametrize("need", [0, 1, 4, 9, 30])
def test_the_one_step_read_walks_every_kind_of_container(migrated, walk, need):
    store, ref = migrated
    read, requests = drive(store, read_range(ref, ("", ""), ("", ""), walk, need))
    assert len(requests) == 1 and isinstance(requests[0], Eval)
    sequences = [s for s, _, _ in read.records]
    ordered = KEPT if walk == "up" else KEPT[::-1]
    # Whole containers, in walk order: at least what the walk needs, a prefix of the range.
    assert sequences[: len(sequences)] == ordered[: len(sequences)]
    assert len(sequences) >= min(need or len(KEPT), len(KEPT))
    assert {s: r for s, r, _ in read.records} == {s: _record(s) for s in sequences}
    assert all(t == s for s, _, t in read.records)  # the stored counts, from every side info


def test_a_migrated_thread_is_planned_by_the_script_from_an_id_cursor(migrated):
    store, ref = migrated
    page, requests = drive(store, list_page(ref, after="m9", limit=9))
    assert [m.seq_id for m in page.messages] == [10, 11, 12, 13, 14, 15, 16, 17, 18]
    assert page.has_more
    assert isinstance(requests[0], Eval) and requests[0].script.name == "page_plan"


def test_inspect_shows_the_open_chunk_and_stats_count_it_in_the_window(backend, namespace):
    from io import StringIO

    from kvstore.cli.commands import inspect

    config = StoreConfig(namespace=namespace, chunk_size=8)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([UserMessage(content=f"m{i}") for i in range(20)])  # chunks 1-8, 9-16; 17-20
    stats = thread.stats()
    assert (stats.window_messages, stats.chunks, stats.stored_messages) == (4, 2, 20)
    out = StringIO()
    inspect(store, "t", out=out)
    assert "  open chunk        4 messages, 17..20," in out.getvalue()
    # A layout-3 thread has no window: no line names one.
    assert "window" not in out.getvalue(), out.getvalue()
    big = store.thread("big")
    big.append(UserMessage(content="B" * (config.chunk_max_bytes + 1)))  # a chunk of its own
    out = StringIO()
    inspect(store, "big", out=out)
    assert "  open chunk        empty\n" in out.getvalue() and "window" not in out.getvalue()
    store.close()


@pytest.mark.parametrize("budget", [1, 20, 39, 40, 100, 10**6])
def test_a_migrated_thread_budgets_by_the_counts_of_every_kind_of_container(migrated, budget):
    store, _ = migrated
    # Each crafted message counts its own sequence.
    kept, left = [], budget
    for seq in reversed(KEPT):
        if seq > left:
            break
        left -= seq
        kept.append(seq)
    context = store.thread("t").context(max_tokens=budget)
    assert [m.seq_id for m in context] == kept[::-1]
