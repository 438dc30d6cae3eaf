"""Pages of a thread: list_page, and the one page loop (pages, gathering) iter and context use.

A page is a walk over the range between its cursors, up or down: the newest page in one round
trip when it can (layout: newest_page), otherwise plan (layout: plan_walk), fetch the planned
containers (layout: plan_reads, fetch) in one pipeline checked against meta's gen, cut what they
hold into walk order, and plan again past it while the page is short. A turn's page reads its sequences from the
turn's record (lua/turn_page.lua), then the messages by sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Literal, NamedTuple

from .. import errors
from ..messages import Message
from ..models import MessagesPage
from .bounds import MAX_CURSOR
from .layout.plan import Bound, plan_reads, plan_walk
from .layout.reader import cut, decode, fetch
from .layout.v3 import newest_page
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
from .prepare import check_token
from .reads import fetch_sequences, read_range
from .record_dicts import decode_dicts
from .scripts import SCRIPTS
from .text import sendable

# (sequence, record) pairs, in walk order.
Entries = list[tuple[int, bytes]]


def list_page(
    thread: ThreadRef,
    after: Cursor = None,
    before: Cursor = None,
    limit: int = 50,
    order: Literal["asc", "desc"] = "asc",
    turn_id: str | None = None,
) -> Operation[MessagesPage]:
    if turn_id is not None:
        # In the order a caller sees the checks: the page's size and order, the cursors' form,
        # the turn id's form (tests/reliability/test_fuzz.py holds every call to it).
        _check_page(limit, order)
        after_c, before_c = _cursor(after, "after"), _cursor(before, "before")
        check_token("turn_id", turn_id)
        return (yield from _turn_page(thread, after_c, before_c, limit, order, turn_id))
    entries, has_more, deleted_before, next_cursor = yield from _entries(
        thread, after, before, limit, order
    )
    unreadable: list[int] = []
    messages = decode(thread, entries, unreadable)
    return _page(messages, has_more, deleted_before, next_cursor, unreadable)


class DictsPage(NamedTuple):
    """A page of :func:`list_dicts`: `messages` holds each message as its stored dict where
    record_dicts.decode_dicts vouches for it, else as its model; the rest as in MessagesPage."""

    messages: list[dict[str, Any] | Message]
    has_more: bool
    next_cursor: int | None
    unreadable: list[int]


def list_dicts(
    thread: ThreadRef,
    after: Cursor = None,
    before: Cursor = None,
    limit: int = 50,
    order: Literal["asc", "desc"] = "asc",
) -> Operation[DictsPage]:
    """:func:`list_page` (no turn) for readers that want dicts: the same records, cursors and
    unreadable records, each message decoded by record_dicts.decode_dicts."""
    entries, has_more, _, next_cursor = yield from _entries(thread, after, before, limit, order)
    unreadable: list[int] = []
    messages = decode(thread, entries, unreadable, decode_dicts)
    return DictsPage(messages, bool(has_more), next_cursor, unreadable)


def _check_page(limit: int, order: str) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidCursor(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    if order not in ("asc", "desc"):
        raise errors.InvalidCursor(f"order must be 'asc' or 'desc', got {order!r}")


def _entries(thread: ThreadRef, after: Cursor, before: Cursor, limit: int, order: str) -> Operation:
    """A page's records in page order: (entries, has_more, deleted_before, next_cursor)."""
    _check_page(limit, order)
    after_c, before_c = _cursor(after, "after"), _cursor(before, "before")
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
    return entries, has_more, deleted_before, next_cursor


def _page(
    messages: list[Message],
    has_more: bool,
    deleted_before: int,
    next_cursor: int | None,
    unreadable: list[int],
) -> MessagesPage:
    """The page, built without validating again what decode validated (every field is given,
    as validation would have them: a whole page's messages cost ~0.3 µs each to check again)."""
    return MessagesPage.model_construct(
        messages=messages,
        has_more=bool(has_more),
        deleted_before_sequence=int(deleted_before) or None,
        next_cursor=None if next_cursor is None else int(next_cursor),
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
    if isinstance(value, str) and value and len(value) <= MAX_TOKEN_LENGTH and sendable(value):
        return "id", value
    raise errors.InvalidCursor(f"{name} must be a message id or a sequence, got {value!r}")


def pages(
    thread: ThreadRef,
    order: Literal["asc", "desc"] = "asc",
    after: Cursor = None,
    limit: int | None = None,
    read: Callable[..., Operation] = list_page,
) -> Generator[Eval | Batch | MessagesPage | DictsPage, Any, None]:
    """Every kept message from `after` on, a page at a time: the one page loop, used by
    ``iter`` (sync and async) and by ``context``. Pages of `limit` messages; without one, the
    first holds ITER_PAGE and each next one twice as many, up to MAX_LIMIT: a short read stays
    small, a long one takes few round trips. `read` is list_page, or list_dicts for dicts.

    Besides its requests, it yields each page as it is read: an output, which the executor
    hands to its caller (``stream``) and answers with None.
    """
    size = ITER_PAGE if limit is None else limit
    while True:
        page = yield from read(thread, after=after, limit=size, order=order)
        yield page
        if page.next_cursor is None:
            return
        after = page.next_cursor
        if limit is None:
            size = min(2 * size, MAX_LIMIT)


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
        newest = yield from newest_page(thread, need)
        if newest is not None:
            return newest
    upward = walk == "up"
    collected: Entries = []
    attempts, deleted_before = 0, 0
    while True:
        remaining = need - len(collected)
        # Enough chunks for the page when they are half full (a chunk closed for its size, of
        # 1 KB messages, holds ~48 of 64): the plan names only those that hold the page, and
        # emptier ones make the walk plan again.
        per_chunk = max(1, thread.config.chunk_size // 2)
        max_chunks = min(PLAN_MAX_CHUNKS, remaining // per_chunk + 2)
        plan = yield from plan_walk(thread, low, high, walk, remaining, max_chunks)
        # A page planned again may meet a later retention; what it collected before is as of
        # the first plan, so the page reports the first plan's deleted_before.
        deleted_before = plan.deleted_before if not collected else deleted_before
        containers, bound = plan_reads(plan, upward, need)
        if not containers:  # nothing in the range: nothing to fetch, nothing to compare
            return collected, False, deleted_before
        found = yield from fetch(thread, containers, [("HGET", thread.keys.meta, "gen")])
        if int_or_zero(found.checks[0]) != plan.gen:
            attempts += 1
            if attempts >= OPTIMISTIC_READS:
                raise ChangedUnderReads("the thread changed under every page read attempt")
            continue
        # What was read inside the plan's range, as far as it is complete, in walk order.
        lo, hi = (
            (plan.lo, min(plan.hi, bound + 1)) if upward else (max(plan.lo, bound - 1), plan.hi)
        )
        collected += cut(found.records, lo, hi, not upward)[: need - len(collected)]
        if len(collected) >= need:
            return collected[: need - 1], True, deleted_before
        complete = bound >= plan.hi if upward else bound <= plan.lo
        if complete:
            return collected, False, deleted_before
        # Holes left the planned chunks short: plan again past what was read.
        if upward:
            low = ("seq", str(bound))
        else:
            high = ("seq", str(bound))


# ------------------------------------------------------------------------------ turn page


def _turn_page(
    thread: ThreadRef, after: Bound, before: Bound, limit: int, order: str, turn_id: str
) -> Operation[MessagesPage]:
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
        SCRIPTS["turn_page"],
        thread.script_keys,
        SCRIPTS["turn_page"].args(
            turn_id=turn_id, lo_kind=lo_kind, lo=lo, hi_kind=hi_kind, hi=hi, walk=walk, limit=limit
        ),
    )
    deleted_before, has_more = int(reply[0]), bool(int(reply[1]))
    page = [int(s) for s in reply[2:]]
    if from_before:
        page.reverse()
    # The page goes on from the sequence farthest from its cursor.
    next_cursor = (page[0] if from_before else page[-1]) if has_more and page else None
    unreadable: list[int] = []
    messages = yield from fetch_sequences(thread, page, missing_ok=True, unreadable=unreadable)
    return _page(messages, has_more, deleted_before, next_cursor, unreadable)
