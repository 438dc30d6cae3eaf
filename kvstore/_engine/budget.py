"""A budgeted context planned from the stored token counts (docs/HISTORY.md, "Counting tokens").

Every message's count is kept in its side info, every chunk's and oversized message's in its
index member (lua/includes/format.lua). So `context(max_tokens=N)` without a counter of the
caller's reads, in one pipeline of native reads, what it needs to plan: meta, the window's side
infos and the newest chunk and oversized index members; it names, newest first, the containers
whose counts fit the budget and the one that does not, and reads them (and the summary) in a
second pipeline. The cut is then made on each message's own count, newest first, stopping at
the first that does not fit. An index member written before counts existed sums less than its
messages count (replies.py: record_tokens), so a plan may read a container more, never one less.

A budget reaching past the newest PLAN_MEMBERS chunk or oversized members reads the next ones
(one more round trip each). Data stored before counts existed is planned by the same rule as
stats() counts it. A thread this cannot plan (a layout-1 thread, a summary not among what was
read) returns None: the caller counts page by page as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..messages import Message, SummaryMessage
from .operation import OPTIMISTIC_READS, Batch, Operation, ThreadRef, changed_under_reads
from .record import RecordError, decode_records
from .replies import (
    ChunkEntry,
    LargeEntry,
    hash_pairs,
    manifest_tokens,
    score_pairs,
    side_tokens,
    split_chunk,
    stored_int,
)

log = logging.getLogger("kvstore")

# Chunk (and oversized) index members one planning read takes, newest first.
PLAN_MEMBERS = 128


@dataclass(slots=True)
class Budgeted:
    """What a planned budgeted read found: the summary (None: none), the sequence it covers up
    to (None: no summary), the kept messages oldest first, and the budget left when every
    message after the summary fit (else 0)."""

    summary: SummaryMessage | None
    after: int | None
    body: list[Message]
    left: int


def budgeted_context(thread: ThreadRef, max_tokens: int) -> Operation:
    """The summary and the newest messages whose stored counts fit `max_tokens` (Budgeted), in
    two round trips; None when the thread cannot be planned from stored counts. ChangedUnderReads
    when the thread changed under each try (context() then reads in one step)."""
    keys = thread.keys
    for _ in range(OPTIMISTIC_READS):
        meta, sides, chunk_members, large_members, legacy, again = yield Batch(
            [
                (
                    "HMGET",
                    keys.meta,
                    "gen",
                    "last_seq",
                    "summary_last",
                    "summary_seq",
                    "layout",
                    "deleting",
                    "deleted_before",
                ),
                ("HGETALL", keys.window_side),
                (
                    "ZRANGE",
                    keys.chunk_index,
                    "+inf",
                    "-inf",
                    "BYSCORE",
                    "REV",
                    "LIMIT",
                    0,
                    PLAN_MEMBERS,
                ),
                (
                    "ZRANGE",
                    keys.large_index,
                    "+inf",
                    "-inf",
                    "BYSCORE",
                    "REV",
                    "LIMIT",
                    0,
                    PLAN_MEMBERS,
                ),
                ("EXISTS", keys.legacy),
                ("HMGET", keys.meta, "gen", "last_seq"),
            ]
        )
        gen, last_seq, summary_last, summary_seq, layout, deleting, deleted_before = meta
        if deleting is not None or layout != b"2" or legacy:
            return None
        if list(again) != [gen, last_seq]:
            continue
        plan = _Plan(
            stored_int(last_seq, "meta field last_seq"),
            stored_int(summary_last, "meta field summary_last")
            if summary_seq is not None
            else None,
            stored_int(summary_seq, "meta field summary_seq") if summary_seq is not None else None,
        )
        if plan.summary_seq is None and deleted_before is not None:
            log.warning(
                "thread %s has deleted messages (before sequence %s) but no summary: its model input"
                " starts mid-conversation",
                keys.meta,
                deleted_before.decode(),
            )
        plan.window = {int(s): side_tokens(v) for s, v in hash_pairs(sides)}
        chunks = [ChunkEntry.parse(m) for m in chunk_members]
        large = [LargeEntry.parse(m) for m in large_members]
        more_chunks, more_large = len(chunks) == PLAN_MEMBERS, len(large) == PLAN_MEMBERS
        while True:
            done = plan.select(max_tokens, chunks, large, more_chunks, more_large)
            if done:
                break
            # The budget reaches past the members read: read the next ones below them.
            commands: list[tuple[Any, ...]] = []
            if more_chunks:
                commands.append(
                    (
                        "ZRANGE",
                        keys.chunk_index,
                        f"({chunks[-1].first}",
                        "-inf",
                        "BYSCORE",
                        "REV",
                        "LIMIT",
                        0,
                        PLAN_MEMBERS,
                    )
                )
            if more_large:
                commands.append(
                    (
                        "ZRANGE",
                        keys.large_index,
                        f"({large[-1].sequence}",
                        "-inf",
                        "BYSCORE",
                        "REV",
                        "LIMIT",
                        0,
                        PLAN_MEMBERS,
                    )
                )
            replies = iter((yield Batch([*commands, ("HMGET", keys.meta, "gen", "last_seq")])))
            if more_chunks:
                found = [ChunkEntry.parse(m) for m in next(replies)]
                chunks += found
                more_chunks = len(found) == PLAN_MEMBERS
            if more_large:
                found_large = [LargeEntry.parse(m) for m in next(replies)]
                large += found_large
                more_large = len(found_large) == PLAN_MEMBERS
            if list(next(replies)) != [gen, last_seq]:
                break
        if not done:
            continue
        if plan.summary_seq is not None and plan.summary_where is None:
            return None
        fetched = yield from _fetch(thread, plan, gen, summary_seq)
        if fetched is not None:
            return _cut(thread, plan, fetched, max_tokens)
    raise changed_under_reads()


@dataclass(slots=True)
class _Plan:
    last_seq: int
    after: int | None
    summary_seq: int | None
    window: dict[int, int] = field(default_factory=dict)
    # What the second read fetches: the window from this sequence up, these chunks and
    # oversized messages.
    window_from: int | None = None
    chunks: list[ChunkEntry] = field(default_factory=list)
    large: list[LargeEntry] = field(default_factory=list)
    # Where the summary is: ("window",), ("large", entry) or ("chunk", entry); None: unknown.
    summary_where: tuple[Any, ...] | None = None
    summary_tokens: int | None = None

    def select(
        self,
        max_tokens: int,
        chunks: list[ChunkEntry],
        large: list[LargeEntry],
        more_chunks: bool,
        more_large: bool,
    ) -> bool:
        """Names the containers holding the newest messages that may fit; False when the
        budget reaches past the index members read (more are to be read first)."""
        self._locate_summary(chunks, large)
        budget = max_tokens - (self.summary_tokens or 0)
        floor = self.after or 0
        units: list[tuple[int, str, Any, int]] = [(s, "w", s, t) for s, t in self.window.items()]
        units += [(e.sequence, "l", e, e.tokens) for e in large]
        units += [(e.last, "c", e, e.tokens) for e in chunks]
        units.sort(key=lambda unit: unit[0], reverse=True)
        lowest_chunk = chunks[-1].first if chunks else None
        lowest_large = large[-1].sequence if large else None
        self.window_from, self.chunks, self.large = None, [], []
        used, reached = 0, False
        for top, kind, item, tokens in units:
            if top <= floor:
                reached = True
                break
            if (more_chunks and lowest_chunk is not None and top < lowest_chunk) or (
                more_large and lowest_large is not None and top < lowest_large
            ):
                return False  # an unread member may be newer than this one
            if top == self.summary_seq and kind != "c":
                continue
            if kind == "w":
                self.window_from = top
            elif kind == "l":
                self.large.append(item)
            else:
                self.chunks.append(item)
            used += tokens
            if used > budget:
                reached = True
                break
        if not reached and (more_chunks or more_large):
            return False
        if self.chunks:
            # Oversized messages beside a chosen chunk (inside its range) are read too.
            bottom = min(e.first for e in self.chunks)
            chosen = {e.sequence for e in self.large}
            self.large += [
                e
                for e in large
                if e.sequence >= max(bottom, floor + 1) and e.sequence not in chosen
            ]
        return True

    def _locate_summary(self, chunks: list[ChunkEntry], large: list[LargeEntry]) -> None:
        s = self.summary_seq
        if s is None:
            return
        if s in self.window:
            self.summary_where, self.summary_tokens = ("window",), self.window[s]
            return
        for entry in large:
            if entry.sequence == s:
                self.summary_where, self.summary_tokens = ("large", entry), entry.tokens
                return
        for entry in chunks:
            if entry.first <= s <= entry.last:
                # Its count is in the chunk's manifest, read with the chunk: the plan counts
                # none for it, so it may read more, never less.
                self.summary_where = ("chunk", entry)
                return


def _fetch(thread: ThreadRef, plan: _Plan, gen: bytes, summary_seq: bytes | None) -> Operation:
    """The second read: the planned containers and the summary, with each message's own count.
    None when messages moved or a compaction ran in between (plan again)."""
    keys = thread.keys
    commands: list[tuple[Any, ...]] = []
    window_low = plan.window_from
    if plan.summary_where == ("window",):
        window_low = plan.summary_seq if window_low is None else min(window_low, plan.summary_seq)
    if window_low is not None:
        commands.append(("ZRANGE", keys.window, window_low, plan.last_seq, "BYSCORE", "WITHSCORES"))
    containers = [e.first for e in plan.chunks] + [e.sequence for e in plan.large]
    if plan.summary_where and plan.summary_where[0] == "chunk":
        containers.append(plan.summary_where[1].first)
    elif plan.summary_where and plan.summary_where[0] == "large":
        containers.append(plan.summary_where[1].sequence)
    containers = list(dict.fromkeys(containers))
    commands += [("HMGET", keys.chunk(first), "_m", "d") for first in containers]
    replies = yield Batch([*commands, ("HMGET", keys.meta, "gen", "summary_seq")])
    if list(replies[-1]) != [gen, summary_seq]:
        return None
    records: dict[int, bytes] = {}
    tokens: dict[int, int] = {}
    at = 0
    if window_low is not None:
        for member, score in score_pairs(replies[0]):
            sequence = int(float(score))
            if sequence in plan.window:
                records[sequence] = member
                tokens[sequence] = plan.window[sequence]
        at = 1
    for reply in replies[at:-1]:
        manifest, data = reply
        records.update(split_chunk(manifest, data))
        tokens.update(manifest_tokens(manifest))

    summary: SummaryMessage | None = None
    summary_tokens = 0
    if plan.summary_seq is not None:
        summary_tokens = tokens.get(plan.summary_seq, 0)
        record = records.get(plan.summary_seq)
        if record is not None:
            try:
                (found,) = decode_records([(plan.summary_seq, record)])
            except RecordError:
                found = None
            summary = found if isinstance(found, SummaryMessage) else None

    floor = plan.after or 0
    candidates = sorted(
        (s for s in records if floor < s <= plan.last_seq and s != plan.summary_seq), reverse=True
    )
    return _Fetched(summary, summary_tokens, candidates, records, tokens)


@dataclass(slots=True)
class _Fetched:
    """What the second read found: the summary and its count, and the records and counts of the
    messages after it."""

    summary: SummaryMessage | None
    summary_tokens: int
    newest_first: list[int]  # the sequences read after the summary's, newest first
    records: dict[int, bytes]
    tokens: dict[int, int]


def _cut(thread: ThreadRef, plan: _Plan, fetched: _Fetched, max_tokens: int) -> Budgeted:
    """The newest messages whose own counts fit what the summary leaves, stopping at the first
    that does not; unreadable records are left out (docs/RELIABILITY.md, "One bad record")."""
    budget = max_tokens - fetched.summary_tokens
    kept: list[int] = []
    left = budget
    for sequence in fetched.newest_first:
        count = fetched.tokens[sequence]
        if count > left:
            left = -1
            break
        left -= count
        kept.append(sequence)
    kept.reverse()
    unreadable: list[RecordError] = []
    body = decode_records([(s, fetched.records[s]) for s in kept], unreadable)
    for error in unreadable:
        log.warning(
            "thread %s: skipped an unreadable record: %s",
            thread.keys.meta.rpartition(":")[0],
            error,
        )
    return Budgeted(fetched.summary, plan.after, body, max(left, 0))


def stored_tokens(thread: ThreadRef, sequences: list[int]) -> Operation:
    """The stored token counts of these sequences, from their side infos (the window's, or their
    chunks' manifests): two round trips. A sequence not stored is left out."""
    if not sequences:
        return {}
    keys = thread.keys
    low, high = min(sequences), max(sequences)
    for _ in range(OPTIMISTIC_READS):
        gen, sides, below, within, large, again = yield Batch(
            [
                ("HGET", keys.meta, "gen"),
                ("HMGET", keys.window_side, *sequences),
                ("ZRANGE", keys.chunk_index, low, "-inf", "BYSCORE", "REV", "LIMIT", 0, 1),
                ("ZRANGE", keys.chunk_index, f"({low}", high, "BYSCORE"),
                ("ZRANGE", keys.large_index, low, high, "BYSCORE"),
                ("HGET", keys.meta, "gen"),
            ]
        )
        if gen != again:
            continue
        tokens = {s: side_tokens(x) for s, x in zip(sequences, sides, strict=True) if x is not None}
        wanted = set(sequences) - set(tokens)
        for entry in map(LargeEntry.parse, large):
            if entry.sequence in wanted:
                tokens[entry.sequence] = entry.tokens
        wanted -= set(tokens)
        chunks = [
            e.first
            for e in map(ChunkEntry.parse, [*below, *within])
            if any(e.first <= s <= e.last for s in wanted)
        ]
        if not chunks:
            return tokens
        replies = yield Batch(
            [*(("HGET", keys.chunk(first), "_m") for first in chunks), ("HGET", keys.meta, "gen")]
        )
        if replies[-1] != gen:
            continue
        for manifest in replies[:-1]:
            tokens.update((s, t) for s, t in manifest_tokens(manifest).items() if s in wanted)
        return tokens
    raise changed_under_reads()
