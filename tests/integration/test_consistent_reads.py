"""Reads that take several round trips see one state of the thread; cursors outlive retention;
a compaction sent twice stores one summary."""

from __future__ import annotations

import contextlib
import multiprocessing
import time

import pytest

from kvstore import MessageStore, StoreConfig, SummaryMessage, UserMessage, errors
from kvstore._engine.core import ThreadRef, context, snapshot
from kvstore._engine.executor import send_request

from ..conftest import make_sync_store

SMALL = dict(window_size=8, chunk_size=4, chunk_max_bytes=4096, retained_message_limit=10)


def fill(thread, count: int, start: int = 0):
    stored = []
    for i in range(start, start + count):
        stored += thread.append(UserMessage(content=f"m{i} " + "x" * 50))
    return stored


def check_context(messages):
    """The model input: a summary (if any) followed by every kept message after it, in order,
    with no gap. Returns the summary and the sequences that follow it."""
    summary = messages[0] if messages and isinstance(messages[0], SummaryMessage) else None
    rest = messages[1:] if summary is not None else messages
    sequences = [m.seq_id for m in rest]
    assert sequences == sorted(sequences)
    skipped = {summary.seq_id} if summary is not None else set()
    holes = (
        [
            s
            for s in range(sequences[0], sequences[-1] + 1)
            if s not in sequences and s not in skipped
        ]
        if sequences
        else []
    )
    assert not holes, f"context skips {holes[:10]}"
    return summary, sequences


def interleaved(store: MessageStore, operation, at_step: int, action):
    """Drives a core operation like the store does, running `action` after request `at_step`."""
    step = 0
    request = next(operation)
    try:
        while True:
            result = send_request(store, request)
            if step == at_step:
                action()
            step += 1
            request = operation.send(result)
    except StopIteration as done:
        return done.value, step


def by_length(message) -> int:
    return len(message.model_dump_json()) // 4


@pytest.mark.parametrize(("budget", "counter"), [(None, None), (10**6, None), (10**6, by_length)])
def test_context_sees_one_state_when_a_compaction_lands_between_its_round_trips(
    backend, namespace, budget, counter
):
    """A compaction after each of the read's round trips, its last included (it then lands
    after the read), however many the read takes: the planned read (stored counts), and the
    page by page one (a counter of the caller's)."""
    config = StoreConfig(namespace=namespace, **SMALL)
    at_step, steps = 0, 1
    while at_step < steps:
        store = make_sync_store(backend, config)
        other = make_sync_store(backend, config).thread(f"t{at_step}")
        thread = store.thread(f"t{at_step}")
        fill(thread, 60)
        first = thread.compact("up to 20", last_sequence=20)

        def compact_meanwhile(other=other):
            fill(other, 3, start=60)
            other.compact("up to 50", last_sequence=50)

        read = context(ThreadRef.of(config, f"t{at_step}"), budget, counter)
        messages, steps = interleaved(store, read, at_step, compact_meanwhile)
        assert steps > at_step  # the compaction landed inside the read, or right after it
        summary, sequences = check_context(messages)
        assert summary is not None
        # Whichever summary it returns, everything after that summary's range follows it.
        covered = 20 if summary.id == first.id else 50
        assert sequences[0] == covered + 1, (summary.summary, sequences[:5])
        now = thread.context(max_tokens=budget, count_tokens=counter)
        assert messages == now or covered == 20
        store.close()
        at_step += 1
    assert at_step >= 2  # a read of more than one round trip


@pytest.mark.parametrize("at_step", range(5))
def test_snapshot_sees_one_state_when_a_compaction_lands_between_its_round_trips(
    backend, namespace, at_step
):
    config = StoreConfig(namespace=namespace, **SMALL)
    store = make_sync_store(backend, config)
    other = make_sync_store(backend, config).thread("t")
    thread = store.thread("t")
    fill(thread, 60)
    thread.compact("up to 20", last_sequence=20)

    def compact_meanwhile():
        fill(other, 3, start=60)
        other.compact("up to 50", last_sequence=50)

    snap, steps = interleaved(
        store, snapshot(ThreadRef.of(config, "t")), at_step, compact_meanwhile
    )
    assert steps > at_step  # the compaction landed inside the read
    newest = snap.messages[-1].seq_id
    assert snap.stats.next_sequence == newest + 1
    assert snap.summary is not None and snap.summary.seq_id in [m.seq_id for m in snap.messages]
    assert snap.stats.summary_last_sequence == (50 if snap.summary.summary == "up to 50" else 20)
    kept = [m.seq_id for m in snap.messages]
    assert kept[0] >= (snap.stats.deleted_before_sequence or 1)
    store.close()


def every_step(store: MessageStore, operation, action):
    """Drives a core operation like the store does, running `action` after each of its requests."""
    steps = 0
    request = next(operation)
    try:
        while True:
            result = send_request(store, request)
            action()
            steps += 1
            request = operation.send(result)
    except StopIteration as done:
        return done.value, steps


@pytest.mark.parametrize("budget", [None, "stored counts", "counter"])
def test_context_answers_with_a_compaction_after_every_round_trip(backend, namespace, budget):
    """A writer that appends and compacts between each two round trips of context() (the
    optimistic tries all fail): context() still answers one state of the thread, read in one
    step (lua/read_range.lua)."""
    config = StoreConfig(namespace=namespace, **SMALL)
    store = make_sync_store(backend, config)
    other = make_sync_store(backend, config).thread("t")
    fill(store.thread("t"), 60)
    store.thread("t").compact("up to 20", last_sequence=20)
    appended = [60]

    def append_and_compact():
        stored = fill(other, 3, start=appended[0])
        appended[0] += 3
        other.compact(f"up to {stored[-1].seq_id - 8}", last_sequence=stored[-1].seq_id - 8)

    counter = (lambda message: 10) if budget == "counter" else None
    max_tokens = None if budget is None else 10_000
    operation = context(ThreadRef.of(config, "t"), max_tokens, counter)
    messages, steps = every_step(store, operation, append_and_compact)
    assert steps > 3
    summary, sequences = check_context(messages)
    covered = int(summary.summary.split()[-1])
    assert sequences[0] == covered + 1 and sequences[-1] >= appended[0] - 3
    store.close()


@pytest.mark.parametrize("owner", [None, "ann"])
def test_snapshot_answers_with_an_append_after_every_round_trip(backend, namespace, owner):
    """An append between each two round trips of snapshot() (its stats never match what it read
    after them): it still answers one state of the thread, read in one step; an owned thread's
    stats carry its directory entry on that path too."""
    config = StoreConfig(namespace=namespace, **SMALL)
    store = make_sync_store(backend, config)
    other = make_sync_store(backend, config).thread("t", owner)
    fill(store.thread("t", owner), 40)
    store.thread("t", owner).compact("up to 30", last_sequence=30)
    store.thread("t", owner).start_turn("turn")
    if owner:
        store.thread("t", owner).set_info(title="the chat")
    appended = [40]

    def append_one():
        fill(other, 1, start=appended[0])
        appended[0] += 1

    snap, steps = every_step(store, snapshot(ThreadRef.of(config, "t", owner=owner)), append_one)
    assert steps > 3
    kept = [m.seq_id for m in snap.messages]
    assert kept == list(range(kept[0], snap.stats.next_sequence))
    assert kept[0] == snap.stats.deleted_before_sequence or kept[0] == 1
    assert snap.summary is not None and snap.summary.summary == "up to 30"
    assert snap.turn is not None and snap.turn.turn_id == "turn"
    assert (snap.stats.owner, snap.stats.title) == ((owner, "the chat") if owner else (None, None))
    store.close()


def test_get_answers_with_messages_moving_after_every_round_trip(backend, namespace):
    """Messages rolled into chunks between each two round trips of get() (its locate and its
    fetch never see one gen): it still answers, by id, otid and for a replay's read-back."""
    from kvstore._engine.core import get, get_by_otid
    from kvstore._engine.reads import fetch_sequences

    config = StoreConfig(namespace=namespace, **SMALL)
    store = make_sync_store(backend, config)
    other = make_sync_store(backend, config).thread("t")
    stored = fill(store.thread("t"), 30)
    store.thread("t").append(UserMessage(content="with an otid", otid="o-1"))
    appended = [30]

    def append_a_chunk():
        fill(other, 4, start=appended[0])
        appended[0] += 4

    ref = ThreadRef.of(config, "t")
    found, steps = every_step(store, get(ref, stored[5].id), append_a_chunk)
    assert steps > 3 and found == stored[5]
    found, _ = every_step(store, get_by_otid(ref, "o-1"), append_a_chunk)
    assert found.content == "with an otid"
    found, _ = every_step(store, fetch_sequences(ref, [9, 3, 4]), append_a_chunk)
    assert [m.id for m in found] == [stored[8].id, stored[2].id, stored[3].id]
    store.close()


def test_a_page_answers_with_messages_moving_after_every_round_trip(backend, namespace):
    """Appends that roll messages into chunks between each two round trips of a page read (its
    plan and its fetch never see one state): the page is still read, in one step."""
    config = StoreConfig(namespace=namespace, **SMALL)
    store = make_sync_store(backend, config)
    other = make_sync_store(backend, config).thread("t")
    stored = fill(store.thread("t"), 40)
    appended = [40]

    def append_a_chunk():
        fill(other, 4, start=appended[0])
        appended[0] += 4

    from kvstore._engine.core import list_page

    page, steps = every_step(
        store, list_page(ThreadRef.of(config, "t"), after=2, limit=30), append_a_chunk
    )
    assert steps > 3
    assert [m.id for m in page.messages] == [m.id for m in stored[2:32]] and page.next_cursor == 32
    store.close()


def _compactor(
    url: str, namespace: str, seconds: float, every: int = 5, pause: float = 0.02
) -> None:
    thread = MessageStore.from_url(url, StoreConfig(namespace=namespace, **SMALL)).thread("t")
    deadline = time.monotonic() + seconds
    i = 1000
    while time.monotonic() < deadline:
        stored = fill(thread, every, start=i)
        i += every
        thread.compact(f"up to {stored[-1].seq_id - 12}", last_sequence=stored[-1].seq_id - 12)
        # A summary takes a model call to write: compactions are not back to back (but may be).
        time.sleep(pause)


def test_context_answers_every_call_during_back_to_back_compactions(
    make_thread, server, namespace, server_only
):
    """A second process compacting after every 3 appends, with no pause: every context() call
    answers (with and without a budget), one state each."""
    thread = make_thread("t", **SMALL)
    fill(thread, 30)
    worker = multiprocessing.get_context("spawn").Process(
        target=_compactor, args=(server.url, namespace, 1.5, 3, 0.0)
    )
    worker.start()
    reads = 0
    try:
        while worker.is_alive() or reads < 20:
            for messages, whole in (
                (thread.context(), True),
                (thread.context(max_tokens=400), False),
            ):
                summary, sequences = check_context(messages)
                if summary is not None and sequences:
                    covered = int(summary.summary.split()[-1])
                    assert sequences[0] == covered + 1 if whole else sequences[0] > covered
            reads += 1
    finally:
        worker.join(10)
    assert worker.exitcode == 0
    assert reads >= 20


def test_context_during_another_process_s_compactions(make_thread, server, namespace, server_only):
    thread = make_thread("t", **SMALL)
    fill(thread, 30)
    worker = multiprocessing.get_context("spawn").Process(
        target=_compactor, args=(server.url, namespace, 3.0)
    )
    worker.start()
    reads = 0
    try:
        while worker.is_alive() or reads < 20:
            messages = thread.context()
            summary, sequences = check_context(messages)
            if summary is not None:
                assert sequences and sequences[0] == int(summary.summary.split()[-1]) + 1
            reads += 1
    finally:
        worker.join(10)
    assert worker.exitcode == 0
    assert reads >= 20


# ------------------------------------------------------------------------ compaction retried


def test_a_compaction_sent_twice_stores_one_summary(make_thread):
    thread = make_thread(**SMALL)
    fill(thread, 40)
    first = thread.compact("up to 30", last_sequence=30)
    again = thread.compact("up to 30", last_sequence=30)
    assert again == first
    stats = thread.stats()
    assert stats.next_sequence == 42  # 40 messages and one summary
    assert [m.seq_id for m in thread.iter() if isinstance(m, SummaryMessage)] == [first.seq_id]
    later = thread.compact("up to 35", last_sequence=35)
    assert later.seq_id == 42
    # Another compaction of a range the current summary has passed (not a re-send of one).
    with pytest.raises(errors.InvalidSummaryRange, match="before the current summary"):
        thread.compact("up to 30, written again", last_sequence=30)


def test_a_compaction_sent_again_after_another_compacted_further_answers_as_its_first_run(
    make_thread,
):
    """A compact() whose first run stored its summary (the reply lost: OutcomeUnknown says to
    send it again), sent again after another worker compacted further, is a replay: it answers
    what its first run stored, and stores nothing."""
    thread = make_thread(**SMALL)
    fill(thread, 40)
    first = thread.compact("up to 20", last_sequence=20)
    other = thread.compact("up to 30", last_sequence=30)
    again = thread.compact("up to 20", last_sequence=20)
    assert again == first
    stats = thread.stats()
    assert stats.summary_last_sequence == 30 and stats.next_sequence == other.seq_id + 1
    assert thread.context()[0] == other


# ---------------------------------------------------------------------------- cursors


def test_an_id_cursor_deleted_by_retention_is_cursor_expired(make_thread):
    thread = make_thread(**SMALL)
    stored = fill(thread, 60)
    page = thread.list(limit=5)
    assert page.next_cursor == page.messages[-1].seq_id
    thread.compact("up to 40", last_sequence=40)
    deleted_before = thread.stats().deleted_before_sequence
    assert deleted_before and deleted_before > 5
    for kwargs in (
        dict(after=stored[2].id),
        dict(before=stored[2].id),
        dict(after=stored[2].id, order="desc"),
        dict(after=stored[2].id, turn_id="no-such-turn"),
    ):
        with pytest.raises(errors.CursorExpired) as caught:
            thread.list(limit=5, **kwargs)
        assert caught.value.deleted_before_sequence == deleted_before
        assert isinstance(caught.value, errors.MessageNotFound)
    # A sequence cursor survives retention: the next page starts at the oldest kept message.
    resumed = thread.list(after=page.next_cursor, limit=5)
    assert [m.seq_id for m in resumed.messages] == list(range(deleted_before, deleted_before + 5))
    # An id that was never stored is not expired.
    with pytest.raises(errors.MessageNotFound) as caught:
        thread.list(after="message-never-stored", limit=5)
    assert (
        type(caught.value) is errors.CursorExpired
    )  # with deletions, an unknown id may be one of them


def test_an_unknown_id_cursor_without_deletions_is_not_found(make_thread):
    thread = make_thread(**SMALL)
    fill(thread, 10)
    with pytest.raises(errors.MessageNotFound) as caught:
        thread.list(after="message-never-stored")
    assert not isinstance(caught.value, errors.CursorExpired)


def test_next_cursor_pages_every_order_and_direction(make_thread):
    thread = make_thread(**SMALL)
    stored = [m.seq_id for m in fill(thread, 37)]
    for order in ("asc", "desc"):
        expected = stored if order == "asc" else stored[::-1]
        seen, cursor = [], None
        while True:
            page = thread.list(after=cursor, limit=6, order=order)
            seen += [m.seq_id for m in page.messages]
            if page.next_cursor is None:
                assert not page.has_more
                break
            cursor = page.next_cursor
        assert seen == expected
        # Backwards with `before`: the next cursor goes on in the direction the page moved.
        seen, cursor = [], expected[-1]
        while True:
            page = thread.list(before=cursor, limit=6, order=order)
            seen = [m.seq_id for m in page.messages] + seen
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == expected[:-1]


def test_a_replay_whose_messages_retention_deletes_before_the_read_back_names_them(
    backend, namespace
):
    """The replay's reply names each stored message (sequence and id); a message retention
    deletes before the client reads it back still comes back, named, instead of going missing."""
    from kvstore._engine.core import append

    config = StoreConfig(namespace=namespace, **SMALL)
    store = make_sync_store(backend, config)
    other = make_sync_store(backend, config).thread("t")
    thread = store.thread("t")
    (first,) = thread.append(UserMessage(content="the first", otid="otid-1"))
    fill(thread, 60)

    def retention_meanwhile():
        other.compact("up to 50", last_sequence=50)

    again, steps = interleaved(
        store,
        append(ThreadRef.of(config, "t"), UserMessage(content="the first", otid="otid-1"), None),
        0,
        retention_meanwhile,
    )
    assert steps > 0
    assert thread.stats().deleted_before_sequence > 1  # it is gone now
    assert again.replayed
    assert [(m.id, m.seq_id, m.otid) for m in again] == [(first.id, 1, "otid-1")]
    store.close()


# ------------------------------------------------------------- the consistent read's answers

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvstore import AssistantMessage, ToolCallMessage, ToolReturnMessage  # noqa: E402


def _changed(*args, **kwargs):
    from kvstore._engine.operation import ChangedUnderReads

    raise ChangedUnderReads("every optimistic try met a write")
    yield  # a generator, like the operation it stands for


HISTORY = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.integers(0, 2)),
        st.tuples(st.just("large"), st.just(0)),
        st.tuples(st.just("call"), st.integers(0, 3)),
        st.tuples(st.just("answer"), st.integers(0, 3)),
        st.tuples(st.just("turn"), st.integers(1, 3)),
        st.tuples(st.just("remove"), st.just(0)),
        st.tuples(st.just("compact"), st.integers(1, 60)),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(history=HISTORY, budget=st.integers(1, 400), limit=st.integers(1, 12), at=st.integers(0, 40))
def test_the_consistent_read_answers_what_the_reads_of_several_round_trips_answer(
    make_thread, monkeypatch, history, budget, limit, at
):
    """Whatever the thread holds (chunks, oversized messages, holes a removed turn left,
    retention, a summary splitting a pair), context() and pages read in one step (the fallback)
    equal those read in several round trips."""
    thread = make_thread(window_size=4, chunk_size=3, chunk_max_bytes=600, retained_message_limit=6)
    turns = []
    for kind, n in history:
        if kind == "user":
            thread.append([UserMessage(content=f"u{i}") for i in range(n + 1)])
        elif kind == "large":
            thread.append(UserMessage(content="L" * 800))
        elif kind == "call":
            thread.append(
                ToolCallMessage(tool_call={"name": "f", "arguments": "{}", "tool_call_id": f"c{n}"})
            )
        elif kind == "answer":
            thread.append(
                ToolReturnMessage(status="success", tool_call_id=f"c{n}", tool_return="ok")
            )
        elif kind == "turn":
            turns.append(f"t{len(turns)}")
            thread.start_turn(turns[-1])
            thread.append([AssistantMessage(content=f"r{i}") for i in range(n)], turn_id=turns[-1])
        elif kind == "remove" and turns:
            thread.remove_turn(turns.pop(0))
        elif kind == "compact":
            stats = thread.stats()
            last = stats.next_sequence - 1
            with contextlib.suppress(errors.InvalidSummaryRange):
                thread.compact("s", max((stats.summary_last_sequence or 0) + 1, min(n, last)))

    def reads():
        return (
            thread.context(),
            thread.context(max_tokens=budget),
            thread.context(max_tokens=budget, count_tokens=lambda m: len(m.model_dump_json()) // 8),
            [thread.list(after=at, limit=limit, order=order) for order in ("asc", "desc")],
            thread.list(before=at + limit, limit=limit),
            [m.id for m in thread.iter()],
        )

    from kvstore._engine import pages as pages_module
    from kvstore._engine import views as views_module

    expected = reads()
    with monkeypatch.context() as patch:
        patch.setattr(views_module, "_optimistic_context", _changed)
        patch.setattr(pages_module, "_optimistic_walk", _changed)
        assert reads() == expected


# ------------------------------------------------- compaction and budgets cut off, then retried


class Interrupted(BaseException):
    """What cuts a sync call off (a signal's KeyboardInterrupt); asyncio's is CancelledError."""


def cut_at(thread, mode: str, operation, at: int, sent: bool):
    """Runs a core operation on the thread's store, cut off at its request `at` (before it is
    sent, or after it ran and before its reply reached the caller), as a cancellation or a
    timeout at that await would. Returns (finished, value)."""
    import asyncio

    inner = getattr(thread, "_thread", thread)
    cut = asyncio.CancelledError if mode == "async" else Interrupted

    def driven():
        request, step = next(operation), 0
        while True:
            if step == at:
                if sent:
                    yield request
                raise cut()
            try:
                try:
                    reply = yield request
                except Exception as exc:  # a typed error goes into the operation, as the store does
                    request = operation.throw(exc)
                else:
                    request = operation.send(reply)
            except StopIteration as done:  # it finished before request `at`
                return done.value
            step += 1

    try:
        result = inner._store.run(driven())
        value = thread._loop.run_until_complete(result) if mode == "async" else result
    except (Interrupted, asyncio.CancelledError):
        return False, None
    return True, value


def summaries(thread) -> list:
    return [m for m in thread.iter() if isinstance(m, SummaryMessage)]


def test_a_compaction_cut_off_at_any_step_and_sent_again_keeps_its_promises(make_thread, mode):
    """compact() with its pre-read, its script and the retention after it, cancelled (or timed
    out) before or after each request, then called again as the caller holds it: one summary,
    where an uninterrupted call puts it, retention finished; the answer is the first run's."""
    from kvstore._engine.core import ThreadRef, compact

    def made(name: str):
        thread = make_thread(name, **SMALL)
        fill(thread, 40)
        return thread

    reference = made("reference")
    expected = reference.compact("up to 30", last_sequence=30)
    expected_stats = reference.stats()
    at = 0
    while True:
        for sent in (False, True):
            thread = made(f"cut-{at}-{sent}")
            ref = ThreadRef.of(
                StoreConfig(namespace=thread.keys.meta.split(":", 1)[0], **SMALL),
                f"cut-{at}-{sent}",
            )
            finished, _ = cut_at(thread, mode, compact(ref, "up to 30", 30), at, sent)
            again = thread.compact("up to 30", last_sequence=30)
            assert [m.id for m in summaries(thread)] == [again.id]
            assert (again.summary, again.seq_id) == (expected.summary, expected.seq_id)
            stats = thread.stats()
            assert (
                stats.summary_last_sequence,
                stats.next_sequence,
                stats.deleted_before_sequence,
                stats.stored_messages,
            ) == (
                expected_stats.summary_last_sequence,
                expected_stats.next_sequence,
                expected_stats.deleted_before_sequence,
                expected_stats.stored_messages,
            )
            assert [(m.seq_id, m.content) for m in thread.context()[1:]] == [
                (m.seq_id, m.content) for m in reference.context()[1:]
            ]
        if finished:
            break
        at += 1
    assert at > 3  # the pre-read, the script and the retention were each cut off


def test_a_budgeted_context_cut_off_at_any_step_and_asked_again_answers_the_same(make_thread, mode):
    from kvstore._engine.core import ThreadRef, context

    thread = make_thread("budget", **SMALL)
    fill(thread, 40)
    thread.compact("up to 25", last_sequence=25)
    expected = thread.context(max_tokens=200)
    ref = ThreadRef.of(StoreConfig(namespace=thread.keys.meta.split(":", 1)[0], **SMALL), "budget")
    at = 0
    while True:
        finished, value = cut_at(thread, mode, context(ref, 200), at, at % 2 == 1)
        assert thread.context(max_tokens=200) == expected
        if finished:
            assert value == expected
            break
        at += 1
    assert at >= 2
