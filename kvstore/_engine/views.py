"""Views of a whole thread: stats, snapshot and context (the model input).

A view that takes several round trips reads meta before and after them, and reads again when
the thread changed in between, so that what it returns is as of one state of the thread.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import errors
from ..messages import Message, SummaryMessage
from ..models import MessagesPage, ThreadSnapshot, ThreadStats, TurnState
from .bounds import MAX_THREAD_TOKENS, bounded
from .budget import openers_before, planned_context
from .layout.formats import record_tokens
from .layout.reader import Decoder, decode
from .layout.v1 import untouched_layout_1
from .layout.v2 import size_reads
from .operation import (
    MAX_LIMIT,
    OPTIMISTIC_READS,
    SNAPSHOT_SIZE,
    Batch,
    ChangedUnderReads,
    Cursor,
    Operation,
    ThreadRef,
)
from .owner_entries import directory_reads, owned_stats
from .pages import gathering, list_page, pages
from .reads import RangeRead, fetch_sequences, read_range
from .record import decode_records
from .replies import stored_int
from .text import text as _text
from .tokens import TokenCounter, counted, estimated_tokens
from .tool_pairs import (
    PAIR_LOOKBACK,
    answered_ids,
    opened_ids,
    orphans,
    without_orphans,
)

log = logging.getLogger("kvstore")


def stats(thread: ThreadRef) -> Operation[ThreadStats]:
    replies = yield Batch(size_reads(thread.keys) + directory_reads(thread))
    meta, window, chunks, large, legacy = replies[:5]
    return _stats_from(meta, window, chunks + large, legacy, owned_stats(thread, replies[5:]))


def _stats_from(
    meta: dict[bytes, bytes],
    window: int,
    chunks: int,
    legacy: int,
    owned: dict[str, Any] | None = None,
) -> ThreadStats:
    """`owned`: the owner's fields (owner_entries.owned_stats), for an owned thread."""
    fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in meta.items()}
    if "deleting" in fields:  # an interrupted delete(): the thread reads as empty
        fields, window, chunks, legacy = {}, 0, 0, 0

    def number(name: str) -> int | None:
        value = fields.get(name)
        return stored_int(value, f"meta field {name}") if value is not None else None

    stored = number("stored") or 0
    layout = number("layout")
    if untouched_layout_1(layout, legacy, number("legacy_last")):
        # Its messages are all in the legacy hash.
        stored += legacy
        layout = 1
    return ThreadStats(
        stored_messages=stored,
        # Layout 3's open chunk is its window: the messages not yet in closed chunks.
        window_messages=window + (number("open_count") or 0),
        chunks=chunks,
        stored_bytes=number("bytes") or 0,
        media_bytes=number("media") or 0,
        next_sequence=(number("last_seq") or 0) + 1,
        deleted_before_sequence=number("deleted_before") or None,
        summary_last_sequence=number("summary_last"),
        layout_version=layout,
        forked_from=_text(fields["fork_of"]) if "fork_of" in fields else None,
        fork_sequence=number("fork_at"),
        history_checked=(number("checked") or 0) > 0,
        # A thread no write has touched since meta kept a total: the rule on its stored bytes
        # (its first write counts each chunk and message, lua/includes/layout2_index.lua: ensure_tokens).
        tokens=number("tokens") if "tokens" in fields else record_tokens(number("bytes") or 0),
        restore_unfinished="restoring" in fields,
        **(owned or {}),
    )


def snapshot(thread: ThreadRef) -> Operation[ThreadSnapshot]:
    """The newest page, the summary, the turn and the stats, as of one state of the thread.

    The stats are read before the page and checked after it: an append, a move or a compaction
    in between (last_seq, gen or summary_seq changed) makes the snapshot read again.
    """
    keys = thread.keys
    for _ in range(OPTIMISTIC_READS):
        replies = yield Batch(size_reads(keys) + directory_reads(thread))
        meta, window, chunks, large, legacy = replies[:5]
        owned = owned_stats(thread, replies[5:])
        page = yield from list_page(thread, limit=SNAPSHOT_SIZE, order="desc")
        fields = {_text(k): _text(v) for k, v in meta.items()}
        (now,) = yield Batch([("HMGET", keys.meta, "last_seq", "gen", "summary_seq")])
        if [None if v is None else _text(v) for v in now] != [
            fields.get(f) for f in ("last_seq", "gen", "summary_seq")
        ]:
            continue
        unreadable = list(page.unreadable)
        summary = yield from _summary(thread, fields, unreadable)
        return _snapshot_of(
            meta,
            (window, chunks, large, legacy),
            list(reversed(page.messages)),
            summary,
            unreadable,
            owned,
        )
    # Appends or moves landed under every try: one read-only step reads it all (read_range.lua).
    read = yield from read_range(
        thread, ("", ""), ("", ""), "down", SNAPSHOT_SIZE + 1, extras="snapshot"
    )
    assert read.stats is not None
    flat, *sizes = read.stats
    unreadable = []
    newest_first = [(sequence, record) for sequence, record, _ in read.records[:SNAPSHOT_SIZE]]
    messages = decode(thread, list(reversed(newest_first)), unreadable)
    summary = _read_summary(thread, read, unreadable)
    # The owner's entry is read after the range: it moves with every write, and is not part of
    # what the consistent read checks.
    directory = (yield Batch(directory_reads(thread))) if thread.owner is not None else []
    return _snapshot_of(
        dict(zip(flat[::2], flat[1::2], strict=False)),
        tuple(sizes),
        messages,
        summary,
        unreadable,
        owned_stats(thread, directory),
    )


def _read_summary(
    thread: ThreadRef, read: RangeRead, unreadable: list[int]
) -> SummaryMessage | None:
    """The context summary a consistent read found, or None (also when its record is unreadable)."""
    if read.summary is None:
        return None
    found = decode(thread, [read.summary[:2]], unreadable)
    return found[0] if found and isinstance(found[0], SummaryMessage) else None


def _snapshot_of(
    meta: dict[bytes, bytes],
    sizes: tuple[int, ...],
    messages: list[Message],
    summary: SummaryMessage | None,
    unreadable: list[int],
    owned: dict[str, Any] | None = None,
) -> ThreadSnapshot:
    """A snapshot from what one state of the thread holds: meta, the sizes stats() reads
    (window, chunk index, large index, legacy hash), the newest messages oldest first, the
    summary and the unreadable sequences."""
    fields = {_text(k): _text(v) for k, v in meta.items()}
    turn = None
    if fields.get("turn_id"):
        turn = TurnState(
            turn_id=fields["turn_id"],
            sequence=stored_int(fields["turn_seq"], "meta field turn_seq"),
            outcome=fields.get("turn_outcome") or "open",
        )
    window, chunks, large, legacy = sizes
    return ThreadSnapshot(
        messages=messages,
        summary=summary,
        turn=turn,
        stats=_stats_from(meta, window, chunks + large, legacy, owned),
        unreadable=sorted(set(unreadable)),
    )


def _summary(thread: ThreadRef, fields: dict[str, str], unreadable: list[int]) -> Operation:
    """The context summary named by meta, or None (also when its record is unreadable)."""
    if not fields.get("summary_seq"):
        return None
    found = yield from fetch_sequences(
        thread,
        [stored_int(fields["summary_seq"], "meta field summary_seq")],
        missing_ok=True,
        unreadable=unreadable,
    )
    summary = found[0] if found else None
    return summary if isinstance(summary, SummaryMessage) else None


def context(
    thread: ThreadRef,
    max_tokens: int | None = None,
    count_tokens: TokenCounter | None = None,
    decoder: Decoder = decode_records,
) -> Operation[list[Message]]:
    """The model input: the context summary and every message after its last sequence (with
    `max_tokens`, the newest of them that fit), with no tool-call pair split (tool_pairs.py).
    The messages a plan from the stored counts reads after the summary are decoded by `decoder`
    (record_dicts.decode_dicts: stored dicts where it vouches for them); any other read, and the
    summary, builds models.

    It takes several round trips; a compaction landing between them would pair the old summary
    with pages cut by the new retention. Summaries only move forward (each is a new message with
    a new sequence), so an unchanged `summary_seq` after the last page means no compaction ran
    in between; otherwise the read starts again.
    """
    if max_tokens is not None and not bounded(max_tokens, 1, MAX_THREAD_TOKENS):
        raise errors.InvalidCursor(
            f"max_tokens must be an int from 1 to {MAX_THREAD_TOKENS} (2**52), got {max_tokens!r:.80}"
        )
    try:
        return (yield from _optimistic_context(thread, max_tokens, count_tokens, decoder))
    except ChangedUnderReads:
        # Writes changed the thread under every try: one read-only step reads it whole.
        return (yield from _consistent_context(thread, max_tokens, count_tokens))


def _optimistic_context(
    thread: ThreadRef,
    max_tokens: int | None,
    count_tokens: TokenCounter | None,
    decoder: Decoder = decode_records,
) -> Operation[list[Message]]:
    """context() from reads of several round trips, compared after them; ChangedUnderReads
    when a compaction landed under each try."""
    if max_tokens is None or count_tokens is None:
        # No caller's counter: planned from the stored counts (two round trips, not pages).
        planned = yield from planned_context(thread, max_tokens, decoder)
        if planned is not None:
            return planned
    count = count_tokens or estimated_tokens
    keys = thread.keys
    for _ in range(OPTIMISTIC_READS):
        (meta,) = yield Batch(
            [("HMGET", keys.meta, "summary_last", "summary_seq", "deleted_before")]
        )
        summary_last, summary_seq, deleted_before = meta
        summary: SummaryMessage | None = None
        after: int | None = None
        if summary_seq is not None:
            summary = yield from _summary(thread, {"summary_seq": _text(summary_seq)}, [])
            after = stored_int(summary_last, "meta field summary_last")
        elif deleted_before is not None:
            log.warning(
                "thread %s has deleted messages (before sequence %s) but no summary: its model input"
                " starts mid-conversation",
                keys.meta,
                _text(deleted_before),
            )
        skip = (
            stored_int(summary_seq, "meta field summary_seq") if summary_seq is not None else None
        )
        budget = max_tokens
        if budget is not None and summary is not None:
            budget -= counted(count, summary, f"message {summary.id}")
        if budget is None:
            read: list[MessagesPage] = []
            yield from gathering(pages(thread, after=after, limit=MAX_LIMIT), read.append)
            body = [m for page in read for m in page.messages if m.seq_id != skip]
            left: int | None = None
        else:
            body, left = yield from _newest_within(thread, after, skip, budget, count)
        if after is not None and left != 0:
            extra = yield from openers_before(thread, after, body)
            if left is None or sum(counted(count, m, f"message {m.id}") for m in extra) <= left:
                body = extra + body
        (now,) = yield Batch([("HGET", keys.meta, "summary_seq")])
        if now == summary_seq:
            return ([summary] if summary is not None else []) + without_orphans(body)
    raise ChangedUnderReads("the thread was compacted under every read attempt")


def _consistent_context(
    thread: ThreadRef, max_tokens: int | None, count_tokens: TokenCounter | None
) -> Operation[list[Message]]:
    """context() from one read-only step (lua/read_range.lua): the summary, the messages after
    its range (with a budget, the newest that the stored counts show are enough) and the
    PAIR_LOOKBACK before it; the same cut and pair rules as the reads of several round trips."""
    stored_counts = max_tokens is not None and count_tokens is None
    read = yield from read_range(
        thread,
        ("summary", ""),
        ("", ""),
        "down",
        0,
        max_tokens if max_tokens is not None and stored_counts else 0,
        PAIR_LOOKBACK,
    )
    count = count_tokens or estimated_tokens
    summary = _read_summary(thread, read, [])
    newest_first = [r for r in read.records if r[0] != read.summary_seq]
    left: int | None = None
    if max_tokens is None:
        kept = newest_first
    else:
        left = max_tokens
        if stored_counts:
            left -= read.summary[2] if read.summary is not None else 0
        elif summary is not None:
            left -= counted(count, summary, f"message {summary.id}")
        kept = []
        for record in newest_first:
            if stored_counts:
                tokens = record[2]
            else:
                message = next(iter(decode(thread, [record[:2]], [])), None)
                tokens = 0 if message is None else counted(count, message, f"message {message.id}")
            if tokens > left:
                left = 0
                break
            left -= tokens
            kept.append(record)
        left = max(left, 0)
    body = decode(thread, [r[:2] for r in reversed(kept)], [])
    if read.summary_last is not None and left != 0:
        needed = {i for m in orphans(body) for i in answered_ids(m)}
        lookback = decode(thread, [r[:2] for r in read.lookback], []) if needed else []
        tokens_of = {r[0]: r[2] for r in read.lookback}
        oldest = None
        for at, message in enumerate(lookback):
            if needed.intersection(opened_ids(message)):
                oldest = at
        extra = list(reversed(lookback[: oldest + 1])) if oldest is not None else []
        if stored_counts:
            cost = sum(tokens_of.get(m.seq_id, 0) for m in extra)
        else:
            cost = sum(counted(count, m, f"message {m.id}") for m in extra)
        if extra and (left is None or cost <= left):
            body = extra + body
    return ([summary] if summary is not None else []) + without_orphans(body)


# A sequence no message has (sequences stay exact in a double's 53 bits): the upper bound of a
# walk down from the newest message.
ABOVE_EVERY_SEQUENCE = 2**53

# The first page a budgeted context reads; each next one is twice as long (up to MAX_LIMIT).
BUDGET_FIRST_PAGE = 50


def _newest_within(
    thread: ThreadRef, after: int | None, skip: int | None, budget: int, count: TokenCounter
) -> Operation:
    """The newest messages after sequence `after` whose tokens fit `budget`, oldest first, read
    newest page first; and the budget left when every one of them fit (else 0)."""
    newest_first: list[Message] = []
    # A page bounded only below (before=after) is the one next to that bound, the oldest after
    # it: the walk starts above every sequence instead, so that it reads the newest first.
    cursor: Cursor = None if after is None else ABOVE_EVERY_SEQUENCE
    # Pages grow: most budgets end within the first page, and each message read is decoded.
    limit = BUDGET_FIRST_PAGE
    while True:
        page = yield from list_page(thread, after=cursor, before=after, limit=limit, order="desc")
        limit = min(2 * limit, MAX_LIMIT)
        for message in page.messages:
            if message.seq_id == skip:
                continue
            tokens = counted(count, message, f"message {message.id}")
            if tokens > budget:
                newest_first.reverse()
                return newest_first, 0
            budget -= tokens
            newest_first.append(message)
        if page.next_cursor is None:
            newest_first.reverse()
            return newest_first, budget
        cursor = page.next_cursor
