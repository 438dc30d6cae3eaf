"""Every number that crosses into Lua has a documented bound (docs/LAYOUT.md, "Number bounds"),
checked before the socket, and Lua writes each as the decimal integer it is: Lua 5.1 numbers
are doubles and tostring writes 1e+14 from 10**14 up. Each bound is tried at its edge: the
largest value accepted works end to end, the next is refused with a typed error and nothing
written. Stored values the client cannot read give a typed error, never a bare ValueError."""

from __future__ import annotations

import io
import json
import re

import pytest

from kvstore import StoreConfig, ToolCallMessage, ToolReturnMessage, UserMessage, errors
from kvstore._engine.bounds import MAX_CURSOR, MAX_MESSAGE_TOKENS, MAX_SEQUENCE, MAX_THREAD_TOKENS
from kvstore.events import TurnLease

from ..conftest import make_sync_store
from ..support.layout_check import check_layout
from .test_tokens import keys_of, stored_counts, users

SMALL = dict(window_size=4, chunk_size=2, chunk_max_bytes=4096, retained_message_limit=3)
DIGITS = re.compile(rb"[0-9]+")
META_NUMBERS = (
    b"last_seq",
    b"stored",
    b"bytes",
    b"window_bytes",
    b"media",
    b"tokens",
    b"turn_seq",
    b"events",
    b"gen",
    b"deleted_before",
    b"summary_last",
    b"summary_seq",
    b"fork_at",
)


def keyspace(client, namespace: str) -> dict[bytes, bytes]:
    """Every key of the test's namespace and its value, to tell that nothing was written."""
    return {key: client.dump(key) for key in sorted(client.scan_iter(match=f"{namespace}:*"))}


def text_numbers(client, keys) -> list[bytes]:
    """Every number Lua wrote as text into the thread's members, fields and event ids."""
    numbers = []
    for member in client.zrange(keys.chunk_index, 0, -1) + client.zrange(keys.large_index, 0, -1):
        numbers += member.split(b":")
        manifest = client.get(keys.chunk_manifest(int(member.split(b":")[0])))
        numbers += [line.split(b"\t")[0] for line in manifest.split(b"\n")[:-1]]
    # The open chunk's manifest lines: the sequence, then media, bytes and tokens of the side info.
    for line in (client.get(keys.open_manifest) or b"").split(b"\n")[:-1]:
        sequence, side = line.split(b"\t", 1)
        numbers += [sequence, *side.split(b"\t")[2:4], side.split(b"\t")[5]]
    numbers += [
        m[1:].split(b"\t")[0] for m in client.zrange(keys.pairs, 0, -1) if m.startswith(b"m")
    ]
    for field, side in client.hgetall(keys.window_side).items():
        numbers += [field, *side.split(b"\t")[2:4], side.split(b"\t")[5]]
    for field, value in client.hgetall(keys.turns).items():
        if field.endswith((b"\tholds", b"\tdeltas")):  # "\n<call id>\t<answer>" lines
            answers = [line.split(b"\t")[-1] for line in value.split(b"\n")[1:]]
            numbers += [n for answer in answers for n in re.split(rb"[:\-]", answer)]
        elif field.startswith(b"\tidle\t"):  # "<last_seq>\t<turn id>"
            numbers.append(value.split(b"\t")[0])
        else:  # a turn record, a lease, the idle list's bounds
            numbers += [n for n in re.split(rb"[:\-]", value) if not n.isalpha()]
    for entry_id, _ in client.xrange(keys.events):
        numbers += entry_id.split(b"-")
    meta = client.hgetall(keys.meta)
    numbers += [meta[field] for field in META_NUMBERS if field in meta]
    return numbers


# --- token counts -------------------------------------------------------------------------------


def test_the_largest_token_count_works_end_to_end(make_thread, raw_client, namespace):
    thread = make_thread(**SMALL)
    counts = [MAX_MESSAGE_TOKENS, 1, MAX_MESSAGE_TOKENS, 0, *[MAX_MESSAGE_TOKENS] * 6]
    thread.append(users(4), tokens=counts[:4])
    for i in range(4, 10, 2):  # each call rolls the oldest into chunks
        thread.append(users(2, i), tokens=counts[i : i + 2])
    keys = keys_of(thread)
    assert stored_counts(raw_client, keys) == dict(enumerate(counts, 1))
    assert thread.stats().tokens == sum(counts)
    assert [n for n in text_numbers(raw_client, keys) if not DIGITS.fullmatch(n)] == []
    assert [m.seq_id for m in thread.iter()] == list(range(1, 11))
    assert [m.seq_id for m in thread.list(limit=3).messages] == [1, 2, 3]
    assert [m.seq_id for m in thread.context(max_tokens=2 * MAX_MESSAGE_TOKENS)] == [9, 10]
    assert [m.seq_id for m in thread.context(max_tokens=MAX_MESSAGE_TOKENS - 1)] == []

    summary = thread.compact("so far", 8, tokens=MAX_MESSAGE_TOKENS)
    stats = thread.stats()
    assert stats.deleted_before_sequence is not None  # retention ran over the large counts
    kept = stored_counts(raw_client, keys)
    assert stats.tokens == sum(kept.values())
    assert kept[summary.seq_id] == MAX_MESSAGE_TOKENS
    assert [m.seq_id for m in thread.context(max_tokens=3 * MAX_MESSAGE_TOKENS)] == [
        summary.seq_id,
        9,
        10,
    ]
    check_layout(raw_client, keys, StoreConfig(namespace=namespace, **SMALL))


def test_an_export_of_the_largest_counts_imports_again(backend, namespace, raw_client, server_only):
    from kvstore.cli import backup

    source = make_sync_store(backend, StoreConfig(namespace=namespace, **SMALL))
    target = make_sync_store(backend, StoreConfig(namespace=namespace + "r", **SMALL))
    source.thread("chat").append(users(6), tokens=[MAX_MESSAGE_TOKENS] * 6)
    out = io.StringIO()
    backup.export(source, "chat", out, progress_out=io.StringIO())
    lines = [json.loads(line) for line in out.getvalue().splitlines()[1:] if '"tokens"' in line]
    assert [line["tokens"] for line in lines] == [MAX_MESSAGE_TOKENS] * 6
    backup.import_lines(
        target,
        "chat",
        io.StringIO(out.getvalue()),
        backup.ImportProgress(),
        progress_out=io.StringIO(),
    )
    assert target.thread("chat").stats().tokens == 6 * MAX_MESSAGE_TOKENS
    # One past the bound in a backup is refused before anything of its line is stored.
    bad = out.getvalue().replace(f'"tokens":{MAX_MESSAGE_TOKENS}', f'"tokens":{10**14}', 1)
    with pytest.raises(errors.InvalidMessage, match="line 2"):
        backup.import_lines(
            target, "other", io.StringIO(bad), backup.ImportProgress(), progress_out=io.StringIO()
        )
    assert not target.thread("other").stats().stored_messages
    source.close()
    target.close()


@pytest.mark.parametrize("tokens", [MAX_MESSAGE_TOKENS + 1, 10**14, 10**30])
def test_a_token_count_past_its_bound_is_refused_and_nothing_is_written(
    make_thread, raw_client, namespace, tokens
):
    thread = make_thread(**SMALL)
    (stored,) = thread.append(UserMessage(content="kept"), tokens=MAX_MESSAGE_TOKENS)
    before = keyspace(raw_client, namespace)
    with pytest.raises(errors.InvalidMessage, match="2147483648"):
        thread.append(users(2), tokens=[1, tokens])
    with pytest.raises(errors.InvalidMessage):
        thread.append(UserMessage(content="one"), tokens=tokens)
    with pytest.raises(errors.InvalidMessage):
        thread.replace(stored.id, UserMessage(content="new"), tokens=tokens)
    with pytest.raises(errors.InvalidMessage):
        thread.compact("s", 1, tokens=tokens)
    counting = make_thread(count_tokens=lambda message: tokens, **SMALL)
    with pytest.raises(errors.InvalidMessage, match="token counter"):
        counting.append(users(1))
    assert keyspace(raw_client, namespace) == before
    assert thread.stats().tokens == MAX_MESSAGE_TOKENS


def test_a_thread_total_past_its_bound_is_refused_and_nothing_is_written(
    make_thread, raw_client, namespace
):
    thread = make_thread(**SMALL)
    (first,) = thread.append(UserMessage(content="first"), tokens=5)
    # A thread that holds the most its total may (as if its messages counted that much).
    raw_client.hset(keys_of(thread).meta, "tokens", MAX_THREAD_TOKENS - 3)
    thread.append(UserMessage(content="fits"), tokens=3)
    assert thread.stats().tokens == MAX_THREAD_TOKENS
    before = keyspace(raw_client, namespace)
    with pytest.raises(errors.MessageTooLarge, match="token"):
        thread.append(UserMessage(content="one more"), tokens=1)
    with pytest.raises(errors.MessageTooLarge, match="token"):
        thread.replace(first.id, UserMessage(content="larger"), tokens=6)
    with pytest.raises(errors.MessageTooLarge, match="token"):
        thread.compact("s", 1, tokens=1)
    assert keyspace(raw_client, namespace) == before
    thread.replace(first.id, UserMessage(content="smaller"), tokens=4)
    assert thread.stats().tokens == MAX_THREAD_TOKENS - 1


# --- sequences ----------------------------------------------------------------------------------


def start_at(client, keys, last_seq: int) -> None:
    """A thread with no message whose last sequence is `last_seq`, as a restore leaves one."""
    client.hset(
        keys.meta,
        mapping={
            "layout": "2",
            "last_seq": last_seq,
            "stored": 0,
            "bytes": 0,
            "window_bytes": 0,
            "media": 0,
            "tokens": 0,
        },
    )


def test_sequences_past_10_to_the_14_are_written_as_digits(make_thread, raw_client, namespace):
    config = dict(SMALL, history_checks="strict")
    thread = make_thread(**config)
    keys = keys_of(thread)
    base = MAX_SEQUENCE - 19
    assert base > 10**14
    start_at(raw_client, keys, base)
    thread.append(users(6))  # the window takes 4: the call cuts its own messages into chunks
    assert thread.start_turn("turn-1") == base + 7
    thread.append(users(3), turn_id="turn-1")
    thread.append(
        ToolCallMessage(tool_call={"name": "f", "arguments": "{}", "tool_call_id": "call-1"}),
        turn_id="turn-1",
    )
    thread.append(
        ToolReturnMessage(tool_call_id="call-1", tool_return="ok", status="success"),
        turn_id="turn-1",
    )
    thread.publish("turn-1", "delta")
    thread.finish_turn("turn-1")
    for i in range(3):
        thread.append(users(2, 10 + 2 * i))
    assert thread.stats().next_sequence == base + 18
    assert [n for n in text_numbers(raw_client, keys) if not DIGITS.fullmatch(n)] == []
    assert [m.seq_id for m in thread.iter()] == list(range(base + 1, base + 18))
    assert [m.seq_id for m in thread.list(after=base + 2, limit=2).messages] == [base + 3, base + 4]
    assert [m.seq_id for m in thread.list(after=base + 17, limit=2, order="desc").messages] == [
        base + 16,
        base + 15,
    ]
    assert [m.seq_id for m in thread.list(turn_id="turn-1", limit=10).messages] == list(
        range(base + 7, base + 12)
    )
    third = thread.list(after=base + 2, limit=1).messages[0]
    assert thread.get(third.id).seq_id == base + 3
    assert [m.seq_id for m in thread.list(after=third.id, limit=1).messages] == [base + 4]
    assert len(thread.context(max_tokens=10**6)) == 17

    summary = thread.compact("so far", base + 8)
    assert summary.seq_id == base + 18
    assert (thread.stats().deleted_before_sequence or 0) > base + 1
    assert thread.remove_turn("turn-1") >= 0
    check_layout(raw_client, keys, StoreConfig(namespace=namespace, **config))

    # The last sequence a thread may hold is MAX_SEQUENCE; a write past it is refused.
    thread.append(users(1))
    assert thread.stats().next_sequence == MAX_SEQUENCE + 1
    before = keyspace(raw_client, namespace)
    with pytest.raises(errors.MessageTooLarge, match="sequence"):
        thread.append(users(1))
    with pytest.raises(errors.MessageTooLarge, match="sequence"):
        thread.compact("again", MAX_SEQUENCE)
    assert keyspace(raw_client, namespace) == before
    assert thread.list(after=MAX_SEQUENCE - 1, limit=5).messages[0].seq_id == MAX_SEQUENCE


def test_positions_past_their_bound_are_refused_before_the_socket(
    make_thread, raw_client, namespace
):
    thread = make_thread(**SMALL)
    thread.append(users(3))
    before = keyspace(raw_client, namespace)
    assert thread.list(after=MAX_CURSOR).messages == []
    assert thread.list(after=MAX_CURSOR, order="desc", limit=5).messages[0].seq_id == 3
    assert thread.list(before=MAX_CURSOR, limit=5).messages[0].seq_id == 1
    for call in (
        lambda: thread.list(after=MAX_CURSOR + 1),
        lambda: thread.list(before=MAX_CURSOR + 1, order="desc"),
        lambda: thread.list(after=10**30, turn_id="t"),
        lambda: thread.fork("copy", at=MAX_SEQUENCE + 1),
        lambda: thread.context(max_tokens=MAX_THREAD_TOKENS + 1),
        lambda: thread.watch(after=MAX_SEQUENCE + 1),
        lambda: thread.watch(after=f"{MAX_SEQUENCE + 1}-1"),
        lambda: thread.watch(block_ms=-1),
        lambda: thread.watch(block_ms=2**31),
    ):
        with pytest.raises(errors.InvalidCursor):
            call()
    with pytest.raises(errors.InvalidSummaryRange):
        thread.compact("s", MAX_SEQUENCE + 1)
    for lease in (
        TurnLease("turn-1", MAX_SEQUENCE + 1, 1),
        TurnLease("turn-1", -1, 1),
        TurnLease("turn-1", 1.5, 1),
    ):
        with pytest.raises(errors.InvalidMessage):
            thread.append(users(1), turn_id=lease)
        with pytest.raises(errors.InvalidMessage):
            thread.publish(lease, "delta")
        with pytest.raises(errors.InvalidMessage):
            thread.finish_turn(lease)
    assert thread.context(max_tokens=MAX_THREAD_TOKENS)[-1].seq_id == 3
    assert keyspace(raw_client, namespace) == before


# --- config values ------------------------------------------------------------------------------


def test_a_store_at_every_config_maximum_works(make_thread, raw_client, namespace):
    from kvstore.limits import CONFIG_MAXIMA

    values = dict(CONFIG_MAXIMA)
    values["max_inline_part_bytes"] = values["max_inline_media_bytes"]
    thread = make_thread(**values)
    batch = [UserMessage(content=str(i)) for i in range(values["max_batch_messages"])]
    stored = thread.append(batch, tokens=[MAX_MESSAGE_TOKENS] * len(batch))
    assert stored[-1].seq_id == len(batch)
    thread.start_turn("t")
    thread.publish("t", "delta")
    assert thread.stats().tokens == len(batch) * MAX_MESSAGE_TOKENS
    assert len(thread.list(limit=1000).messages) == 1000
    thread.compact("s", 10)
    keys = keys_of(thread)
    assert [n for n in text_numbers(raw_client, keys) if not DIGITS.fullmatch(n)] == []
    assert raw_client.pttl(keys.meta) > 0
    check_layout(raw_client, keys, StoreConfig(namespace=namespace, **values))


# --- the read side ------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["tokens", "last_seq", "stored", "bytes", "summary_last"])
@pytest.mark.parametrize("value", [b"1e+30", b"1.0000000000000000e+30", b"twelve"])
def test_a_stored_number_the_client_cannot_read_is_a_typed_error(
    make_thread, raw_client, field, value
):
    thread = make_thread(**SMALL)
    thread.append(users(3), tokens=[1, 2, 3])
    raw_client.hset(keys_of(thread).meta, field, value)
    with pytest.raises(errors.RecordError, match=field):
        thread.stats()
    with pytest.raises(errors.RecordError):
        thread.snapshot()


def test_a_watch_of_a_stored_event_count_it_cannot_read_is_a_typed_error(
    backend, namespace, raw_client
):
    store = make_sync_store(backend, StoreConfig(namespace=namespace, **SMALL))
    thread = store.thread("thread-1")
    thread.append(users(2))
    raw_client.hset(keys_of(thread).meta, "events", b"1e+30")
    with (
        pytest.raises(errors.RecordError, match="events"),
        thread.watch(after=0, block_ms=10) as events,
    ):
        next(iter(events))
    store.close()
