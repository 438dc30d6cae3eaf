"""The sans-IO core: every operation as a generator of requests.

An operation yields :class:`Eval` (one script call) or :class:`Batch` (native commands sent in
one round trip) and receives the reply; it returns the result. The sync and async stores are
executors that drive these generators over a client, so both share one implementation of every
operation: keys and arguments are built here, replies are parsed here (a writing script's reply
is decoded by name in kvstore/_engine/wire.py). The requests and what the operations share are in
kvstore/_engine/requests.py; messages are made ready to send in kvstore/_engine/prepare.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .. import errors
from ..messages import CompactionStats, Message, SummaryMessage
from ..models import AppendResult, MessagesPage, ThreadSnapshot, ThreadStats, TurnOutcome, TurnResult, TurnState
from .keys import ThreadKeys
from .prepare import PreparedMessage, check_token, fit_media, prepare_batch, stored_date
from .record import decode_records, salvage
from .requests import (
    DELETE_STEP,
    ITER_PAGE,
    MAX_LIMIT,
    MAX_READ_ATTEMPTS,
    MAX_TOKEN_LENGTH,
    PLAN_MAX_CHUNKS,
    REMOVE_TURN_STEP,
    SNAPSHOT_SIZE,
    TURN_OUTCOMES,
    Batch,
    Cursor,
    Eval,
    Operation,
    ThreadRef,
    delete_steps,
    finishing_deletes,
    int_or_zero,
    read_back_failed,
    write,
)
from .scripts import SCRIPTS
from .wire import (
    AppendReply,
    ChunkEntry,
    CompactReply,
    FinishTurnReply,
    LargeEntry,
    MigrateReply,
    RemoveTurnReply,
    ReplaceReply,
    RetainReply,
    StartTurnReply,
    split_chunk,
)

log = logging.getLogger("kvstore")


# --------------------------------------------------------------------------------- append


def _with_sequence(message: Message, sequence: int) -> Message:
    """Sets seq_id on a copy the store made itself (no second copy, no re-validation)."""
    message.__dict__["seq_id"] = sequence
    return message


def append(
    thread: ThreadRef, messages: Message | dict | Iterable[Message | dict], turn_id: str | None
) -> Operation:
    prepared = prepare_batch(thread.config, messages, turn_id)
    while True:
        args: list[Any] = [*thread.limits(), turn_id or "", len(prepared)]
        for item in prepared:
            args += (item.message.id, item.message.otid or "", item.media, item.record)
        try:
            reply = AppendReply.decode((yield from write(thread, SCRIPTS["append"], args)))
        except errors.InlineMediaBudget as over:
            prepared = fit_media(prepared, over.available, turn_id)
            continue
        except errors.OutcomeUnknown as unknown:
            # The ids the client made are the call's token: re-sending these messages is safe.
            unknown.messages = [item.message for item in prepared]
            raise
        break
    if reply.stored:
        first = reply.first_sequence
        return AppendResult([_with_sequence(item.message, first + i) for i, item in enumerate(prepared)])
    # Every message was already stored: a replay returns what the first call stored.
    sequences = [replayed.sequence for replayed in reply.replayed]
    try:
        found = yield from fetch_sequences(thread, sequences, missing_ok=True)
    except errors.ServerError as exc:
        raise read_back_failed("append", [item.message for item in prepared], exc) from exc
    by_sequence = {m.seq_id: m for m in found}
    stored = []
    for item, replayed in zip(prepared, reply.replayed):
        message = by_sequence.get(replayed.sequence)
        if message is None:
            # Stored, then deleted by retention before this read: named by its stored id and
            # sequence, with the content as sent.
            stored_id = replayed.id or item.message.id
            message = _with_sequence(item.message.model_copy(update={"id": stored_id}), replayed.sequence)
        stored.append(message)
    return AppendResult(stored, replayed=True)


# ---------------------------------------------------------------------------------- turns


def start_turn(thread: ThreadRef, turn_id: str) -> Operation:
    check_token("turn_id", turn_id)
    reply = yield from write(thread, SCRIPTS["start_turn"], (*thread.limits(), turn_id))
    return StartTurnReply.decode(reply).reply_start


def finish_turn(thread: ThreadRef, turn_id: str, outcome: TurnOutcome) -> Operation:
    check_token("turn_id", turn_id)
    if outcome not in TURN_OUTCOMES:
        raise errors.InvalidMessage(f"outcome {outcome!r} is not one of {', '.join(TURN_OUTCOMES)}")
    reply = FinishTurnReply.decode(
        (yield from write(thread, SCRIPTS["finish_turn"], (*thread.limits(), turn_id, outcome)))
    )
    return TurnResult(
        turn_id=turn_id,
        outcome=reply.outcome,
        reply_count=reply.reply_count,
        first_sequence=reply.first_sequence,
        last_sequence=reply.last_sequence,
    )


# ---------------------------------------------------------------------------------- reads


def _decode(
    thread: ThreadRef, entries: list[tuple[int, bytes]], unreadable: list[int] | None = None
) -> list[Message]:
    """The messages of `entries`; every read decodes here (docs/RELIABILITY.md, "One bad record").

    An unreadable record raises RecordError naming its sequence. Given `unreadable` (a page
    read), it is skipped instead, logged, and its sequence appended there in page order.
    """
    if not entries:
        return []
    if unreadable is None:
        return decode_records(entries)
    failed: list[errors.RecordError] = []
    messages = decode_records(entries, failed)
    for error in failed:
        log.warning("thread %s: skipped an unreadable record: %s", thread.keys.meta.rpartition(":")[0], error)
        unreadable.append(error.sequence)
    return messages


def fetch_sequences(
    thread: ThreadRef, sequences: Sequence[int], missing_ok: bool = False, unreadable: list[int] | None = None
) -> Operation:
    """Reads messages by sequence, in the order given (`unreadable`: as in _decode)."""
    return (yield from _fetch_located(thread, "seq", [str(s) for s in sequences], missing_ok, unreadable))


def get(thread: ThreadRef, message_id: str) -> Operation:
    return (yield from _get_one(thread, "id", message_id))


def get_by_otid(thread: ThreadRef, otid: str) -> Operation:
    return (yield from _get_one(thread, "otid", otid))


def _get_one(thread: ThreadRef, kind: Literal["id", "otid"], value: str) -> Operation:
    name = "message id" if kind == "id" else "otid"
    if not isinstance(value, str) or not value:
        raise errors.InvalidCursor(f"{name} must be a non-empty str, got {value!r}")
    found = yield from _fetch_located(thread, kind, [value], missing_ok=True)
    if not found:
        raise errors.MessageNotFound(f"no stored message has {kind} {value!r}")
    return found[0]


def _fetch_located(
    thread: ThreadRef, kind: str, targets: list[str], missing_ok: bool, unreadable: list[int] | None = None
) -> Operation:
    entries = yield from _locate_records(thread, kind, targets)
    if len(entries) < len(targets) and not missing_ok:
        raise errors.MessageNotFound(f"{len(targets) - len(entries)} messages are not stored")
    return _decode(thread, entries, unreadable)


def _locate_records(thread: ThreadRef, kind: str, targets: list[str]) -> Operation:
    """(sequence, record) of each target that is stored, by sequence or by id, in order."""
    keys = thread.keys
    for _ in range(MAX_READ_ATTEMPTS):
        reply = yield Eval(SCRIPTS["locate"], thread.script_keys, (kind, *targets))
        gen, places = reply[0], reply[2:]
        commands: list[tuple[Any, ...]] = []
        wanted: list[int] = []
        for i in range(0, len(places), 2):
            sequence, where = int(places[i]), int(places[i + 1])
            if where == -1:
                commands.append(("ZRANGE", keys.window, sequence, sequence, "BYSCORE"))
            elif where == -2:
                commands.append(("HMGET", keys.legacy, sequence))
            elif where > 0:
                commands.append(("HMGET", keys.chunk(where), "_m", "d"))
            else:
                continue
            wanted.append(sequence)
        commands.append(("HGET", keys.meta, "gen"))
        results = yield Batch(commands)
        if int_or_zero(results[-1]) != int(gen):
            continue
        entries = []
        for sequence, command, result in zip(wanted, commands, results[:-1]):
            record = split_chunk(*result).get(sequence) if command[2] == "_m" else (result[0] if result else None)
            if record is not None:
                entries.append((sequence, record))
        return entries
    raise errors.ServerError("the thread changed under every read attempt; try again")


def _score_pairs(reply: list) -> list[tuple[Any, Any]]:
    """(member, score) pairs of a WITHSCORES reply: flat in RESP2, nested in RESP3."""
    if reply and isinstance(reply[0], list):
        return [(member, score) for member, score in reply]
    return list(zip(reply[0::2], reply[1::2]))


def _cursor(value: Cursor, name: str) -> tuple[str, str]:
    if value is None:
        return "", ""
    if isinstance(value, bool):
        raise errors.InvalidCursor(f"{name} must be a message id or a sequence, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise errors.InvalidCursor(f"{name} sequence must be >= 0, got {value}")
        return "seq", str(value)
    if isinstance(value, str) and value and len(value) <= MAX_TOKEN_LENGTH:
        return "id", value
    raise errors.InvalidCursor(f"{name} must be a message id or a sequence, got {value!r}")


def list_page(
    thread: ThreadRef,
    after: Cursor = None,
    before: Cursor = None,
    limit: int = 50,
    order: Literal["asc", "desc"] = "asc",
    turn_id: str | None = None,
) -> Operation:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidCursor(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    if order not in ("asc", "desc"):
        raise errors.InvalidCursor(f"order must be 'asc' or 'desc', got {order!r}")
    after_c, before_c = _cursor(after, "after"), _cursor(before, "before")
    if turn_id is not None:
        check_token("turn_id", turn_id)
        return (yield from _turn_page(thread, after_c, before_c, limit, order, turn_id))
    # In ascending order `after` is the lower bound; in descending order it is the upper one.
    # With only `before`, the page is the one next to the cursor, so the walk starts there.
    if order == "asc":
        low, high = after_c, before_c
        walk = "down" if before_c[0] and not after_c[0] else "up"
    else:
        low, high = before_c, after_c
        walk = "up" if before_c[0] and not after_c[0] else "down"
    entries, has_more, deleted_before = yield from _walk(thread, low, high, walk, limit + 1)
    # The page goes on from the entry farthest from its cursor: the last one of the walk.
    next_cursor = entries[-1][0] if has_more else None
    if (walk == "up") != (order == "asc"):
        entries.reverse()
    unreadable: list[int] = []
    return MessagesPage(
        messages=_decode(thread, entries, unreadable),
        has_more=has_more,
        deleted_before_sequence=deleted_before or None,
        next_cursor=next_cursor,
        unreadable=unreadable,
    )


def pages(
    thread: ThreadRef, order: Literal["asc", "desc"] = "asc", after: Cursor = None, limit: int = ITER_PAGE
) -> Generator[Eval | Batch | MessagesPage, Any, None]:
    """Every kept message from `after` on, a page at a time: the one page loop, used by
    ``iter`` (sync and async) and by ``context``.

    Besides its requests, it yields each page as it is read: an output, which the executor
    hands to its caller (``stream``) and answers with None.
    """
    while True:
        page = yield from list_page(thread, after=after, limit=limit, order=order)
        yield page
        if page.next_cursor is None:
            return
        after = page.next_cursor


def gathering(operation: Generator[Any, Any, Any], sink: Callable[[Any], None]) -> Operation:
    """Runs an operation that also yields outputs (``pages``) inside another: its requests go
    out as they are (a typed error thrown back into it), its outputs go to `sink`."""
    reply: Any = None
    failure: errors.KVStoreError | None = None
    while True:
        try:
            item = operation.throw(failure) if failure is not None else operation.send(reply)
        except StopIteration as done:
            return done.value
        reply, failure = None, None
        if isinstance(item, (Eval, Batch)):
            try:
                reply = yield item
            except errors.KVStoreError as exc:
                failure = exc
        else:
            sink(item)


def _walk(
    thread: ThreadRef, low: tuple[str, str], high: tuple[str, str], walk: str, need: int
) -> Operation:
    """Collects up to `limit` = need - 1 records of the range in walk order.

    Returns (entries, has_more, deleted_before); entries are (sequence, record) pairs.
    """
    keys = thread.keys
    if walk == "down" and not low[0] and not high[0]:
        newest = yield from _newest(thread, need)
        if newest is not None:
            return newest

    collected: list[tuple[int, bytes]] = []
    attempts = 0
    while True:
        remaining = need - len(collected)
        # Enough chunks for the page when they are full; short ones make the walk plan again.
        max_chunks = min(PLAN_MAX_CHUNKS, remaining // thread.config.chunk_size + 2)
        plan = yield from _plan(thread, low, high, walk, remaining, max_chunks)
        lo, hi, bound = plan.lo, plan.hi, plan.bound
        # A page planned again may meet a later retention; what it collected before is as of
        # the first plan, so the page reports the first plan's deleted_before.
        deleted_before = plan.deleted_before if not collected else deleted_before

        upward = walk == "up"
        commands: list[tuple[Any, ...]] = []
        if plan.window:
            if upward:
                commands.append(("ZRANGE", keys.window, f"({lo}", f"({hi}", "BYSCORE", "LIMIT", 0, need, "WITHSCORES"))
            else:
                commands.append(("ZRANGE", keys.window, f"({hi}", f"({lo}", "BYSCORE", "REV", "LIMIT", 0, need, "WITHSCORES"))
        legacy_sequences = []
        for first, last, kind in plan.chunks:
            if kind == 0:
                commands.append(("HMGET", keys.chunk(first), "_m", "d"))
                continue
            # The legacy hash of a layout-1 thread can span more than a page: read only the
            # walk's end of it, and trust the result only that far.
            sequences = list(range(max(first, lo + 1), min(last, hi - 1) + 1))
            if len(sequences) > need:
                sequences = sequences[:need] if upward else sequences[-need:]
                bound = min(bound, sequences[-1]) if upward else max(bound, sequences[0])
            legacy_sequences = sequences
            commands.append(("HMGET", keys.legacy, *sequences))
        for sequence in plan.large:
            commands.append(("HMGET", keys.chunk(sequence), "_m", "d"))
        complete = bound >= hi if upward else bound <= lo
        if not commands:  # nothing in the range: nothing to fetch, nothing to compare
            return collected, False, deleted_before
        commands.append(("HGET", keys.meta, "gen"))
        results = yield Batch(commands)

        if int_or_zero(results[-1]) != plan.gen:
            attempts += 1
            if attempts >= MAX_READ_ATTEMPTS:
                raise errors.ServerError("the thread changed under every read attempt; try again")
            continue

        found: dict[int, bytes] = {}
        position = 0
        if plan.window:
            for member, score in _score_pairs(results[0]):
                found[int(float(score))] = member
            position = 1
        for _first, _last, kind in plan.chunks:
            if kind == 0:
                found.update(split_chunk(*results[position]))
            else:
                for sequence, record in zip(legacy_sequences, results[position]):
                    if record is not None:
                        found[sequence] = record
            position += 1
        for _sequence in plan.large:
            found.update(split_chunk(*results[position]))
            position += 1

        ordered = sorted(
            (s for s in found if lo < s < hi and (s <= bound if upward else s >= bound)),
            reverse=not upward,
        )
        for sequence in ordered[: need - len(collected)]:
            collected.append((sequence, found[sequence]))
        if len(collected) >= need:
            return collected[: need - 1], True, deleted_before
        if complete:
            return collected, False, deleted_before
        # Holes left the planned chunks short: plan again past what was read.
        if upward:
            low = ("seq", str(bound))
        else:
            high = ("seq", str(bound))


def _newest(thread: ThreadRef, need: int) -> Operation:
    """The newest page in one round trip of native reads, or None when it must be planned.

    The window holds the newest messages (docs/LAYOUT.md, "Invariants"). Its members are read
    without their scores (Redis 7.0 prints each score of a WITHSCORES reply as a double: 51 of
    them cost twice the records), and the sequences follow from two numbers: the score of the
    `need`-th newest member and meta's last_seq, read after the window. Window messages have
    distinct sequences, none above last_seq, so `need` of them from that score up to a last_seq
    `need - 1` above it are every sequence in between. A window shorter than `need` that holds
    last_seq messages is the whole thread. Anything else (an oversized or removed message among
    the newest, an append in between) is read through the plan.
    """
    keys = thread.keys
    members, bottom, (deleted_before, deleting, last_seq) = yield Batch(
        [
            ("ZRANGE", keys.window, 0, need - 1, "REV"),
            ("ZRANGE", keys.window, need - 1, need - 1, "REV", "WITHSCORES"),
            ("HMGET", keys.meta, "deleted_before", "deleting", "last_seq"),
        ]
    )
    if deleting is not None:  # an interrupted delete(): the thread reads as empty
        return [], False, 0
    last = int_or_zero(last_seq)
    if len(members) == need:
        (member, score), *_ = _score_pairs(bottom) or [(None, 0)]
        # The member compared: an append between the two reads shifts the ranks.
        if member != members[-1] or last - int(float(score)) != need - 1:
            return None
        return [(last - i, m) for i, m in enumerate(members[:-1])], True, int_or_zero(deleted_before)
    if members and len(members) == last:
        return [(last - i, m) for i, m in enumerate(members)], False, int_or_zero(deleted_before)
    return None


@dataclass(frozen=True, slots=True)
class _Facts:
    """What a page plan reads (lua/page_plan.lua's reply, or _native_facts): the range
    (exclusive bounds, clamped), index members near it and the legacy range of a layout-1 thread."""

    gen: int
    deleted_before: int
    lo: int
    hi: int
    window_count: int  # walk down: the window's messages in the range
    chunks: list[tuple[int, int, int, int]]  # (first, last, count, kind) in walk order
    large: list[int]  # oversized messages in the range, in walk order, at most `need`
    legacy: tuple[int, int, int, int] | None


@dataclass(frozen=True, slots=True)
class _Plan:
    """The containers holding the walk's next messages; complete up to `bound` (walk up:
    sequences <= bound; down: >= bound), past which the walk plans again."""

    gen: int
    deleted_before: int
    lo: int
    hi: int
    bound: int
    window: bool
    chunks: list[tuple[int, int, int]]  # (first, last, kind): kind 0 a chunk, 1 the legacy hash
    large: list[int]


def _plan(
    thread: ThreadRef, low: tuple[str, str], high: tuple[str, str], walk: str, need: int, max_chunks: int
) -> Operation:
    """Plans the walk's next `need` messages: with native reads for sequence cursors on a
    layout-2 thread, through lua/page_plan.lua for an id cursor or a layout-1 thread."""
    facts = None
    if low[0] != "id" and high[0] != "id":
        facts = yield from _native_facts(thread, low, high, walk, need, max_chunks)
    if facts is None:
        reply = yield Eval(
            SCRIPTS["page_plan"], thread.script_keys, (low[0], low[1], high[0], high[1], walk, need, max_chunks)
        )
        facts = _script_facts(reply)
    return _select(facts, walk, need, max_chunks)


def _native_facts(
    thread: ThreadRef, low: tuple[str, str], high: tuple[str, str], walk: str, need: int, max_chunks: int
) -> Operation:
    """The facts of a plan from one pipeline of native reads, or None for a layout-1 thread.

    The pipeline is not atomic, so it reads meta's gen and last_seq first and last: equal, no
    message moved, went or came in between (an append moves last_seq; whatever moves or removes
    a message moves gen; a replace in place changes no chunk's range), and the reads in between
    saw one state. The reads take the cursors as they are: nothing is stored below
    deleted_before (retention deletes everything there), so the clamp to it, applied after,
    changes no index read.
    """
    keys = thread.keys
    lo_arg = low[1] if low[0] else "0"
    hi_arg = f"({high[1]}" if high[0] else "+inf"
    if walk == "up":
        reads = [
            ("ZRANGE", keys.chunk_index, lo_arg, "-inf", "BYSCORE", "REV", "LIMIT", 0, 1),
            ("ZRANGE", keys.chunk_index, f"({lo_arg}", hi_arg, "BYSCORE", "LIMIT", 0, max_chunks + 1),
            ("ZRANGE", keys.large_index, f"({lo_arg}", hi_arg, "BYSCORE", "LIMIT", 0, need),
        ]
    else:
        reads = [
            ("ZCOUNT", keys.window, f"({lo_arg}", hi_arg),
            ("ZRANGE", keys.chunk_index, hi_arg, "-inf", "BYSCORE", "REV", "LIMIT", 0, max_chunks + 1),
            ("ZRANGE", keys.large_index, hi_arg, f"({lo_arg}", "BYSCORE", "REV", "LIMIT", 0, need),
        ]
    for _ in range(MAX_READ_ATTEMPTS):
        meta, legacy, near, chunks, large, again = yield Batch(
            [
                ("HMGET", keys.meta, "gen", "deleted_before", "last_seq", "deleting", "layout"),
                ("EXISTS", keys.legacy),
                *reads,
                ("HMGET", keys.meta, "gen", "last_seq"),
            ]
        )
        gen, deleted_before, last_seq, deleting, layout = meta
        if deleting is not None:  # an interrupted delete(): the thread reads as empty
            return _Facts(int_or_zero(gen), 0, 0, 1, 0, [], [], None)
        if layout == b"1" or (layout is None and legacy):
            return None
        if [gen, last_seq] != again:
            continue
        deleted_before, last = int_or_zero(deleted_before), int_or_zero(last_seq)
        lo = int(lo_arg)
        if deleted_before > 0 and lo < deleted_before - 1:
            lo = deleted_before - 1
        hi = int(high[1]) if high[0] else last + 1
        hi = min(hi, last + 1)
        # Walk up: `near` is the chunk at or before the cursor; walk down: the window's count.
        if walk == "up":
            window_count, members = 0, near + chunks
        else:
            window_count = int(near)
            members = chunks if window_count < need else []
        return _Facts(
            int_or_zero(gen),
            deleted_before,
            lo,
            hi,
            window_count,
            [_chunk_candidate(m) for m in members],
            [s for s in map(_large_sequence, large) if lo < s < hi][:need],
            None,
        )
    raise errors.ServerError("the thread changed under every read attempt; try again")


def _script_facts(reply: list) -> _Facts:
    """The facts lua/page_plan.lua replies."""
    gen, deleted_before, lo, hi, window_count, below, above_count = reply[:7]
    above_end = 7 + int(above_count)
    members = ([below] if below else []) + reply[7:above_end]
    large_end = above_end + 1 + int(reply[above_end])
    legacy_first, legacy_last, legacy_count = (int(v) for v in reply[large_end : large_end + 3])
    return _Facts(
        int(gen),
        int(deleted_before),
        int(lo),
        int(hi),
        int(window_count),
        [_chunk_candidate(m) for m in members],
        [_large_sequence(m) for m in reply[above_end + 1 : large_end]],
        (legacy_first, legacy_last, legacy_count, 1) if legacy_last else None,
    )


def _chunk_candidate(member: bytes) -> tuple[int, int, int, int]:
    """(first, last, count, kind 0) of a chunk index member."""
    entry = ChunkEntry.parse(member)
    return entry.first, entry.last, entry.count, 0


def _large_sequence(member: bytes) -> int:
    return LargeEntry.parse(member).sequence


def _select(facts: _Facts, walk: str, need: int, max_chunks: int) -> _Plan:
    """Names the containers holding the next `need` messages of the walk: chunks by their index
    counts, then the window if the walk reaches it (walk down starts from the window)."""
    lo, hi = facts.lo, facts.hi
    upward = walk == "up"

    def in_range(first: int, last: int, count: int) -> int:
        """How many of a chunk's messages can lie inside (lo, hi): at most its count and span."""
        a, b = max(first, lo + 1), min(last, hi - 1)
        return 0 if b < a else min(count, b - a + 1)

    candidates = facts.chunks
    if facts.legacy is not None:
        # The legacy hash, put among the chunks in walk order.
        at = next((i for i, c in enumerate(candidates) if (facts.legacy[0] < c[0]) == upward), len(candidates))
        candidates = [*candidates[:at], facts.legacy, *candidates[at:]]

    chunks: list[tuple[int, int, int]] = []
    window, bound = False, hi if upward else lo
    if hi - lo <= 1:
        return _Plan(facts.gen, facts.deleted_before, lo, hi, bound, window, chunks, [])
    if upward:
        acc, stopped = 0, False
        for first, last, count, kind in candidates:
            n = in_range(first, last, count)
            if n == 0:
                continue
            if acc >= need or len(chunks) >= max_chunks:
                stopped = True
                break
            chunks.append((first, last, kind))
            acc += n
            bound = last
        if not stopped and acc < need:
            window, bound = True, hi
    else:
        window = True
        acc = facts.window_count
        if acc < need:
            for first, last, count, kind in candidates:
                if last <= lo:
                    break
                n = in_range(first, last, count)
                if n == 0:
                    continue
                if acc >= need or len(chunks) >= max_chunks:
                    bound = chunks[-1][0] if chunks else lo
                    break
                chunks.append((first, last, kind))
                acc += n
    return _Plan(facts.gen, facts.deleted_before, lo, hi, bound, window, chunks, facts.large)


def _turn_page(
    thread: ThreadRef,
    after: tuple[str, str],
    before: tuple[str, str],
    limit: int,
    order: str,
    turn_id: str,
) -> Operation:
    """A page of the turn's messages: lua/turn_page.lua reads the sequences from the turn's
    record, as much of it as the page needs; the messages are then read by sequence."""
    if order == "asc":
        (lo_kind, lo), (hi_kind, hi) = after, before
    else:
        (lo_kind, lo), (hi_kind, hi) = before, after
    # The page starts next to `after`, or next to `before` when only that is given.
    from_before = bool(before[0]) and not after[0]
    walk = "up" if (order == "asc") != from_before else "down"
    reply = yield Eval(SCRIPTS["turn_page"], thread.script_keys, (turn_id, lo_kind, lo, hi_kind, hi, walk, limit))
    deleted_before, has_more = int(reply[0]), bool(int(reply[1]))
    page = [int(s) for s in reply[2:]]
    if from_before:
        page.reverse()
    # The page goes on from the sequence farthest from its cursor.
    next_cursor = (page[0] if from_before else page[-1]) if has_more and page else None
    unreadable: list[int] = []
    messages = yield from fetch_sequences(thread, page, missing_ok=True, unreadable=unreadable)
    return MessagesPage(
        messages=messages,
        has_more=has_more,
        deleted_before_sequence=deleted_before or None,
        next_cursor=next_cursor,
        unreadable=unreadable,
    )


def _stats_commands(keys: ThreadKeys) -> list[tuple[Any, ...]]:
    return [
        ("HGETALL", keys.meta),
        ("ZCARD", keys.window),
        ("ZCARD", keys.chunk_index),
        ("ZCARD", keys.large_index),
        ("HLEN", keys.legacy),
    ]


def stats(thread: ThreadRef) -> Operation:
    meta, window, chunks, large, legacy = yield Batch(_stats_commands(thread.keys))
    return _stats_from(meta, window, chunks + large, legacy)


def _stats_from(meta: dict, window: int, chunks: int, legacy: int) -> ThreadStats:
    fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in meta.items()}
    if "deleting" in fields:  # an interrupted delete(): the thread reads as empty
        fields, window, chunks, legacy = {}, 0, 0, 0

    def number(name: str) -> int | None:
        value = fields.get(name)
        return int(value) if value is not None else None

    stored = number("stored") or 0
    layout = number("layout")
    if legacy and layout != 2 and number("legacy_last") is None:
        # A layout-1 thread no write has touched yet: its messages are all in the legacy hash.
        stored += legacy
        layout = 1
    return ThreadStats(
        stored_messages=stored,
        window_messages=window,
        chunks=chunks,
        stored_bytes=number("bytes") or 0,
        media_bytes=number("media") or 0,
        next_sequence=(number("last_seq") or 0) + 1,
        deleted_before_sequence=number("deleted_before") or None,
        summary_last_sequence=number("summary_last"),
        layout_version=layout,
    )


def snapshot(thread: ThreadRef) -> Operation:
    """The newest page, the summary, the turn and the stats, as of one state of the thread.

    The stats are read before the page and checked after it: an append, a move or a compaction
    in between (last_seq, gen or summary_seq changed) makes the snapshot read again.
    """
    keys = thread.keys
    for _ in range(MAX_READ_ATTEMPTS):
        meta, window, chunks, large, legacy = yield Batch(_stats_commands(keys))
        page = yield from list_page(thread, limit=SNAPSHOT_SIZE, order="desc")
        fields = {_text(k): _text(v) for k, v in meta.items()}
        (now,) = yield Batch([("HMGET", keys.meta, "last_seq", "gen", "summary_seq")])
        if [None if v is None else _text(v) for v in now] != [fields.get(f) for f in ("last_seq", "gen", "summary_seq")]:
            continue
        turn = None
        if fields.get("turn_id"):
            turn = TurnState(
                turn_id=fields["turn_id"],
                sequence=int(fields["turn_seq"]),
                outcome=fields.get("turn_outcome") or "open",
            )
        unreadable = list(page.unreadable)
        summary = yield from _summary(thread, fields, unreadable)
        return ThreadSnapshot(
            messages=list(reversed(page.messages)),
            summary=summary,
            turn=turn,
            stats=_stats_from(meta, window, chunks + large, legacy),
            unreadable=sorted(set(unreadable)),
        )
    raise errors.ServerError("the thread changed under every read attempt; try again")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _summary(thread: ThreadRef, fields: dict[str, str], unreadable: list[int]) -> Operation:
    """The context summary named by meta, or None (also when its record is unreadable)."""
    if not fields.get("summary_seq"):
        return None
    found = yield from fetch_sequences(thread, [int(fields["summary_seq"])], missing_ok=True, unreadable=unreadable)
    summary = found[0] if found else None
    return summary if isinstance(summary, SummaryMessage) else None


# ------------------------------------------------------------------------------ lifecycle


def compact(
    thread: ThreadRef, summary: str, last_sequence: int, stats: CompactionStats | dict | None = None
) -> Operation:
    if isinstance(last_sequence, bool) or not isinstance(last_sequence, int) or last_sequence < 1:
        raise errors.InvalidSummaryRange(f"last_sequence must be a positive int, got {last_sequence!r}")
    message = {"message_type": "summary_message", "summary": summary, "compaction_stats": stats}
    (item,) = prepare_batch(thread.config, message, None)
    while True:
        args = [*thread.limits(), last_sequence, item.message.id, item.message.otid or "", item.media, item.record]
        try:
            reply = CompactReply.decode((yield from write(thread, SCRIPTS["compact"], args)))
        except errors.InlineMediaBudget as over:
            (item,) = fit_media([item], over.available, None)
            continue
        break
    # A replay runs retention again: the first call's caller may not have finished it.
    deleted = reply.chunks_deleted if reply.stored else thread.config.max_chunks_per_call
    try:
        # Each call deletes at most max_chunks_per_call chunks; go on while that cap was reached.
        while deleted >= thread.config.max_chunks_per_call:
            retained = yield Eval(SCRIPTS["retain"], thread.script_keys, thread.limits())
            deleted = RetainReply.decode(retained).chunks_deleted
        if not reply.stored:
            found = yield from fetch_sequences(thread, [reply.summary_sequence])
            return found[0]
    except errors.OutcomeUnknown as unknown:
        unknown.messages = [item.message]
        raise
    except errors.ServerError as exc:
        raise read_back_failed("compact", [item.message], exc) from exc
    return item.message.model_copy(update={"seq_id": reply.summary_sequence})


def context(thread: ThreadRef) -> Operation:
    """The model input: the context summary and every message after its last sequence.

    It takes several round trips; a compaction landing between them would pair the old summary
    with pages cut by the new retention. Summaries only move forward (each is a new message with
    a new sequence), so an unchanged `summary_seq` after the last page means no compaction ran
    in between; otherwise the read starts again.
    """
    keys = thread.keys
    for _ in range(MAX_READ_ATTEMPTS):
        (meta,) = yield Batch([("HMGET", keys.meta, "summary_last", "summary_seq", "deleted_before")])
        summary_last, summary_seq, deleted_before = meta
        messages: list[Message] = []
        after: Cursor = None
        if summary_seq is not None:
            summary = yield from _summary(thread, {"summary_seq": _text(summary_seq)}, [])
            if summary is not None:
                messages.append(summary)
            after = int(summary_last)
        elif deleted_before is not None:
            log.warning(
                "thread %s has deleted messages (before sequence %s) but no summary: its model input"
                " starts mid-conversation",
                keys.meta,
                _text(deleted_before),
            )
        skip = int(summary_seq) if summary_seq is not None else None
        read: list[MessagesPage] = []
        yield from gathering(pages(thread, after=after, limit=MAX_LIMIT), read.append)
        messages += [m for page in read for m in page.messages if m.seq_id != skip]
        (now,) = yield Batch([("HGET", keys.meta, "summary_seq")])
        if now == summary_seq:
            return messages
    raise errors.ServerError("the thread was compacted under every read attempt; try again")


def replace(thread: ThreadRef, message_id: str, message: Message | dict) -> Operation:
    if not isinstance(message_id, str) or not message_id:
        raise errors.InvalidCursor(f"message id must be a non-empty str, got {message_id!r}")
    incoming = PreparedMessage.of(thread.config, message, None).message
    yield from migrate(thread)
    found = yield from _locate_records(thread, "id", [message_id])
    if not found:
        raise errors.MessageNotFound(f"no stored message has id {message_id!r}")
    # The original is not decoded, so an unreadable one can be replaced too: what a lenient read
    # of its record tells is kept (docs/RELIABILITY.md, "One bad record").
    original = salvage(found[0][1])

    def keep(body: dict[str, Any]) -> None:
        # Same id and sequence; the otid stays the original's (the otid map is not changed).
        body["id"] = message_id
        body.pop("otid", None)
        if original.otid is not None:
            body["otid"] = original.otid
        body.setdefault("date", original.date or stored_date())

    item = PreparedMessage.of(thread.config, incoming, original.turn_id, keep)
    while True:
        args = [*thread.limits(), message_id, item.media, item.record]
        try:
            reply = ReplaceReply.decode((yield Eval(SCRIPTS["replace"], thread.script_keys, args)))
        except errors.InlineMediaBudget as over:
            (item,) = fit_media([item], over.available, original.turn_id)
            continue
        return item.message.model_copy(update={"seq_id": reply.sequence})


def remove_turn(thread: ThreadRef, turn_id: str) -> Operation:
    check_token("turn_id", turn_id)
    yield from migrate(thread)
    removed = 0
    while True:
        reply = RemoveTurnReply.decode((yield Eval(
            SCRIPTS["remove_turn"], thread.script_keys, (*thread.limits(), turn_id, REMOVE_TURN_STEP)
        )))
        removed += reply.removed
        if reply.remaining == 0:
            return removed


def delete(thread: ThreadRef) -> Operation:
    """Removes every key of the thread, DELETE_STEP chunks per call.

    The first call tombstones the thread (lua/delete.lua): if the caller stops between calls,
    the thread reads as empty and the next delete, or write, finishes the job."""
    yield from delete_steps(thread.script_keys, "start")


def migrate(thread: ThreadRef, max_calls: int | None = None) -> Operation:
    """Moves a layout-1 thread into chunks, one bounded call at a time; returns the calls made.

    Stops when the thread is in layout 2 or after `max_calls` calls (None: until done).
    """
    calls = 0
    while max_calls is None or calls < max_calls:
        step = MigrateReply.decode((yield Eval(SCRIPTS["migrate"], thread.script_keys, thread.limits())))
        calls += 1
        if step.layout == 2:
            if step.fields_left:
                log.warning(
                    "thread %s is in layout 2; %d legacy fields that are not sequences were not"
                    " migrated and stay in %s",
                    thread.keys.meta, step.fields_left, thread.keys.legacy,
                )
            break
    return calls
