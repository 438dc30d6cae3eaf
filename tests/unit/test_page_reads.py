"""How a page is read (docs/LAYOUT.md, "How a page is read"), request by request: the newest page
in one Batch and its fallback to the plan; plan and fetch with `gen` compared, planned again
when it moved; a layout-1 legacy hash read only at the walk's end; id cursors and turn pages
planned by their scripts; get and fetch by sequence through lua/locate.lua."""

from __future__ import annotations

import pytest

from kvstore import errors
from kvstore._engine import core
from kvstore._engine.core import MAX_LIMIT
from kvstore._engine.operation import OPTIMISTIC_READS
from kvstore._engine.record import encode_record

from .driver import batch, call, drive, repeat
from .layout import FakeThread, message, seqs, v1_record


def contents(page) -> list[str]:
    return [m.content if isinstance(m.content, str) else m.content[0].text for m in page.messages]


def chunked(fake: FakeThread) -> FakeThread:
    """Messages 1..12: chunk:1 holds 1-4, chunk:5 holds 5-8, the window 9-12."""
    fake.append(12)
    fake.roll(1, 4)
    fake.roll(5, 8)
    return fake


# ------------------------------------------------------------------------- the newest page


def test_the_newest_page_is_one_batch_with_one_score(thread, fake):
    fake.append(30)
    keys = thread.keys
    step = batch(
        [
            # Meta, the open chunk (layout 3), the newest oversized and closed chunk members;
            # limit + 1 window members without scores, the (limit + 1)-th again with its score,
            # then meta again.
            (
                "HMGET",
                keys.meta,
                "deleted_before",
                "deleting",
                "last_seq",
                "gen",
                "layout",
                "stored",
                "window_bytes",
            ),
            ("MGET", keys.open_manifest, keys.open_data),
            ("ZRANGE", keys.large_index, "+inf", "-inf", "BYSCORE", "REV", "LIMIT", 0, 11),
            ("ZRANGE", keys.chunk_index, "+inf", "-inf", "BYSCORE", "REV", "LIMIT", 0, 2),
            ("ZRANGE", keys.window, 0, 10, "REV"),
            ("ZRANGE", keys.window, 10, 10, "REV", "WITHSCORES"),
            ("HMGET", keys.meta, "gen", "last_seq"),
        ],
        reply=fake.reply,
    )
    page = drive(core.list_page(thread, limit=10, order="desc"), step)
    assert seqs(page.messages) == list(range(30, 20, -1))
    assert contents(page) == [f"message {s}" for s in range(30, 20, -1)]
    assert page.has_more and page.next_cursor == 21
    assert page.deleted_before_sequence is None and page.unreadable == []


def test_a_window_holding_the_whole_thread_is_the_whole_page(thread, fake):
    fake.append(3)
    page = drive(core.list_page(thread, limit=10, order="desc"), fake.newest())
    assert seqs(page.messages) == [3, 2, 1]
    assert not page.has_more and page.next_cursor is None


def test_retention_shows_in_the_newest_page(thread, fake):
    fake.append(30)
    fake.meta["deleted_before"] = "5"
    page = drive(core.list_page(thread, limit=5, order="desc"), fake.newest())
    assert seqs(page.messages) == [30, 29, 28, 27, 26]
    assert page.deleted_before_sequence == 5


def test_a_hole_among_the_newest_falls_back_to_the_plan(thread, fake):
    fake.append(30)
    fake.remove(25)  # a removed turn: the window's ranks no longer follow the sequences
    page = drive(
        core.list_page(thread, limit=10, order="desc"), fake.newest(), fake.plan(), fake.fetch()
    )
    expected = [30, 29, 28, 27, 26, 24, 23, 22, 21, 20]
    assert seqs(page.messages) == expected
    assert contents(page) == [f"message {s}" for s in expected]
    assert page.has_more and page.next_cursor == 20


def test_an_oversized_message_among_the_newest_falls_back_to_the_plan(thread, fake):
    fake.append(20)
    fake.append(1, large=True)  # 21 lives in its own chunk, not in the window
    fake.append(5)
    page = drive(
        core.list_page(thread, limit=8, order="desc"), fake.newest(), fake.plan(), fake.fetch()
    )
    assert seqs(page.messages) == list(range(26, 18, -1))
    assert contents(page) == [f"message {s}" for s in range(26, 18, -1)]


@pytest.mark.parametrize("position", [5, 6], ids=["before-the-score", "before-meta"])
def test_an_append_between_the_newest_reads_falls_back_to_the_plan(thread, fake, position):
    fake.append(30)

    def racing(request):
        # The append lands between two reads of the one pipeline.
        return fake.answer(request, before=lambda at: at == position and fake.append(1))

    page = drive(
        core.list_page(thread, limit=10, order="desc"),
        fake.newest(racing),
        fake.plan(),
        fake.fetch(),
    )
    # Read as of the state after the append, each message under its own sequence.
    assert seqs(page.messages) == list(range(31, 21, -1))
    assert contents(page) == [f"message {s}" for s in range(31, 21, -1)]


def test_a_thread_being_deleted_reads_as_empty(thread, fake):
    fake.append(30)
    fake.meta["deleting"] = "1"
    page = drive(core.list_page(thread, limit=10, order="desc"), fake.newest())
    assert page.messages == [] and not page.has_more


# ------------------------------------------------------------------- plan, fetch, gen


def test_a_page_plans_again_when_gen_moves_between_plan_and_fetch(thread, fake):
    chunked(fake)

    def rolled_meanwhile(request):
        fake.roll(9, 12)  # the window's messages move into chunk:9 between plan and fetch
        return fake.answer(request)

    first_fetch, second_fetch = fake.fetch(rolled_meanwhile), fake.fetch()
    page = drive(
        core.list_page(thread, after=6, limit=4),
        fake.plan(),
        first_fetch,
        fake.plan(),
        second_fetch,
    )
    assert seqs(page.messages) == [7, 8, 9, 10]
    assert page.has_more and page.next_cursor == 10
    # The first fetch read the window, where the messages no longer were; the second reads the
    # chunk they moved to.
    assert ("HMGET", thread.keys.chunk(9), "_m", "d") not in first_fetch.request.commands
    assert ("HMGET", thread.keys.chunk(9), "_m", "d") in second_fetch.request.commands


def test_a_page_reads_in_one_step_when_gen_always_moves(thread, fake):
    """Each optimistic try meets messages moving between its plan and its fetch: after a few,
    the page is read by lua/read_range.lua, in one step, and answers."""
    chunked(fake)

    def always_moving(request):
        fake.move_gen()
        return fake.answer(request)

    plan, fetch = fake.plan(), fake.fetch(always_moving)
    records = [(s, encode_record(message(s)), 1) for s in range(3, 9)]
    one_step = call(
        "read_range",
        ("seq", "2", "", "", "up", 5, 0, 0, ""),
        reply=[0, 0, 0, b"", 0, len(records), *[v for r in records for v in r], 0],
    )
    page = drive(
        core.list_page(thread, after=2, limit=4),
        repeat(plan, fetch, times=OPTIMISTIC_READS),
        one_step,
    )
    assert seqs(page.messages) == [3, 4, 5, 6] and page.has_more and page.next_cursor == 6
    # Bounded, and each attempt was a full plan and fetch.
    assert len(fetch.requests) == len(plan.requests) == OPTIMISTIC_READS


def test_the_native_plan_reads_again_when_an_append_lands_inside_it(thread, fake):
    chunked(fake)

    def racing(request):
        last = len(request.commands) - 1
        return fake.answer(request, before=lambda at: at == last and fake.append(1))

    first_plan = fake.plan(racing)
    page = drive(core.list_page(thread, after=6, limit=10), first_plan, fake.plan(), fake.fetch())
    assert seqs(page.messages) == [7, 8, 9, 10, 11, 12, 13]
    assert not page.has_more


def test_a_walk_plans_on_past_short_chunks_and_keeps_the_first_plans_deleted_before(thread, fake):
    fake.append(20)
    for seq in range(1, 5):
        fake.roll(seq, seq)  # one-message chunks (what remove_turn leaves): a plan names few
    fake.meta["gen"] = "1"

    def retention_meanwhile(request):
        replies = fake.answer(request)
        fake.remove(1, 2)  # retention deletes what the page already read
        fake.meta["deleted_before"] = "3"
        return replies

    fetches = [fake.fetch(retention_meanwhile), fake.fetch()]
    page = drive(
        core.list_page(thread, after=0, limit=5), fake.plan(), fetches[0], fake.plan(), fetches[1]
    )
    assert seqs(page.messages) == [1, 2, 3, 4, 5]
    assert page.has_more and page.next_cursor == 5
    # What the page holds was read as of the first plan, before retention.
    assert page.deleted_before_sequence is None
    read = [{c[1] for c in f.request.commands[:-1] if c[0] != "MGET"} for f in fetches]
    assert read[0] == {thread.keys.chunk(1), thread.keys.chunk(2)}
    assert read[1] == {thread.keys.chunk(3), thread.keys.chunk(4), thread.keys.window}


# ------------------------------------------------------------------- layout 1


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_a_legacy_hash_is_read_only_at_the_walks_end(thread, order):
    fake = FakeThread(thread.keys, layout=1)
    fake.legacy = {s: v1_record(s) for s in range(1, 501)}
    fake.meta["last_seq"] = "500"
    gen = int(fake.meta["gen"])
    walk = "up" if order == "asc" else "down"
    # lua/page_plan.lua: nothing in the window or chunks; the legacy range 1..500, 500 fields.
    plan_reply = [gen, 0, 0, 501, 1, b"", 0, 0, 1, 500, 500, 0, 0, 0, 0, 0, 0]
    wanted = list(range(1, 12)) if order == "asc" else list(range(490, 501))

    def reads_the_walks_end(commands):
        (legacy_read,) = [c for c in commands if c[1] == thread.keys.legacy]
        assert legacy_read == ("HMGET", thread.keys.legacy, *wanted)

    steps = [fake.newest()] if order == "desc" else []
    steps += [
        fake.plan(),  # the native facts find layout 1: the script plans
        call(
            "page_plan", {"lo_kind": "", "hi_kind": "", "walk": walk, "need": 11}, reply=plan_reply
        ),
        fake.fetch(commands=reads_the_walks_end),
    ]
    page = drive(core.list_page(thread, limit=10, order=order), *steps, keys=thread.script_keys)
    expected = list(range(1, 11)) if order == "asc" else list(range(500, 490, -1))
    assert seqs(page.messages) == expected
    # Version-1 records: string content reads as one text part.
    assert contents(page) == [f"legacy {s}" for s in expected]
    assert page.has_more and page.next_cursor == expected[-1]


# ------------------------------------------------------------------- cursors, turns


def test_an_id_cursor_is_planned_by_the_script(thread, fake):
    chunked(fake)
    gen = int(fake.meta["gen"])
    members = fake.command("ZRANGE", thread.keys.chunk_index, 0, -1)
    # page_plan resolved m5 to sequence 5: chunk:5 holds it, no chunk follows, the window does
    # (9..12, 4 messages); layout 2, no legacy range, no open chunk.
    reply = [gen, 0, 5, 13, 2, members[1], 0, 0, 0, 0, 0, 9, 12, 4, 0, 0, 0]
    fetch = fake.fetch()
    page = drive(
        core.list_page(thread, after="m5", limit=3),
        call("page_plan", ("id", "m5", "", "", "up", 4, 2), reply=reply),
        fetch,
        keys=thread.script_keys,
    )
    assert seqs(page.messages) == [6, 7, 8]
    assert page.has_more and page.next_cursor == 8
    read = {command[1] for command in fetch.request.commands}
    assert thread.keys.chunk(5) in read and thread.keys.chunk(1) not in read


def test_an_expired_cursor_is_raised_with_its_deleted_before(thread):
    expired = errors.CursorExpired("no stored message has id 'm2'", 40)
    with pytest.raises(errors.CursorExpired) as raised:
        drive(
            core.list_page(thread, after="m2"),
            call("page_plan", {"lo_kind": "id", "lo": "m2"}, error=expired),
        )
    assert raised.value.deleted_before_sequence == 40


@pytest.mark.parametrize(
    ("cursor", "walk_reply", "page_seqs", "next_cursor"),
    [
        ({"after": 1}, [3, 5], [3, 5], 5),  # from `after`, upward: goes on from the last
        ({"before": 9}, [7, 5], [5, 7], 5),  # from `before`, downward, shown ascending
    ],
)
def test_a_turn_page_reads_its_sequences_by_the_turn_record(
    thread, fake, cursor, walk_reply, page_seqs, next_cursor
):
    fake.append(9)
    after = ("seq", "1") if "after" in cursor else ("", "")
    before = ("seq", "9") if "before" in cursor else ("", "")
    walk = "up" if "after" in cursor else "down"
    plan = call("turn_page", ("turn-1", *after, *before, walk, 2), reply=[0, 1, *walk_reply])
    page = drive(
        core.list_page(thread, limit=2, turn_id="turn-1", **cursor),
        plan,
        fake.located(*(str(s) for s in page_seqs)),
        fake.fetch(),
    )
    assert seqs(page.messages) == page_seqs
    assert page.has_more and page.next_cursor == next_cursor


def test_get_reads_the_chunk_locate_names(thread, fake):
    chunked(fake)
    keys = thread.keys
    found = drive(
        core.get(thread, "m6"),
        fake.located("m6", kind="id"),
        batch(
            [
                ("MGET", keys.chunk_manifest(5), keys.chunk_data(5)),
                ("HMGET", keys.chunk(5), "_m", "d"),
                ("HGET", keys.meta, "gen"),
            ],
            reply=fake.reply,
        ),
    )
    assert found.id == "m6" and found.seq_id == 6 and found.content == "message 6"


def test_get_of_an_unknown_id_or_otid_is_message_not_found(thread, fake):
    chunked(fake)
    with pytest.raises(errors.MessageNotFound):
        drive(
            core.get(thread, "nope"),
            fake.located("nope", kind="id"),
            batch(
                [("HGET", thread.keys.meta, "gen")], reply=fake.reply
            ),  # nothing to fetch but gen
        )
    with pytest.raises(errors.MessageNotFound):
        drive(core.get_by_otid(thread, "o-1"), fake.located("o-1", kind="otid"), fake.fetch())


def test_get_by_otid_goes_through_the_otid_map(thread, fake):
    fake.append(3, make=lambda s: message(s, otid=f"o-{s}"))
    found = drive(core.get_by_otid(thread, "o-2"), fake.located("o-2", kind="otid"), fake.fetch())
    assert (found.id, found.otid, found.seq_id) == ("m2", "o-2", 2)


def test_a_locate_reads_again_when_gen_moves(thread, fake):
    fake.append(6)

    def rolled_meanwhile(request):
        fake.roll(1, 4)
        return fake.answer(request)

    found = drive(
        core.fetch_sequences(thread, [2, 5]),
        fake.located("2", "5"),
        fake.fetch(rolled_meanwhile),
        fake.located("2", "5"),
        fake.fetch(commands=lambda c: ("HMGET", thread.keys.chunk(1), "_m", "d") in c),
    )
    assert seqs(found) == [2, 5] and [m.id for m in found] == ["m2", "m5"]


def test_fetch_sequences_names_what_is_missing_unless_missing_ok(thread, fake):
    fake.append(3)
    with pytest.raises(errors.MessageNotFound, match="1 messages"):
        drive(core.fetch_sequences(thread, [2, 7]), fake.located("2", "7"), fake.fetch())
    found = drive(
        core.fetch_sequences(thread, [2, 7], missing_ok=True), fake.located("2", "7"), fake.fetch()
    )
    assert seqs(found) == [2]


def test_an_unreadable_record_is_skipped_and_named_on_a_page(thread, fake):
    fake.append(5)
    fake.window[3] = b"\xc1 not msgpack"
    page = drive(core.list_page(thread, limit=10, order="desc"), fake.newest())
    assert seqs(page.messages) == [5, 4, 2, 1]
    assert page.unreadable == [3]


def test_the_largest_limit_is_accepted(thread, fake):
    fake.append(3)
    page = drive(core.list_page(thread, limit=MAX_LIMIT, order="desc"), fake.newest())
    assert seqs(page.messages) == [3, 2, 1]


# ------------------------------------------------------------------- layout 3


def layout_3(thread, total: int, closed: int) -> FakeThread:
    """Messages 1..total: 1..closed in string chunks of 4, the rest in the open chunk."""
    fake = FakeThread(thread.keys, layout=3)
    fake.append(total)
    for first in range(1, closed + 1, 4):
        fake.roll(first, min(first + 3, closed))
    fake.open = {s: fake.window.pop(s) for s in list(fake.window)}
    return fake


def test_a_layout_3_newest_page_is_the_open_chunks_tail_in_one_round_trip(thread):
    fake = layout_3(thread, 12, 8)
    page = drive(core.list_page(thread, limit=3, order="desc"), fake.newest())
    assert seqs(page.messages) == [12, 11, 10] and page.has_more and page.next_cursor == 10
    whole = layout_3(thread, 3, 0)
    # Read once at layout 3, the thread's newest page reads no layout-2 window.
    page = drive(core.list_page(thread, limit=5, order="desc"), whole.newest(window=False))
    assert seqs(page.messages) == [3, 2, 1] and not page.has_more


def test_a_thread_seen_at_layout_3_reads_no_window_until_it_reads_otherwise(thread):
    fake = layout_3(thread, 12, 8)
    drive(core.list_page(thread, limit=3, order="desc"), fake.newest())
    # Another layout then (a thread remade by an older release): that page is planned, and
    # the next one reads the window again.
    older = FakeThread(thread.keys)
    older.append(5)
    page = drive(
        core.list_page(thread, limit=3, order="desc"),
        older.newest(window=False),
        older.plan(),
        older.fetch(),
    )
    assert seqs(page.messages) == [5, 4, 3] and page.has_more
    page = drive(core.list_page(thread, limit=3, order="desc"), older.newest())
    assert seqs(page.messages) == [5, 4, 3] and page.has_more


def test_a_migrations_window_left_is_told_by_meta_when_it_is_not_read(thread):
    fake = layout_3(thread, 12, 8)
    drive(core.list_page(thread, limit=3, order="desc"), fake.newest())
    # Messages 1..8 still in a window a migration has not moved (meta says so): the page that
    # the open chunk cannot make alone is planned, not made from the closed chunks.
    fake.meta["window_bytes"] = "1"
    page = drive(
        core.list_page(thread, limit=7, order="desc"),
        fake.newest(window=False),
        fake.plan(),
        fake.fetch(),
    )
    assert seqs(page.messages) == [12, 11, 10, 9, 8, 7, 6] and page.has_more


def test_a_layout_3_newest_page_reads_the_newest_closed_chunks_second(thread):
    fake = layout_3(thread, 12, 8)
    page = drive(core.list_page(thread, limit=7, order="desc"), fake.newest(), fake.fetch())
    assert seqs(page.messages) == [12, 11, 10, 9, 8, 7, 6] and page.has_more
    assert contents(page) == [f"message {s}" for s in range(12, 5, -1)]


def test_a_layout_3_plan_reads_the_open_chunk_and_string_chunks(thread):
    fake = layout_3(thread, 12, 8)
    fetch = fake.fetch()
    page = drive(core.list_page(thread, after=6, limit=4), fake.plan(), fetch)
    assert seqs(page.messages) == [7, 8, 9, 10] and page.has_more
    read = {c[1] for c in fetch.request.commands}
    assert thread.keys.open_manifest in read and thread.keys.chunk_manifest(5) in read
    assert thread.keys.chunk(5) not in read  # no hash read beside a layout-3 thread's strings
