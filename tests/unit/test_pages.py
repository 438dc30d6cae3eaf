"""The reads of several pages or round trips: pages (each page an output), gathering (outputs to a
sink, requests out, errors in), context (the summary, then every message after what it covers,
read again when a compaction lands in between) and snapshot (read again when anything moved)."""

from __future__ import annotations

import logging

import pytest

from kvstore import SummaryMessage, errors
from kvstore._engine import core
from kvstore._engine.core import (
    ITER_PAGE,
    MAX_LIMIT,
    SNAPSHOT_SIZE,
    Batch,
    Eval,
    gathering,
)
from kvstore._engine.operation import OPTIMISTIC_READS
from kvstore._engine.record import encode_record
from kvstore._engine.scripts import SCRIPTS
from kvstore._engine.tool_pairs import PAIR_LOOKBACK

from .driver import Step, batch, call, collect, drive, repeat
from .layout import FakeThread, message, seqs, summary


def chunked(fake: FakeThread, total: int = 12) -> FakeThread:
    """Messages 1..total: chunk:1 holds 1-4, chunk:5 holds 5-8, the window the rest."""
    fake.append(total)
    fake.roll(1, 4)
    fake.roll(5, 8)
    return fake


# ------------------------------------------------------------------------------ pages


def test_pages_hands_out_each_page_and_follows_its_cursor(thread, fake):
    chunked(fake)
    result, pages = collect(core.pages(thread, limit=5), repeat(fake.plan(), fake.fetch(), times=3))
    assert result is None
    assert [seqs(p.messages) for p in pages] == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12]]
    assert [p.has_more for p in pages] == [True, True, False]
    assert [p.next_cursor for p in pages] == [5, 10, None]


def test_pages_from_a_cursor_in_descending_order(thread, fake):
    chunked(fake)
    # The first page has no cursor: the newest page's Batch, which falls back to the plan here
    # (the window holds fewer messages than the page); then a plan from each page's cursor.
    _, pages = collect(
        core.pages(thread, order="desc", limit=5),
        fake.newest(),
        repeat(fake.plan(), fake.fetch(), times=3),
    )
    assert [seqs(p.messages) for p in pages] == [[12, 11, 10, 9, 8], [7, 6, 5, 4, 3], [2, 1]]
    _, after = collect(
        core.pages(thread, after=6, limit=4), repeat(fake.plan(), fake.fetch(), times=2)
    )
    assert [seqs(p.messages) for p in after] == [[7, 8, 9, 10], [11, 12]]


def test_pages_of_an_empty_thread_is_one_empty_page(thread, fake):
    _, pages = collect(core.pages(thread), fake.plan())
    assert len(pages) == 1 and pages[0].messages == [] and not pages[0].has_more


def test_pages_without_a_limit_grow_to_the_largest_page(thread, fake):
    fake.append(ITER_PAGE * 3 + 5)
    _, pages = collect(core.pages(thread), repeat(fake.plan(), fake.fetch(), times=3))
    assert [len(p.messages) for p in pages] == [ITER_PAGE, 2 * ITER_PAGE, 5]
    assert [m.seq_id for p in pages for m in p.messages] == list(range(1, ITER_PAGE * 3 + 6))


def test_pages_reads_iter_page_messages_at_a_time(thread, fake):
    fake.append(ITER_PAGE + 5)
    plan = fake.plan()
    _, pages = collect(core.pages(thread), repeat(plan, fake.fetch(), times=2))
    assert [len(p.messages) for p in pages] == [ITER_PAGE, 5]
    # Each plan asks for one message past the page, to know whether more follow.
    large_read = plan.requests[0].commands[4]
    assert large_read[-1] == ITER_PAGE + 1


def test_gathering_sends_requests_out_throws_errors_in_and_sinks_outputs():
    def inner():
        yield "a"
        try:
            yield Eval(SCRIPTS["locate"], (), ("seq", "1"))
        except errors.MessageNotFound as missing:
            yield f"handled {missing}"
        reply = yield Batch([("HGET", "meta", "gen")])
        yield reply
        return "inner result"

    sink: list = []
    result = drive(
        gathering(inner(), sink.append),
        call("locate", error=errors.MessageNotFound("gone")),
        batch([("HGET", "meta", "gen")], reply=b"3"),
    )
    assert result == "inner result"
    assert sink == ["a", "handled gone", b"3"]


def test_gathering_hands_on_an_error_the_inner_operation_does_not_handle(thread):
    expired = errors.CursorExpired("gone", 9)
    with pytest.raises(errors.CursorExpired):
        collect(core.pages(thread, after="m1"), call("page_plan", error=expired))


# ------------------------------------------------------------------------------ context


def with_summary(fake: FakeThread) -> FakeThread:
    """1..8 (chunks 1-4 deleted by retention), a summary at 9 covering up to 6, then 10, 11."""
    fake.append(8)
    fake.append(1, make=summary)  # 9
    fake.append(2)  # 10, 11
    fake.roll(1, 4)
    fake.roll(5, 8)
    fake.remove(1, 2, 3, 4)
    fake.meta.update(deleted_before="5", summary_last="6", summary_seq="9")
    return fake


@pytest.fixture
def unplannable(thread) -> FakeThread:
    """A layout-2 thread whose migration left its legacy hash holding a field that is no
    sequence: no plan counts it (layout/v2.py: only_layout_2), so context() reads page by page
    after the plan's first round trip finds that out."""
    fake = FakeThread(thread.keys)
    fake.legacy[0] = b"a field the migration kept"
    return fake


def counts_read(fake: FakeThread) -> Step:
    """context()'s first round trip: the stored counts a plan needs (layout/v2.py:
    stored_counts) and the kept system prompt and the first bytes of the thread's start riding
    with them (system_prompt.py). The fake answers meta, the legacy hash's existence, the
    prompt and the start; no counts (none are planned)."""
    keys = fake.keys

    def check(commands: list[tuple]) -> bool:
        return (
            commands[0][:3] == ("HMGET", keys.meta, "gen")
            and "layout" in commands[0]
            and commands[1] == ("HGETALL", keys.window_side)
            and commands[5] == ("EXISTS", keys.legacy)
            and commands[2] == ("MGET", keys.open_manifest, keys.open_data)
            and commands[6] == ("HMGET", keys.meta, "gen", "last_seq", "summary_seq")
            and commands[7:]
            == [
                ("MGET", keys.prompt_manifest, keys.prompt_data),
                ("HMGET", keys.meta, "prompt", "deleted_before"),
                ("GETRANGE", keys.chunk_data(1), 0, 63),
                ("GETRANGE", keys.chunk_manifest(1), 0, 1),
                ("GETRANGE", keys.open_data, 0, 63),
                ("GETRANGE", keys.open_manifest, 0, 1),
            ]
        )

    def reply(request: Batch) -> list:
        commands = request.commands
        return [
            fake.command(*commands[0]),
            {},
            [None, None],
            [],
            [],
            fake.command(*commands[5]),
            *(fake.command(*c) for c in commands[6:]),
        ]

    return batch(check, reply=reply)


def context_pass(fake: FakeThread, summary_seq: str, last_check=None, first=True):
    """The round trips of one pass of context() read page by page: on the first pass the plan's
    round trip (counts_read), then the meta read, the summary by sequence, the pages after what
    it covers, and summary_seq again."""
    keys = fake.keys
    return [
        *([counts_read(fake)] if first else []),
        batch(
            [("HMGET", keys.meta, "summary_last", "summary_seq", "deleted_before")],
            reply=fake.reply,
        ),
        fake.located(summary_seq),
        fake.fetch(),
        fake.plan(),
        fake.fetch(),
        batch([("HGET", keys.meta, "summary_seq")], reply=last_check or fake.reply),
    ]


def test_context_is_the_summary_then_what_follows_it_without_the_summary_again(thread, unplannable):
    fake = with_summary(unplannable)
    messages = drive(core.context(thread), *context_pass(fake, "9"))
    assert seqs(messages) == [9, 7, 8, 10, 11]
    assert isinstance(messages[0], SummaryMessage)
    assert [m.id for m in messages] == ["m9", "m7", "m8", "m10", "m11"]


def test_context_reads_from_the_summarys_last_sequence_at_max_limit(thread, unplannable):
    fake = with_summary(unplannable)
    steps = context_pass(fake, "9")
    drive(core.context(thread), *steps)
    plan = steps[4].request.commands
    # Walk up from summary_last: the chunk at or before 6, those after it, and max_limit + 1 large.
    assert plan[2][:4] == ("ZRANGE", thread.keys.chunk_index, "6", "-inf")
    assert plan[4][-1] == MAX_LIMIT + 1


def test_context_reads_again_when_a_compaction_lands_in_between(thread, unplannable):
    fake = with_summary(unplannable)

    def compacted_meanwhile(request):
        # Another caller compacts up to 10: a new summary at 12, retention deletes chunk:5.
        fake.append(1, make=lambda s: summary(s, "the newer summary"))
        fake.remove(5, 6, 7, 8)
        fake.meta.update(summary_last="10", summary_seq="12", deleted_before="9")
        return fake.answer(request)

    messages = drive(
        core.context(thread),
        *context_pass(fake, "9", compacted_meanwhile),
        *context_pass(fake, "12", first=False),
    )
    assert seqs(messages) == [12, 11]
    assert messages[0].summary == "the newer summary"


def test_context_reads_in_one_step_when_every_pass_is_compacted_under_it(thread, unplannable):
    fake = with_summary(unplannable)

    def compacted_again(request):
        fake.meta["summary_seq"] = str(int(fake.meta["summary_seq"]) + 100)
        return fake.answer(request)

    def one_pass(first: bool) -> list:
        steps = context_pass(fake, "9", compacted_again, first)
        # The summary moves on every pass.
        steps[2 if first else 1] = call("locate", reply=fake.locate)
        return steps

    first_pass = one_pass(True)
    passes = repeat(*one_pass(False))
    # After the optimistic passes, lua/read_range.lua reads the summary, what follows its range
    # and the messages before it, in one step.
    summary_record = encode_record(summary(9))
    body = [(s, encode_record(message(s)), 1) for s in (11, 10, 8, 7)]
    one_step = call(
        "read_range",
        ("summary", "", "", "", "down", 0, 0, PAIR_LOOKBACK, ""),
        reply=[5, 6, 9, summary_record, 1, len(body), *[v for r in body for v in r], 0],
    )
    passes.times = OPTIMISTIC_READS - 1
    messages = drive(core.context(thread), *first_pass, passes, one_step)
    assert seqs(messages) == [9, 7, 8, 10, 11]


def test_context_without_a_summary_is_every_message_and_warns_of_retention(
    thread, unplannable, caplog
):
    fake = chunked(unplannable)
    fake.remove(1, 2, 3, 4)
    fake.meta["deleted_before"] = "5"
    keys = fake.keys
    with caplog.at_level(logging.WARNING, logger="kvstore"):
        messages = drive(
            core.context(thread),
            counts_read(fake),
            batch(
                [("HMGET", keys.meta, "summary_last", "summary_seq", "deleted_before")],
                reply=fake.reply,
            ),
            fake.plan(),
            fake.fetch(),
            batch([("HGET", keys.meta, "summary_seq")], reply=fake.reply),
        )
    assert seqs(messages) == [5, 6, 7, 8, 9, 10, 11, 12]
    assert "no summary" in caplog.text


# ------------------------------------------------------------------------------ snapshot


def snapshot_pass(fake: FakeThread, recheck=None):
    keys = fake.keys
    stats = fake.stats_read()
    again = batch(
        [("HMGET", keys.meta, "last_seq", "gen", "summary_seq")], reply=recheck or fake.reply
    )
    return [stats, fake.newest(), again]


def test_a_snapshot_is_the_newest_page_oldest_first_with_turn_summary_and_stats(thread, fake):
    fake.append(3)
    fake.append(1, make=summary)  # 4
    fake.append(2)
    fake.meta.update(
        turn_id="turn-1",
        turn_seq="5",
        turn_outcome="open",
        summary_seq="4",
        summary_last="3",
        stored="6",
        tokens="60",
    )
    snap = drive(core.snapshot(thread), *snapshot_pass(fake), fake.located("4"), fake.fetch())
    assert seqs(snap.messages) == [1, 2, 3, 4, 5, 6]
    assert snap.summary is not None and snap.summary.seq_id == 4
    assert (snap.turn.turn_id, snap.turn.sequence, snap.turn.outcome) == ("turn-1", 5, "open")
    assert (
        snap.stats.next_sequence == 7
        and snap.stats.window_messages == 6
        and snap.stats.stored_messages == 6
    )


def test_a_snapshot_reads_the_newest_snapshot_size_messages(thread, fake):
    fake.append(SNAPSHOT_SIZE + 10)
    steps = snapshot_pass(fake)
    snap = drive(core.snapshot(thread), *steps)
    assert len(snap.messages) == SNAPSHOT_SIZE and snap.messages[-1].seq_id == SNAPSHOT_SIZE + 10
    window_read = steps[1].request.commands[4]  # ranks 0..limit: limit + 1 members
    assert window_read[:2] == ("ZRANGE", thread.keys.window) and window_read[3] == SNAPSHOT_SIZE


def test_a_snapshot_reads_again_when_an_append_lands_in_between(thread, fake):
    fake.append(5)

    def appended_meanwhile(request):
        fake.append(1)
        return fake.answer(request)

    snap = drive(
        core.snapshot(thread), *snapshot_pass(fake, appended_meanwhile), *snapshot_pass(fake)
    )
    # The page and the stats are of one state: the one after the append.
    assert seqs(snap.messages) == [1, 2, 3, 4, 5, 6]
    assert snap.stats.next_sequence == 7
