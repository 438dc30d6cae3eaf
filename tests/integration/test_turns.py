"""Turns: retry safety, retention of a started turn's record, bounded records of interleaved
turns, and records stored by an earlier version of layout 2."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from kvstore import AssistantMessage, StoreConfig, UserMessage, errors

from ..conftest import make_async_store, make_sync_store
from ..support.layout_check import check_layout

SMALL = dict(window_size=4, chunk_size=2, retained_message_limit=0)


def readme_turn_lines() -> str:
    """The README usage snippet's turn, from its first turn_id line to finish_turn."""
    text = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    block = text.split("## Usage", 1)[1].split("```python", 1)[1].split("```", 1)[0].splitlines()
    first = next(i for i, line in enumerate(block) if 'turn_id="turn-1"' in line)
    last = next(i for i, line in enumerate(block) if "finish_turn" in line)
    return "\n".join(block[first : last + 1])


def test_the_readme_snippet_run_twice_stores_once_and_reports_the_same(make_thread):
    thread = make_thread()
    code, printed = readme_turn_lines(), []
    names = {
        "thread": thread,
        "UserMessage": UserMessage,
        "AssistantMessage": AssistantMessage,
        "print": printed.append,
    }
    exec(code, dict(names))
    exec(code, dict(names))  # the whole request again, as a retry would run it
    first, again = printed
    assert first == again
    assert (first.outcome, first.reply_count, first.first_sequence, first.last_sequence) == (
        "completed",
        1,
        2,
        2,
    )
    assert thread.start_turn("turn-1") == 2
    assert thread.stats().stored_messages == 2
    assert [m.seq_id for m in thread.list(turn_id="turn-1").messages] == [1, 2]


def test_a_finished_turn_keeps_its_result_and_refuses_new_replies(make_thread):
    thread = make_thread()
    thread.start_turn("t")
    reply = thread.append(AssistantMessage(content="one", otid="o1"), turn_id="t")
    result = thread.finish_turn("t", outcome="steered")
    # Finishing again returns the recorded result, whatever outcome the retry passes.
    assert thread.finish_turn("t", outcome="failed") == result
    assert result.outcome == "steered" and thread.snapshot().turn.outcome == "steered"
    # A retried append of a stored reply is still a replay...
    assert thread.append(AssistantMessage(content="one", otid="o1"), turn_id="t") == reply
    # ... but a new reply to a finished turn is refused, and nothing is written.
    with pytest.raises(errors.TurnFinished):
        thread.append(AssistantMessage(content="late"), turn_id="t")
    assert thread.stats().stored_messages == 1
    assert thread.start_turn("t") == 1
    assert thread.finish_turn("t") == result


def test_starting_a_started_turn_changes_nothing(make_thread):
    thread = make_thread()
    thread.append(UserMessage(content="q"), turn_id="a")
    assert thread.start_turn("a") == 2
    thread.append(AssistantMessage(content="a1"), turn_id="a")
    assert thread.start_turn("b") == 3
    thread.append(AssistantMessage(content="b1"), turn_id="b")
    # A late retry of start_turn("a") neither restarts it nor makes it the current turn.
    assert thread.start_turn("a") == 2
    assert thread.snapshot().turn.turn_id == "b"
    thread.append(AssistantMessage(content="a2"), turn_id="a")
    assert thread.finish_turn("a").reply_count == 2
    assert thread.finish_turn("b").reply_count == 1


ROUNDS = 60


def _race_sequence(thread, i):
    thread.append(UserMessage(content=f"question {i}", otid=f"q{i}"), turn_id="turn")
    thread.start_turn("turn")
    thread.append(AssistantMessage(content=f"answer {i}", otid=f"a{i}"), turn_id="turn")
    return thread.finish_turn("turn")


async def _race_sequence_async(thread, i):
    await thread.append(UserMessage(content=f"question {i}", otid=f"q{i}"), turn_id="turn")
    await thread.start_turn("turn")
    await thread.append(AssistantMessage(content=f"answer {i}", otid=f"a{i}"), turn_id="turn")
    return await thread.finish_turn("turn")


def test_a_retried_request_racing_its_original_gets_the_same_result(
    backend, mode, namespace, server_only
):
    """Two clients run the same request (append, start, append, finish) at once, many times."""
    config = StoreConfig(namespace=namespace)
    results = []
    if mode == "sync":
        stores = [make_sync_store(backend, config) for _ in range(2)]
        for i in range(ROUNDS):
            barrier, out = threading.Barrier(2), [None, None]

            def run(k, i=i, barrier=barrier, out=out):
                barrier.wait()
                out[k] = _race_sequence(stores[k].thread(f"race-{i}"), i)

            workers = [threading.Thread(target=run, args=(k,)) for k in range(2)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            results.append(out)
        for store in stores:
            store.close()
    else:

        async def main():
            stores = [make_async_store(backend, config) for _ in range(2)]
            for i in range(ROUNDS):
                results.append(
                    await asyncio.gather(
                        *(_race_sequence_async(store.thread(f"race-{i}"), i) for store in stores)
                    )
                )
            for store in stores:
                await store.close()

        asyncio.run(main())
    for first, second in results:
        assert first == second
        assert (first.outcome, first.reply_count, first.first_sequence, first.last_sequence) == (
            "completed",
            1,
            2,
            2,
        )


# ------------------------------------------------------------------------------ retention


def _retain_everything_before(thread, last):
    """Compacts up to `last` with retained limit 0: every chunk up to it goes."""
    for i in range(8):
        thread.append(UserMessage(content=f"filler {i}"))
    thread.compact("summary", last_sequence=last + 8)
    assert thread.stats().deleted_before_sequence > last


def test_retention_keeps_an_open_turns_record(make_thread, raw_client, namespace):
    thread = make_thread(**SMALL)
    thread.append(UserMessage(content="question"), turn_id="t")
    thread.start_turn("t")
    thread.append([AssistantMessage(content=f"r{i}") for i in range(3)], turn_id="t")
    thread.start_turn("other")  # the turn reply sequence names another turn now
    _retain_everything_before(thread, 4)
    assert raw_client.hexists(thread.keys.turns, "t")
    late = thread.append(AssistantMessage(content="after retention"), turn_id="t")
    result = thread.finish_turn("t")
    # Only the replies still stored are counted, as list(turn_id) returns them.
    assert (result.reply_count, result.first_sequence, result.last_sequence) == (
        1,
        late[0].seq_id,
        late[0].seq_id,
    )
    assert [m.seq_id for m in thread.list(turn_id="t").messages] == [late[0].seq_id]
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **SMALL))


def test_retention_drops_the_record_of_a_finished_turn_left_empty(make_thread, raw_client):
    thread = make_thread(**SMALL)
    thread.append(UserMessage(content="never started"), turn_id="loose")
    thread.start_turn("done")
    thread.append(AssistantMessage(content="r"), turn_id="done")
    thread.finish_turn("done")
    thread.start_turn("open")
    thread.append(AssistantMessage(content="r"), turn_id="open")
    _retain_everything_before(thread, 3)
    assert raw_client.hkeys(thread.keys.turns) == [b"open"]
    assert thread.finish_turn("open").reply_count == 0


def test_retention_trims_an_interleaved_turn_from_its_oldest_ranges(
    make_thread, raw_client, namespace
):
    config = dict(window_size=4, chunk_size=2, retained_message_limit=6)
    thread = make_thread(**config)
    thread.append(UserMessage(content="question"), turn_id="t")
    thread.start_turn("t")
    mine = [1]
    for i in range(20):
        mine += [m.seq_id for m in thread.append(AssistantMessage(content=f"t{i}"), turn_id="t")]
        thread.append(UserMessage(content=f"other {i}"), turn_id="o")
    thread.compact("summary", last_sequence=mine[-1])
    deleted_before = thread.stats().deleted_before_sequence
    kept = [s for s in mine if s >= deleted_before]
    assert 0 < len(kept) < len(mine)
    assert [m.seq_id for m in thread.list(turn_id="t", limit=100).messages] == kept
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **config))
    result = thread.finish_turn("t")
    assert (result.reply_count, result.first_sequence, result.last_sequence) == (
        len(kept),
        kept[0],
        kept[-1],
    )


# ------------------------------------------------------------------ an interleaved turn


INTERLEAVINGS = 2000
# Two appends of the turn at the same rollover phase (sequence 21 and 3989, 32 apart many times).
MEASURED = (10, 1994)


def _turn_fields(raw_client, thread) -> dict[bytes, bytes]:
    return raw_client.hgetall(thread.keys.turns)


def _commands_run(raw_client) -> int:
    stats = raw_client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info",))


def test_an_interleaved_turn_keeps_bounded_records(make_thread, raw_client, namespace, backend):
    thread = make_thread()
    thread.start_turn("t")
    expected, others = [], []
    measured = {}
    for i in range(INTERLEAVINGS):
        if i in MEASURED:
            before = _turn_fields(raw_client, thread)
            commands = _commands_run(raw_client) if backend != "fakeredis" else 0
        expected += [
            m.seq_id for m in thread.append(AssistantMessage(content=f"t{i}"), turn_id="t")
        ]
        if i in MEASURED:
            if backend != "fakeredis":
                commands = _commands_run(raw_client) - commands
            after = _turn_fields(raw_client, thread)
            written = {k: v for k, v in after.items() if before.get(k) != v}
            measured[i] = (len(written), sum(len(k) + len(v) for k, v in written.items()), commands)
        others += thread.append(UserMessage(content=f"u{i}"), turn_id=f"u{i % 3}")
    # What an append of the turn writes does not grow with its ranges: at most two fields
    # (the header and the range it closes), of bounded size, and the same number of commands.
    (_early_fields, early_bytes, early_commands), (late_fields, late_bytes, late_commands) = (
        measured.values()
    )
    assert late_fields <= 2 and late_bytes <= early_bytes + 16, measured
    assert late_commands == early_commands, measured
    fields = _turn_fields(raw_client, thread)
    assert max(len(v) for v in fields.values()) <= 80
    assert len(fields) >= INTERLEAVINGS  # one field per range

    # list(turn_id) pages through every range, both ways and from cursors.
    def walk(order, limit):
        seen, cursor = [], None
        while True:
            page = thread.list(turn_id="t", after=cursor, limit=limit, order=order)
            seen += [m.seq_id for m in page.messages]
            if not page.has_more:
                return seen
            cursor = page.messages[-1].id

    assert walk("asc", 97) == expected
    assert walk("desc", 250) == expected[::-1]
    middle = expected[1000]
    assert [
        m.seq_id for m in thread.list(turn_id="t", before=middle, limit=3).messages
    ] == expected[997:1000]
    assert [
        m.seq_id for m in thread.list(turn_id="t", before=middle, limit=3, order="desc").messages
    ] == expected[1001:1004][::-1]
    page = thread.list(turn_id="t", after=expected[10], before=expected[14], limit=10)
    assert [m.seq_id for m in page.messages] == expected[11:14] and not page.has_more

    result = thread.finish_turn("t")
    assert (result.reply_count, result.first_sequence, result.last_sequence) == (
        len(expected),
        expected[0],
        expected[-1],
    )
    assert thread.remove_turn("t") == len(expected)
    assert not [k for k in _turn_fields(raw_client, thread) if k == b"t" or k.startswith(b"t\t")]
    assert [m.seq_id for m in thread.iter()] == [m.seq_id for m in others]
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace))


# -------------------------------------------------- records stored by an earlier version


def _old_records(raw_client, thread, records: dict[str, str]) -> None:
    """Rewrites the turns hash as the first layout-2 version kept it: "<start>|a-b,c-d"."""
    raw_client.delete(thread.keys.turns)
    raw_client.hset(thread.keys.turns, mapping=records)


def test_records_in_the_earlier_format_keep_working(make_thread, raw_client, namespace):
    thread = make_thread(window_size=4, chunk_size=2)
    thread.append(UserMessage(content="q"), turn_id="t")  # 1
    thread.start_turn("t")
    thread.append(AssistantMessage(content="a1"), turn_id="t")  # 2
    thread.append(UserMessage(content="other"), turn_id="o")  # 3
    thread.append(AssistantMessage(content="a2"), turn_id="t")  # 4
    thread.append(UserMessage(content="other"), turn_id="o")  # 5
    thread.append(AssistantMessage(content="a3"), turn_id="t")  # 6
    _old_records(raw_client, thread, {"t": "2|1-2,4-4,6-6", "o": "0|3-3,5-5"})
    assert [m.seq_id for m in thread.list(turn_id="t").messages] == [1, 2, 4, 6]
    assert [m.seq_id for m in thread.list(turn_id="t", after=2, limit=1).messages] == [4]
    assert [m.seq_id for m in thread.list(turn_id="t", order="desc", limit=2).messages] == [6, 4]
    # The next write of a turn converts its record.
    thread.append(AssistantMessage(content="a4"), turn_id="t")  # 7
    assert b"|" not in raw_client.hget(thread.keys.turns, "t")
    assert raw_client.hget(thread.keys.turns, "o") == b"0|3-3,5-5"
    assert [m.seq_id for m in thread.list(turn_id="t").messages] == [1, 2, 4, 6, 7]
    result = thread.finish_turn("t")
    assert (result.reply_count, result.first_sequence, result.last_sequence) == (4, 2, 7)
    assert thread.start_turn("t") == 2
    assert thread.remove_turn("o") == 2
    assert thread.remove_turn("t") == 5
    assert thread.stats().stored_messages == 0 and raw_client.hlen(thread.keys.turns) == 0
    check_layout(
        raw_client, thread.keys, StoreConfig(namespace=namespace, window_size=4, chunk_size=2)
    )


def test_an_earlier_record_lost_to_retention_is_repaired(make_thread, raw_client):
    """The earlier version's retention dropped an open turn's record and the next reply made a
    new one with reply start 0; the turn reply sequence still names the turn."""
    thread = make_thread()
    thread.start_turn("t")  # start 1
    thread.append([AssistantMessage(content=f"a{i}") for i in range(3)], turn_id="t")
    _old_records(raw_client, thread, {"t": "0|3-3"})
    result = thread.finish_turn("t")
    assert (result.reply_count, result.first_sequence, result.last_sequence) == (1, 3, 3)
    # An earlier record of a finished turn: finishing it again returns what it counts.
    thread.start_turn("u")
    thread.append(AssistantMessage(content="u"), turn_id="u")  # 4
    thread.finish_turn("u", outcome="cancelled")
    _old_records(raw_client, thread, {"u": "4|4-4"})
    again = thread.finish_turn("u")
    assert (again.outcome, again.reply_count, again.first_sequence) == ("cancelled", 1, 4)
    # The record of the open turn was dropped, and no reply came since: the next one takes the
    # reply start from the turn reply sequence.
    assert thread.start_turn("v") == 5
    raw_client.hdel(thread.keys.turns, "v")
    late = thread.append(AssistantMessage(content="v"), turn_id="v")
    result = thread.finish_turn("v")
    assert (result.reply_count, result.first_sequence) == (1, late[0].seq_id)
