"""compact, replace, remove_turn, delete and migrate as requests, and the two refusals every write
can meet before it writes: a thread being deleted (finishing_deletes) and a layout-1 thread whose
scan is still running (MigrationPending)."""

from __future__ import annotations

import msgpack
import pytest

from kvstore import StoreConfig, SummaryMessage, UserMessage, errors
from kvstore._engine import core
from kvstore._engine.core import DELETE_STEP, ThreadRef, finishing_deletes
from kvstore._engine.operation import MAX_DELETE_REFUSALS
from kvstore._engine.record import decode_records, encode_record, record_turn_id
from kvstore._engine.script_args import LIMIT_NAMES
from kvstore._engine.tokens import estimated_tokens

from .driver import call, drive, repeat
from .layout import DATE, FakeThread, message, summary


def migrate_reply(
    layout: int, scanning: bool = False, chunks: int = 0, left: int = 0, window: int = 0
) -> list[int]:
    """lua/migrate.lua: {chunks_written, layout_version, scanning, fields_left, window_left}."""
    return [chunks, layout, int(scanning), left, window]


# ------------------------------------------------------------------------------ compact


def boundary(fake: FakeThread) -> list:
    """The read before a compaction: the page after last_sequence, for answers whose calls the
    summary would cover (no message follows here, so the plan is all it takes)."""
    return [fake.plan()]


def test_compact_runs_retention_again_while_each_call_hits_the_cap(thread, fake):
    cap = thread.config.max_chunks_per_call
    store = call("compact", {"summary_last": 12}, reply=[1, 13, cap])
    first, last = (
        call("retain", (thread.limits(),), reply=cap),
        call("retain", (thread.limits(),), reply=cap - 1),
    )
    result = drive(
        core.compact(thread, "what happened", 12),
        *boundary(fake),
        store,
        first,
        last,
        keys=thread.script_keys,
    )
    assert isinstance(result, SummaryMessage)
    assert result.seq_id == 13 and result.summary == "what happened"
    args = store.request.named()
    assert args["limits"] == thread.limits()
    assert args["id"] == result.id and args["otid"] == "" and args["media"] == 0
    assert args["tokens"] == estimated_tokens(result)
    (recorded,) = decode_records([(13, args["record"])])
    assert recorded.summary == "what happened"


def test_compact_under_the_cap_runs_no_more_retention(thread, fake):
    cap = thread.config.max_chunks_per_call
    result = drive(
        core.compact(thread, "s", 5), *boundary(fake), call("compact", reply=[1, 6, cap - 1])
    )
    assert result.seq_id == 6


def test_a_compact_replay_runs_retention_and_returns_the_stored_summary(thread, fake):
    fake.append(8)
    fake.append(1, make=lambda s: summary(s, "the summary stored first"))  # 9
    result = drive(
        core.compact(thread, "sent again", 8),
        fake.plan(),
        fake.fetch(),  # the page after 8: the summary, no answer
        call("compact", {"summary_last": 8}, reply=[0, 9, 0]),
        call("retain", reply=0),  # the first caller may not have finished retention
        fake.located("9"),
        fake.fetch(),
    )
    assert isinstance(result, SummaryMessage)
    assert result.seq_id == 9 and result.summary == "the summary stored first" and result.id == "m9"


def test_compact_that_loses_its_connection_in_retention_is_outcome_unknown_with_the_summary(
    thread, fake
):
    cap = thread.config.max_chunks_per_call
    store = call("compact", reply=[1, 13, cap])
    with pytest.raises(errors.OutcomeUnknown) as raised:
        drive(
            core.compact(thread, "s", 12),
            *boundary(fake),
            store,
            call("retain", error=errors.OutcomeUnknown("dropped")),
        )
    (carried,) = raised.value.messages
    assert carried.summary == "s" and carried.id == store.request.named()["id"]


@pytest.mark.parametrize("last", [0, -3, True, 2.5, "7"])
def test_compact_refuses_a_last_sequence_that_is_no_positive_int_before_any_request(thread, last):
    with pytest.raises(errors.InvalidSummaryRange):
        drive(core.compact(thread, "s", last))


def test_compact_maps_a_summary_that_would_move_back(thread, fake):
    with pytest.raises(errors.InvalidSummaryRange):
        drive(
            core.compact(thread, "s", 3),
            *boundary(fake),
            call("compact", error=errors.InvalidSummaryRange("before 9")),
        )


# ------------------------------------------------------------------- thread being deleted


def test_a_write_refused_as_deleting_finishes_the_delete_then_is_sent_again(thread):
    refused = call("append", error=errors.ThreadDeleting("tombstoned"))
    steps = [
        call("delete", (DELETE_STEP, "continue", 0, 0), reply=0),
        call("delete", (DELETE_STEP, "continue", 0, 0), reply=1),
    ]
    again = call("append", reply=[1, 1])
    result = drive(
        finishing_deletes(core.append(thread, UserMessage(content="hi"), None)),
        refused,
        *steps,
        again,
        keys=thread.script_keys,
    )
    assert result[0].seq_id == 1
    # The very same call is sent again, to the now empty thread.
    assert again.request == refused.request


def test_finishing_deletes_passes_other_errors_into_the_operation(thread):
    over = call("append", error=errors.InlineMediaBudget(0))
    result = drive(
        finishing_deletes(
            core.append(thread, UserMessage(content=[{"type": "text", "text": "x"}]), None)
        ),
        over,
        call("append", reply=[1, 4]),
    )
    assert result[0].seq_id == 4


def test_finishing_deletes_lets_an_error_the_operation_does_not_handle_out(thread):
    with pytest.raises(errors.TurnFinished):
        drive(
            finishing_deletes(core.append(thread, UserMessage(content="x"), "turn-1")),
            call("append", error=errors.TurnFinished("turn-1")),
        )


def test_finishing_deletes_returns_what_a_read_returns(thread, fake):
    fake.append(2)
    page = drive(finishing_deletes(core.list_page(thread, order="desc")), fake.newest())
    assert [m.seq_id for m in page.messages] == [2, 1]


# ------------------------------------------------------------------- layout-1 scan


def test_a_write_refused_while_the_legacy_scan_runs_runs_migrate_steps_then_is_sent_again(thread):
    refused = call("append", error=errors.MigrationPending("scanning"))
    steps = [
        call("migrate", (thread.limits(),), reply=migrate_reply(1, scanning=True)),
        call("migrate", (thread.limits(),), reply=migrate_reply(1, scanning=True)),
        call("migrate", (thread.limits(),), reply=migrate_reply(1, scanning=False)),
    ]
    again = call("append", reply=[1, 501])
    result = drive(core.append(thread, UserMessage(content="hi"), None), refused, *steps, again)
    assert result[0].seq_id == 501
    assert again.request.args == refused.request.args


@pytest.mark.parametrize(
    ("name", "operation", "reply", "expected"),
    [
        ("start_turn", lambda t: core.start_turn(t, "turn-1"), 77, 77),
        (
            "finish_turn",
            lambda t: core.finish_turn(t, "turn-1", "failed"),
            [0, 0, 0, 5, b"failed"],
            "failed",
        ),
        ("compact", lambda t: core.compact(t, "s", 3), [1, 9, 0], 9),
    ],
    ids=["start_turn", "finish_turn", "compact"],
)
def test_every_write_through_the_scan_check_waits_for_it(
    thread, fake, name, operation, reply, expected
):
    result = drive(
        operation(thread),
        *(boundary(fake) if name == "compact" else []),
        call(name, error=errors.MigrationPending("scanning")),
        call(
            "migrate", reply=migrate_reply(2)
        ),  # the scan ended (layout 2 then 3 at its next write)
        call(name, reply=reply),
    )
    got = {
        "start_turn": lambda r: r,
        "finish_turn": lambda r: r.outcome,
        "compact": lambda r: r.seq_id,
    }[name](result)
    assert got == expected


def test_migrate_runs_until_layout_3_with_an_empty_window_or_max_calls(thread, caplog):
    calls = drive(
        core.migrate(thread),
        repeat(call("migrate", (thread.limits(),), reply=migrate_reply(1, chunks=4)), times=3),
        call("migrate", reply=migrate_reply(2, chunks=1, left=2)),
        call("migrate", reply=migrate_reply(3, chunks=4, left=2, window=5)),
        call("migrate", reply=migrate_reply(3, chunks=1, left=2)),
    )
    assert calls == 6
    assert "2 legacy fields" in caplog.text
    assert (
        drive(
            core.migrate(thread, max_calls=2),
            repeat(call("migrate", reply=migrate_reply(1)), times=2),
        )
        == 2
    )


# ------------------------------------------------------------------------------ delete


def test_delete_starts_then_continues_until_done(thread):
    result = drive(
        core.delete(thread),
        call("delete", (DELETE_STEP, "start", 1000, 3600000), reply=0),
        call("delete", (DELETE_STEP, "continue", 1000, 3600000), reply=0),
        call("delete", (DELETE_STEP, "continue", 1000, 3600000), reply=1),
        keys=thread.script_keys,
    )
    assert result is None


def test_remove_turn_migrates_first_and_calls_until_nothing_remains(thread):
    removed = drive(
        core.remove_turn(thread, "turn-1"),
        call("migrate", reply=migrate_reply(3)),
        call("remove_turn", {"turn_id": "turn-1"}, reply=[500, 120]),
        call("remove_turn", {"turn_id": "turn-1"}, reply=[120, 0]),
    )
    assert removed == 620


# ------------------------------------------------------------------------------ replace


def stored_with(thread: ThreadRef, seq: int, record: bytes) -> FakeThread:
    fake = FakeThread(thread.keys)
    fake.append(seq)
    fake.window[seq] = record
    return fake


def test_replace_keeps_the_originals_id_otid_date_and_turn(thread):
    original = encode_record(message(4, otid="o-4"), "turn-9")
    fake = stored_with(thread, 4, original)
    step = call("replace", {"id": "m4"}, reply=4)
    result = drive(
        core.replace(thread, "m4", UserMessage(content="edited", otid="o-other", id="other")),
        call("migrate", reply=migrate_reply(3)),
        fake.located("m4", kind="id"),
        fake.fetch(),
        step,
    )
    media, record = step.request.named()["media"], step.request.named()["record"]
    (written,) = decode_records([(4, record)])
    assert (written.id, written.otid, written.content) == ("m4", "o-4", "edited")
    assert written.date == message(4).date
    assert record_turn_id(record) == "turn-9"
    assert media == 0
    assert result.seq_id == 4 and result.id == "m4" and result.content == "edited"


def test_replace_of_an_unreadable_message_keeps_what_salvage_reads(thread):
    # A record the reader refuses (an unknown field), but whose otid and turn can still be read.
    fake = stored_with(thread, 2, b"")
    body = {
        "message_type": "user_message",
        "id": "m2",
        "otid": "o-2",
        "date": DATE,
        "content": "x",
        "bogus": 1,
    }
    fake.window[2] = msgpack.packb([2, body, "turn-3"], use_bin_type=True)
    step = call("replace", reply=2)
    drive(
        core.replace(thread, "m2", UserMessage(content="fixed")),
        call("migrate", reply=migrate_reply(3)),
        fake.located("m2", kind="id"),
        fake.fetch(),
        step,
    )
    (written,) = decode_records([(2, step.request.named()["record"])])
    assert (written.id, written.otid, written.content) == ("m2", "o-2", "fixed")
    assert record_turn_id(step.request.named()["record"]) == "turn-3"


def test_replace_of_an_unknown_id_raises_before_any_write(thread, fake):
    fake.append(2)
    with pytest.raises(errors.MessageNotFound):
        drive(
            core.replace(thread, "nope", UserMessage(content="x")),
            call("migrate", reply=migrate_reply(3)),
            fake.located("nope", kind="id"),
            fake.fetch(),
        )


def test_replace_over_the_media_budget_resends_with_its_parts_replaced(thread):
    fake = stored_with(thread, 3, encode_record(message(3)))
    picture = {
        "type": "image",
        "source": {"type": "base64", "data": "AAAA" * 300, "media_type": "image/png"},
    }
    over, again = call("replace", error=errors.InlineMediaBudget(100)), call("replace", reply=3)
    result = drive(
        core.replace(thread, "m3", UserMessage(content=[picture])),
        call("migrate", reply=migrate_reply(3)),
        fake.located("m3", kind="id"),
        fake.fetch(),
        over,
        again,
    )
    assert over.request.named()["media"] == 900 and again.request.named()["media"] == 0
    assert len(again.request.named()["record"]) < len(over.request.named()["record"])
    assert result.seq_id == 3 and result.content[0].type == "text"


def test_replace_refitted_to_the_media_budget_still_keeps_the_originals_id_otid_and_turn(thread):
    fake = stored_with(thread, 4, encode_record(message(4, otid="o-4"), "turn-9"))
    picture = {
        "type": "image",
        "source": {"type": "base64", "data": "AAAA" * 300, "media_type": "image/png"},
    }
    over, again = call("replace", error=errors.InlineMediaBudget(0)), call("replace", reply=4)
    result = drive(
        core.replace(thread, "m4", UserMessage(content=[picture], otid="o-other", id="other")),
        call("migrate", reply=migrate_reply(3)),
        fake.located("m4", kind="id"),
        fake.fetch(),
        over,
        again,
    )
    record = again.request.named()["record"]
    (written,) = decode_records([(4, record)])
    assert (written.id, written.otid, written.date) == ("m4", "o-4", message(4).date)
    assert record_turn_id(record) == "turn-9" and again.request.named()["media"] == 0
    assert result.id == "m4" and result.otid == "o-4" and result.content == written.content


# ------------------------------------------------------------------------------ stats


def test_stats_read_in_one_batch(thread, fake):
    fake.append(10)
    fake.roll(1, 4)
    fake.meta.update(
        stored="10",
        bytes="1234",
        media="0",
        summary_last="3",
        layout="2",
        deleted_before="2",
        tokens="321",
    )
    stats = drive(core.stats(thread), fake.stats_read())
    assert stats.stored_messages == 10 and stats.window_messages == 6 and stats.chunks == 1
    assert stats.next_sequence == 11 and stats.stored_bytes == 1234
    assert (
        stats.deleted_before_sequence == 2
        and stats.summary_last_sequence == 3
        and stats.layout_version == 2
    )
    assert stats.tokens == 321


def test_stats_of_an_untouched_layout_1_thread_count_its_legacy_hash(thread):
    fake = FakeThread(thread.keys, layout=None)
    fake.legacy = {s: b"{}" for s in range(1, 8)}
    fake.meta["last_seq"] = "7"
    stats = drive(core.stats(thread), fake.stats_read())
    assert stats.stored_messages == 7 and stats.layout_version == 1


def test_stats_of_a_thread_being_deleted_read_as_empty(thread, fake):
    fake.append(5)
    fake.meta = {"deleting": "1", "gen": "9"}
    stats = drive(core.stats(thread), fake.stats_read())
    assert stats.stored_messages == 0 and stats.window_messages == 0 and stats.next_sequence == 1


def test_small_configs_change_the_limits_sent(thread):
    small = ThreadRef.of(
        StoreConfig(namespace="unit", window_size=8, chunk_size=4, retained_message_limit=None),
        "t-1",
    )
    step = call("start_turn", reply=1)
    drive(core.start_turn(small, "t"), step)
    key = step.request.named()["limits"]
    values = [int(v) for v in key.split(":")]
    limits = dict(zip(LIMIT_NAMES, values, strict=True))
    assert (limits["window_size"], limits["chunk_size"], limits["retained_limit"]) == (8, 4, -1)
    # The event limits and the history checks are limits too, and the key names them all
    # (lua/includes/args.lua: read_limits).
    assert (limits["events_len"], limits["events_age_ms"], limits["strict_history"]) == (
        1000,
        3600000,
        0,
    )
    assert limits["turn_lease_ms"] == 60_000
    assert key == ":".join(str(v) for v in values)
    strict = ThreadRef.of(
        StoreConfig(namespace="unit", history_checks="strict", turn_lease=5), "t-1"
    )
    assert strict.limits().endswith(":1000:3600000:1:5000")


def test_a_write_refused_as_deleting_again_and_again_gives_up_with_a_server_error(thread):
    # Another caller deletes the thread again each time this one finishes the deletion.
    rounds = []
    for _ in range(MAX_DELETE_REFUSALS):
        rounds += [
            call("append", error=errors.ThreadDeleting("tombstoned")),
            call("delete", (DELETE_STEP, "continue", 0, 0), reply=1),
        ]
    last = call("append", error=errors.ThreadDeleting("tombstoned"))
    with pytest.raises(errors.ServerError, match="being deleted"):
        drive(
            finishing_deletes(core.append(thread, UserMessage(content="hi"), None)),
            *rounds,
            last,
            keys=thread.script_keys,
        )


def test_the_count_of_refusals_as_deleting_starts_again_at_each_request_that_gets_through(
    thread, fake
):
    # compact, then retain, each refused as often as finishing_deletes bears: neither gives up.
    cap = thread.config.max_chunks_per_call

    def refused(name: str) -> list:
        return [
            call(name, error=errors.ThreadDeleting("tombstoned")),
            call("delete", (DELETE_STEP, "continue", 0, 0), reply=1),
        ] * MAX_DELETE_REFUSALS

    result = drive(
        finishing_deletes(core.compact(thread, "s", 12)),
        *boundary(fake),
        *refused("compact"),
        call("compact", reply=[1, 13, cap]),
        *refused("retain"),
        call("retain", reply=0),
        keys=thread.script_keys,
    )
    assert result.seq_id == 13
