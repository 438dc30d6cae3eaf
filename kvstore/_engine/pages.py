"""Pages of a thread: list_page, and the one page loop (pages, gathering) iter and context use.

A page is a walk over the range between its cursors, up or down: the newest page in one round
trip when it can (:func:`_newest`), otherwise plan (kvstore/_engine/plan.py), fetch the planned
containers in one pipeline checked against meta's gen, merge what they hold into walk order,
and plan again past it while the page is short. A turn's page reads its sequences from the
turn's record (lua/turn_page.lua), then the messages by sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal

from .. import errors
from ..models import MessagesPage
from .bounds import MAX_CURSOR
from .keys import ThreadKeys
from .operation import (
    ITER_PAGE,
    MAX_LIMIT,
    MAX_TOKEN_LENGTH,
    OPTIMISTIC_READS,
    PLAN_MAX_CHUNKS,
    Batch,
    ChangedUnderReads,
    Cursor,
    Eval,
    Operation,
    ThreadRef,
    int_or_zero,
)
from .plan import Bound, Plan, plan_walk
from .prepare import check_token
from .reads import decode, fetch_sequences, read_range
from .replies import score_pairs, split_chunk
from .scripts import SCRIPTS

# (sequence, record) pairs, in walk order.
Entries = list[tuple[int, bytes]]


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
        messages=decode(thread, entries, unreadable),
        has_more=has_more,
        deleted_before_sequence=deleted_before or None,
        next_cursor=next_cursor,
        unreadable=unreadable,
    )


def _cursor(value: Cursor, name: str) -> Bound:
    if value is None:
        return "", ""
    if isinstance(value, bool):
        raise errors.InvalidCursor(f"{name} must be a message id or a sequence, got {value!r}")
    if isinstance(value, int):
        if not 0 <= value <= MAX_CURSOR:
            raise errors.InvalidCursor(
                f"{name} sequence must be from 0 to {MAX_CURSOR} (2**53), got {value}"
            )
        return "seq", str(value)
    if isinstance(value, str) and value and len(value) <= MAX_TOKEN_LENGTH:
        return "id", value
    raise errors.InvalidCursor(f"{name} must be a message id or a sequence, got {value!r}")


def pages(
    thread: ThreadRef,
    order: Literal["asc", "desc"] = "asc",
    after: Cursor = None,
    limit: int = ITER_PAGE,
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


# ----------------------------------------------------------------------------------- walk


def _walk(thread: ThreadRef, low: Bound, high: Bound, walk: str, need: int) -> Operation:
    """Collects up to `limit` = need - 1 records of the range in walk order.

    Returns (entries, has_more, deleted_before). When the thread changed under each optimistic
    attempt (writes moving messages between the plan and the fetch), the range is read in one
    step instead (lua/read_range.lua): a page always answers.
    """
    try:
        return (yield from _optimistic_walk(thread, low, high, walk, need))
    except ChangedUnderReads:
        read = yield from read_range(thread, low, high, walk, need)
        entries = [(sequence, record) for sequence, record, _ in read.records]
        if len(entries) >= need:
            return entries[: need - 1], True, read.deleted_before
        return entries, False, read.deleted_before


def _optimistic_walk(thread: ThreadRef, low: Bound, high: Bound, walk: str, need: int) -> Operation:
    """_walk from native reads, checked against meta's gen; ChangedUnderReads when every
    attempt met the thread changing under it."""
    if walk == "down" and not low[0] and not high[0]:
        newest = yield from _newest(thread, need)
        if newest is not None:
            return newest
    upward = walk == "up"
    collected: Entries = []
    attempts, deleted_before = 0, 0
    while True:
        remaining = need - len(collected)
        # Enough chunks for the page when they are full; short ones make the walk plan again.
        max_chunks = min(PLAN_MAX_CHUNKS, remaining // thread.config.chunk_size + 2)
        plan = yield from plan_walk(thread, low, high, walk, remaining, max_chunks)
        # A page planned again may meet a later retention; what it collected before is as of
        # the first plan, so the page reports the first plan's deleted_before.
        deleted_before = plan.deleted_before if not collected else deleted_before
        fetch = _fetch(thread.keys, plan, upward, need)
        if not fetch.commands:  # nothing in the range: nothing to fetch, nothing to compare
            return collected, False, deleted_before
        results = yield Batch([*fetch.commands, ("HGET", thread.keys.meta, "gen")])
        if int_or_zero(results[-1]) != plan.gen:
            attempts += 1
            if attempts >= OPTIMISTIC_READS:
                raise ChangedUnderReads("the thread changed under every page read attempt")
            continue
        collected += _merge(plan, fetch, results, upward)[: need - len(collected)]
        if len(collected) >= need:
            return collected[: need - 1], True, deleted_before
        complete = fetch.bound >= plan.hi if upward else fetch.bound <= plan.lo
        if complete:
            return collected, False, deleted_before
        # Holes left the planned chunks short: plan again past what was read.
        if upward:
            low = ("seq", str(fetch.bound))
        else:
            high = ("seq", str(fetch.bound))


@dataclass(frozen=True, slots=True)
class _Fetch:
    """The native reads of a plan: complete up to `bound` (the plan's, or nearer when only the
    walk's end of the legacy hash is read); `legacy` names the legacy fields read."""

    commands: list[tuple[Any, ...]]
    legacy: list[int]
    bound: int


def _fetch(keys: ThreadKeys, plan: Plan, upward: bool, need: int) -> _Fetch:
    """The reads of the planned containers, in plan order: window, chunks, oversized messages."""
    lo, hi, bound = plan.lo, plan.hi, plan.bound
    commands: list[tuple[Any, ...]] = []
    if plan.window:
        if upward:
            commands.append(
                (
                    "ZRANGE",
                    keys.window,
                    f"({lo}",
                    f"({hi}",
                    "BYSCORE",
                    "LIMIT",
                    0,
                    need,
                    "WITHSCORES",
                )
            )
        else:
            commands.append(
                (
                    "ZRANGE",
                    keys.window,
                    f"({hi}",
                    f"({lo}",
                    "BYSCORE",
                    "REV",
                    "LIMIT",
                    0,
                    need,
                    "WITHSCORES",
                )
            )
    legacy_sequences: list[int] = []
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
    return _Fetch(commands, legacy_sequences, bound)


def _merge(plan: Plan, fetch: _Fetch, results: list[Any], upward: bool) -> Entries:
    """The fetched records inside the plan's range and bound, in walk order."""
    replies = iter(results)
    found: dict[int, bytes] = {}
    if plan.window:
        for member, score in score_pairs(next(replies)):
            found[int(float(score))] = member
    for _first, _last, kind in plan.chunks:
        reply = next(replies)
        if kind == 0:
            found.update(split_chunk(*reply))
        else:
            found.update((s, r) for s, r in zip(fetch.legacy, reply, strict=False) if r is not None)
    for _sequence in plan.large:
        found.update(split_chunk(*next(replies)))
    lo, hi, bound = plan.lo, plan.hi, fetch.bound
    ordered = sorted(
        (s for s in found if lo < s < hi and (s <= bound if upward else s >= bound)),
        reverse=not upward,
    )
    return [(sequence, found[sequence]) for sequence in ordered]


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
        (member, score), *_ = score_pairs(bottom) or [(None, 0)]
        # The member compared: an append between the two reads shifts the ranks.
        if member != members[-1] or last - int(float(score)) != need - 1:
            return None
        return (
            [(last - i, m) for i, m in enumerate(members[:-1])],
            True,
            int_or_zero(deleted_before),
        )
    if members and len(members) == last:
        return [(last - i, m) for i, m in enumerate(members)], False, int_or_zero(deleted_before)
    return None


# ------------------------------------------------------------------------------ turn page


def _turn_page(
    thread: ThreadRef, after: Bound, before: Bound, limit: int, order: str, turn_id: str
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
    reply = yield Eval(
        SCRIPTS["turn_page"], thread.script_keys, (turn_id, lo_kind, lo, hi_kind, hi, walk, limit)
    )
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
