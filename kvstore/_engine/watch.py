"""The live tail: holding a turn, publishing its deltas, and watching the thread's events.

Every writing script adds its event to the thread's stream in the same atomic step
(lua/includes/events.lua; docs/EVENTS.md). :func:`watch` is the sans-IO reader of that stream:
it yields :class:`ReadStream` (a blocking XREAD, sent on the watcher's own connection),
:class:`Run` (a core operation, run by the store: the native reads of the messages an event
names, and pages of stored messages) and :class:`Emit` (an event for the caller), so the sync
and the async watcher share all of it.

Resuming is exact because event n is followed by event n + 1 (the stream's ids count the
thread's events): a watcher that reads anything else after n knows the stream lost events, and
pages the stored messages from the sequence its cursor names, then goes on with the stream.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from .. import errors
from ..events import (
    Compacted,
    Delta,
    MessageReplaced,
    MessagesAdded,
    ThreadDeleted,
    ThreadEvent,
    TurnFinished,
    TurnLease,
    TurnRemoved,
    TurnStarted,
)
from ..messages import AssistantMessage, Message, parse_message
from .pages import list_page
from .prepare import check_token
from .reads import decode, fetch_sequences
from .requests import ITER_PAGE, Batch, Operation, ThreadRef, write
from .scripts import SCRIPTS

# The largest delta publish() sends.
MAX_DELTA_BYTES = 1024 * 1024
# Events one XREAD returns at most.
READ_COUNT = 100

_EVENT_ID = re.compile(r"(\d+)-(\d+)")


# ----------------------------------------------------------------------------- turn and delta


def hold_turn(thread: ThreadRef, turn_id: str) -> Operation:
    check_token("turn_id", turn_id)
    reply = yield from write(thread, SCRIPTS["start_turn"], (*thread.limits(), turn_id, "hold"))
    start, lease = reply
    return TurnLease(turn_id=turn_id, lease=int(lease), reply_start=int(start))


def encode_delta(delta: Message | dict | str) -> bytes:
    """A delta as the stream keeps it: the message's JSON in the list API's shape."""
    if isinstance(delta, str):
        delta = AssistantMessage(content=delta)
    message = parse_message(delta)
    data = message.model_dump_json(exclude_none=True).encode()
    if len(data) > MAX_DELTA_BYTES:
        raise errors.MessageTooLarge(f"a delta is {len(data)} bytes encoded; at most {MAX_DELTA_BYTES}")
    return data


def publish(thread: ThreadRef, turn: str | TurnLease, delta: Message | dict | str) -> Operation:
    if not thread.config.events:
        raise errors.ConfigError("publish() needs StoreConfig(events=True): deltas travel on the event stream")
    turn_id, lease = (turn.turn_id, turn.lease) if isinstance(turn, TurnLease) else (turn, 0)
    check_token("turn_id", turn_id)
    data = encode_delta(delta)
    reply = yield from write(thread, SCRIPTS["publish"], (*thread.limits(), turn_id, lease, data))
    return reply.decode() if isinstance(reply, bytes) else str(reply)


# ----------------------------------------------------------------------------- watching


@dataclass(frozen=True, slots=True)
class ReadStream:
    """XREAD BLOCK `block_ms` COUNT `count` STREAMS `key` `after`: the watcher's connection sends
    it; the reply is the entries, [(id, {field: value})], empty when the block timed out."""

    key: str
    after: str
    count: int
    block_ms: int


@dataclass(frozen=True, slots=True)
class Run:
    """A core operation for the store to run; the reply is its result."""

    operation: Operation


@dataclass(frozen=True, slots=True)
class Emit:
    """An event for the watcher's caller."""

    event: ThreadEvent


WatchStep = Generator[ReadStream | Run | Emit, Any, None]


def parse_cursor(after: int | str | None) -> tuple[int, int] | int | None:
    """(n, s) for an event id, s for a sequence, None for "from now on"."""
    if after is None:
        return None
    if isinstance(after, int) and not isinstance(after, bool) and after >= 0:
        return after
    if isinstance(after, str):
        if after.isdigit():
            return int(after)
        match = _EVENT_ID.fullmatch(after)
        if match:
            return int(match.group(1)), int(match.group(2))
    raise errors.InvalidCursor(
        f"a watch cursor is an event's cursor ('<n>-<s>'), a sequence (int or digits) or None; got {after!r}"
    )


def _position(thread: ThreadRef) -> Operation:
    """The stream's newest event: (n, s)."""
    keys = thread.keys
    counted, newest = yield Batch([
        ("HMGET", keys.meta, "events", "last_seq"),
        ("XREVRANGE", keys.events, "+", "-", "COUNT", 1),
    ])
    n, s = int(counted[0] or 0), int(counted[1] or 0)
    if newest:
        newest_n, newest_s = _id_numbers(newest[0][0])
        if newest_n >= n:
            n, s = newest_n, newest_s
    return n, s


def _seam(thread: ThreadRef) -> Operation:
    """The event count now, and the stream's oldest event (n, s) or None."""
    keys = thread.keys
    counted, oldest = yield Batch([
        ("HGET", keys.meta, "events"),
        ("XRANGE", keys.events, "-", "+", "COUNT", 1),
    ])
    return int(counted or 0), (_id_numbers(oldest[0][0]) if oldest else None)


def _id_numbers(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    n, _, s = text.partition("-")
    return int(n), int(s)


def watch(thread: ThreadRef, after: int | str | None, block_ms: int, messages: bool = True) -> WatchStep:
    """The events of the thread after `after`, forever (until the thread is deleted).
    `messages`: read the Messages an event names (False: its ids and sequences only)."""
    if not thread.config.events:
        raise errors.ConfigError("watch() needs StoreConfig(events=True)")
    start = parse_cursor(after)
    # n: the last event delivered (the next must be n + 1); caught_up: messages through this
    # sequence were delivered by paging, so an 'added' event at or before it is skipped.
    # last_s: the thread's last sequence at event n (every message up to it was delivered, or
    # came before the watch began).
    caught_up = 0
    if start is None:
        n, last_s = yield Run(_position(thread))
    elif isinstance(start, int):
        n, caught_up = yield from _catch_up(thread, start)
        last_s = caught_up
    else:
        n, last_s = start
    while True:
        entries = yield ReadStream(thread.keys.events, _after_id(n), READ_COUNT, block_ms)
        if not entries:
            # Quiet for block_ms: if the thread's event count went back, the thread is gone
            # (deleted, or expired) since this watcher's cursor, and its events with it.
            now, _ = yield Run(_position(thread))
            if now < n:
                yield Emit(ThreadDeleted(f"{n}-{last_s}"))
                return
        for entry_id, fields in entries:
            entry_n, entry_s = _id_numbers(entry_id)
            if entry_n != n + 1:
                # Events n + 1 .. entry_n - 1 are gone (trimmed, or the stream expired): page
                # the stored messages from the last sequence delivered, then read on.
                n, caught_up = yield from _catch_up(thread, max(last_s, caught_up))
                break
            n, last_s = entry_n, entry_s
            event = yield from _event(thread, f"{entry_n}-{entry_s}", fields, caught_up, messages)
            if event is not None:
                yield Emit(event)
            if isinstance(event, ThreadDeleted):
                return


def _after_id(n: int) -> str:
    """The XREAD id after which event n + 1 comes: every id of event n is below (n, max)."""
    return f"{n}-18446744073709551615"


def _catch_up(thread: ThreadRef, sequence: int) -> Generator[Any, Any, tuple[int, int]]:
    """Pages the stored messages after `sequence` (as MessagesAdded, paged), then says where the
    stream goes on: returns (the event to read after, the last sequence paged).

    Where the stream goes on is read first: after the events counted now, or after those it lost
    already. Every event up to there was made, so every message it stored was stored, before the
    first page read: paging gets each one, whatever is written or trimmed while it pages. Events
    lost after that read are a gap the watcher sees in the stream, and it pages again."""
    counted, oldest = yield Run(_seam(thread))
    resume = max(counted, oldest[0] - 1) if oldest else counted
    last = sequence
    while True:
        page = yield Run(list_page(thread, after=last, limit=ITER_PAGE, order="asc"))
        if page.messages:
            first_seq, last = page.messages[0].seq_id, page.messages[-1].seq_id
            yield Emit(MessagesAdded(str(last), list(page.messages), first_seq, last, paged=True,
                                     message_ids=tuple(m.id for m in page.messages)))
        if not page.has_more:
            return resume, last


def _text(value: bytes | None) -> str:
    return value.decode() if value is not None else ""


def _int(value: bytes | None) -> int:
    return int(value) if value else 0


def _event(
    thread: ThreadRef, cursor: str, raw: dict[bytes, bytes], caught_up: int, messages: bool = True
) -> Generator[Any, Any, ThreadEvent | None]:
    fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
    kind = _text(fields.get("k"))
    a, b = _int(fields.get("a")), _int(fields.get("b"))
    turn_id = _text(fields.get("t")) or None
    if kind == "added":
        if b <= caught_up:
            return None
        ids = tuple(_text(fields.get("i")).split(" ")) if fields.get("i") else ()
        found = (yield Run(_new_messages(thread, max(a, caught_up + 1), b))) if messages else []
        return MessagesAdded(cursor, found, a, b, turn_id, message_ids=ids)
    if kind == "delta":
        message = parse_message(fields["d"])
        return Delta(cursor, turn_id or "", message, _int(fields.get("l")))
    if kind == "turn_started":
        return TurnStarted(cursor, turn_id or "", a, _int(fields.get("l")))
    if kind == "turn_finished":
        return TurnFinished(cursor, turn_id or "", _text(fields.get("o")), _int(fields.get("n")), a or None, b or None)  # type: ignore[arg-type]
    if kind == "replaced":
        found = yield Run(fetch_sequences(thread, [a], missing_ok=True))
        return MessageReplaced(cursor, _text(fields.get("i")), a, found[0] if found else None)
    if kind == "turn_removed":
        return TurnRemoved(cursor, turn_id or "", _int(fields.get("n")), _int(fields.get("r")) == 0)
    if kind == "compacted":
        found = yield Run(fetch_sequences(thread, [a], missing_ok=True))
        return Compacted(cursor, found[0] if found else None, a, b)
    if kind == "deleted":
        return ThreadDeleted(cursor)
    return None  # a kind this version does not know: skipped


def _new_messages(thread: ThreadRef, first: int, last: int) -> Operation:
    """Messages first..last, just stored: one native read of the window, where new messages
    are (a record's sequence never changes hands, so what the window holds is theirs); when some
    already moved on (rollover, retention, remove_turn), the reads of any sequence."""
    (records,) = yield Batch([("ZRANGE", thread.keys.window, first, last, "BYSCORE")])
    if len(records) == last - first + 1:
        return decode(thread, list(zip(range(first, last + 1), records)))
    return list((yield from fetch_sequences(thread, list(range(first, last + 1)), missing_ok=True)))


def stream_entries(reply: Any) -> Sequence[tuple[Any, dict]]:
    """XREAD's reply as a list of (id, fields), for RESP2 and RESP3 clients."""
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3: {key: [entries]}
        (entries,) = reply.values()
        return entries[0] if len(entries) == 1 and isinstance(entries[0], list) else entries
    return reply[0][1]


