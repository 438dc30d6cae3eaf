"""How a page is read (docs/LAYOUT.md, "How a page is read"): the newest page in one round trip
of native reads whose window read carries no scores; a page from a sequence cursor planned with
native reads, from an id cursor by lua/page_plan.lua, both alike; and writes that land between
the reads of one pipeline."""

from __future__ import annotations

import random

import pytest

from kvstore import AssistantMessage, StoreConfig, UserMessage
from kvstore._engine.core import Batch, Eval, ThreadRef, list_page
from kvstore._engine.executor import send_request

from ..conftest import make_sync_store
from ..support import model

SMALL = dict(window_size=8, chunk_size=4, chunk_max_bytes=4096, retained_message_limit=10)


def drive(store, operation, between=None):
    """Runs a core operation like the store does; returns its result and the requests it sent.

    `between(index, position)` runs, if given, before each command of a Batch (the commands are
    then sent one at a time, so a write can land inside what is otherwise one pipeline)."""
    requests = []
    request = next(operation)
    try:
        while True:
            requests.append(request)
            if between is not None and isinstance(request, Batch):
                results = []
                for position, command in enumerate(request.commands):
                    between(len(requests) - 1, position)
                    results.append(send_request(store, Batch([command]))[0])
            else:
                results = send_request(store, request)
            request = operation.send(results)
    except StopIteration as done:
        return done.value, requests


def is_plan(request, ref) -> bool:
    """A page plan: lua/page_plan.lua, or its native reads (which start with meta's gen)."""
    if isinstance(request, Eval):
        return request.script.name == "page_plan"
    return request.commands[0][:3] == ("HMGET", ref.keys.meta, "gen")


@pytest.mark.parametrize("total", [1, 30, 51, 400])
def test_the_newest_page_is_native_reads_one_round_trip_from_the_open_chunk(
    backend, namespace, total
):
    """Layout 3: the newest page is read from the open chunk in one round trip when it holds the
    page (or the whole thread), from it and the newest closed chunk in two otherwise; no
    script."""
    config = StoreConfig(namespace=namespace)
    store = make_sync_store(backend, config)
    stored = store.thread("t").append([UserMessage(content=f"m{i}") for i in range(total)])
    ref = ThreadRef.of(config, "t")
    page, requests = drive(store, list_page(ref, limit=50, order="desc"))
    assert page.messages == stored[::-1][:50]
    assert page.has_more == (total > 50) and page.next_cursor == (
        stored[-50].seq_id if total > 50 else None
    )
    assert all(isinstance(r, Batch) for r in requests)
    assert len(requests) == (1 if total <= config.chunk_size else 2)
    store.close()


def test_the_newest_page_of_an_empty_thread_takes_no_script(backend, namespace):
    config = StoreConfig(namespace=namespace)
    store = make_sync_store(backend, config)
    page, requests = drive(store, list_page(ThreadRef.of(config, "t"), limit=50, order="desc"))
    assert page.messages == [] and not page.has_more
    assert len(requests) == 2 and not any(isinstance(r, Eval) for r in requests)
    store.close()


@pytest.mark.parametrize("hole", ["removed turn", "oversized", "removed newest"])
def test_the_newest_page_with_a_hole_among_the_newest_is_planned(make_thread, hole):
    """A window whose newest sequences are not all there cannot be numbered from its ends: the
    page is planned instead, and comes out right."""
    thread = make_thread(window_size=64, chunk_size=32, chunk_max_bytes=4096)
    stored = thread.append([UserMessage(content=f"m{i}") for i in range(100)])
    if hole == "oversized":
        stored += thread.append(UserMessage(content="B" * 5000))
    stored += thread.append([AssistantMessage(content=f"t{i}") for i in range(3)], turn_id="t")
    stored += thread.append([UserMessage(content=f"n{i}") for i in range(20)])
    if hole == "removed newest":
        stored += thread.append(AssistantMessage(content="last"), turn_id="u")
        thread.remove_turn("u")
        stored.pop()
    if hole == "removed turn":
        thread.remove_turn("t")
        stored = [m for m in stored if not isinstance(m, AssistantMessage)]
    page = thread.list(limit=50, order="desc")
    assert page.messages == stored[::-1][:50] and page.has_more


def test_sequence_and_id_cursors_read_the_same_pages(make_thread, backend):
    """A sequence cursor is planned with native reads, an id cursor by the script: on a thread
    with oversized messages, a removed turn and deleted messages, every message as a cursor
    gives the same pages both ways, as the model says."""
    thread = make_thread(**SMALL)
    rng = random.Random(5)
    stored = []
    for step in range(30):
        size = rng.choice([20, 300, 900, 5000])  # 5000 bytes are oversized here
        turn = "gone" if step in (12, 14) else None
        stored += thread.append(
            [UserMessage(content=f"{step}." + "x" * size) for _ in range(rng.randint(1, 3))],
            turn_id=turn,
        )
    thread.remove_turn("gone")
    thread.compact("up to 20", last_sequence=20)
    kept = thread.list(limit=1000).messages
    sequences = [m.seq_id for m in kept]
    assert thread.stats().deleted_before_sequence and len(sequences) < len(stored) - 5
    limits = [1, 3, 9, 40] if backend != "fakeredis" else [3, 40]
    for cursor in kept if backend != "fakeredis" else kept[::3]:
        for limit in limits:
            for order in ("asc", "desc"):
                for side in ("after", "before"):
                    case = (cursor.seq_id, limit, order, side)
                    by_sequence = thread.list(limit=limit, order=order, **{side: cursor.seq_id})
                    by_id = thread.list(limit=limit, order=order, **{side: cursor.id})
                    after, before = (
                        (cursor.seq_id, None) if side == "after" else (None, cursor.seq_id)
                    )
                    want, more = model.page(sequences, after, before, limit, order)
                    assert [m.seq_id for m in by_sequence.messages] == want, case
                    assert by_sequence.has_more == more, case
                    assert by_id == by_sequence, case


def test_an_append_between_the_native_plan_reads_makes_it_plan_again(backend, namespace):
    """The plan's pipeline is not atomic. Messages appended after it read meta and before it
    reads the rest would make the open chunk's count from meta stale: the plan reads meta's gen
    and last_seq again at its end, and plans again when they moved."""
    config = StoreConfig(namespace=namespace, chunk_size=128)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([UserMessage(content=f"m{i}") for i in range(96)])  # all in the open chunk
    ref = ThreadRef.of(config, "t")
    appended = []

    def append_inside_the_plan(index, position):
        if index == 0 and position == 1 and not appended:  # after the plan's first read of meta
            appended.extend(thread.append([UserMessage(content=f"late{i}") for i in range(31)]))

    # A sequence cursor: the page is planned (the newest page would read the open chunk alone).
    operation = list_page(ref, after=10**6, limit=80, order="desc")
    page, requests = drive(store, operation, append_inside_the_plan)
    assert appended and thread.stats().window_messages == 127  # no close: gen did not move
    assert page.messages == thread.list(limit=80, order="desc").messages and page.has_more
    assert page.messages[0].seq_id == 127
    assert [is_plan(r, ref) for r in requests] == [True, True, False]
    store.close()


def test_an_append_between_the_newest_page_reads_is_not_misnumbered(backend, namespace):
    """The newest page numbers the window's members from the score of the last one it read and
    meta's last_seq: an append between the two reads shifts the ranks, which the member read
    with its score tells; the page is then planned."""
    config = StoreConfig(namespace=namespace, window_size=64, chunk_size=32)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([UserMessage(content=f"m{i}") for i in range(70)])
    appended = []

    def append_inside_the_read(index, position):
        # Between the window's two reads (layout 2), before meta's second read (layout 3).
        if index == 0 and position == 5 and not appended:
            appended.extend(thread.append(UserMessage(content="late")))

    page, requests = drive(
        store, list_page(ThreadRef.of(config, "t"), limit=50, order="desc"), append_inside_the_read
    )
    assert appended
    assert page.messages == thread.list(limit=50, order="desc").messages
    assert [m.seq_id for m in page.messages] == list(range(71, 21, -1))
    assert len(requests) > 1
    store.close()


def test_a_page_over_chunks_closed_for_their_size_is_planned_once(backend, namespace):
    """Chunks of 8 that close at 2 KiB hold ~5 messages of 350 bytes: the plan reads enough of
    the index for the page anyway (one plan, one fetch), and names only what the page needs."""
    config = StoreConfig(namespace=namespace, chunk_size=8, chunk_max_bytes=2048)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    for n in range(1, 61):
        thread.append(UserMessage(content=f"{n:03d} " + "x" * 340))
    ref = ThreadRef.of(config, "t")
    full = [int(m.content[:3]) for m in thread.iter()]
    assert full == list(range(1, 61)) and store.client.zcard(ref.keys.chunk_index) >= 10
    page, requests = drive(store, list_page(ref, after=0, limit=40))
    assert [m.seq_id for m in page.messages] == list(range(1, 41)) and page.has_more
    assert len(requests) == 2
    fetched = [c for c in requests[1].commands if c[0] == "MGET"]
    assert len(fetched) <= 40 // 4 + 1  # the chunks that hold the page, not every one listed
    store.close()
