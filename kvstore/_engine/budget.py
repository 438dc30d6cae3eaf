"""A budgeted context planned from the stored token counts (docs/HISTORY.md, "Counting tokens").

Every message's count is kept in its side info, every chunk's and oversized message's in its
index member (lua/includes/layout2_format.lua). So `context(max_tokens=N)` without a counter of the
caller's reads, in one pipeline of native reads (layout/v2.py: stored_counts), what it needs to
plan: meta, the window's side infos, the open chunk and the newest chunk and oversized index
members; it names, newest first, the containers whose counts fit the budget and the one that
does not, and reads them (and the summary) in a second pipeline. A thread handle remembers the
containers its last plan named (at most MAX_AHEAD) and the first pipeline reads them ahead: while
no chunk closes and no compaction moves the summary, the plan names the same ones and the
context takes one round trip (a wrong guess costs their bytes, and the second pipeline). The
cut is then made on each message's own count, newest first, stopping at the first that does
not fit. An index member written before counts existed sums less than its
messages count (layout/formats.py: record_tokens), so a plan may read a container more, never
one less.

A budget reaching past the newest PLAN_MEMBERS chunk or oversized members reads the next ones
(one more round trip each). Data stored before counts existed is planned by the same rule as
stats() counts it. A thread this cannot plan (a layout-1 thread, a summary not among what was
read) returns None: the caller counts page by page as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import RecordError
from ..messages import SummaryMessage
from .bounds import MAX_THREAD_TOKENS
from .layout.formats import ChunkEntry, LargeEntry, split_chunk
from .layout.reader import Containers, Decoder, Found, decode, fetch
from .layout.v2 import WindowRead, older_members, stored_counts
from .layout.v3 import chunk_read
from .operation import OPTIMISTIC_READS, Operation, ThreadRef, changed_under_reads
from .pages import list_page
from .reads import stored_tokens
from .record import decode_records
from .replies import stored_int
from .tool_pairs import PAIR_LOOKBACK, answered_ids, opened_ids, orphans, without_orphans

log = logging.getLogger("kvstore")

# Chunk (and oversized) index members one planning read takes, newest first.
PLAN_MEMBERS = 128
# The most containers the first read reads ahead (a wrong guess costs their bytes), and the
# handle's hint that names them.
MAX_AHEAD = 4
CONTEXT_HINT = "context_containers"


@dataclass(slots=True)
class Budgeted:
    """What a planned budgeted read found: the summary (None: none), the sequence it covers up
    to (None: no summary), the kept messages oldest first, and the budget left when every
    message after the summary fit (else 0)."""

    summary: SummaryMessage | None
    after: int | None
    body: list[Any]  # Messages, or what a decoder made of the records
    left: int


def budgeted_context(
    thread: ThreadRef, max_tokens: int, decoder: Decoder = decode_records
) -> Operation:
    """The summary and the newest messages whose stored counts fit `max_tokens` (Budgeted), in
    two round trips (one when the handle's guess was right); None when the thread cannot be
    planned from stored counts. ChangedUnderReads when the thread changed under each try
    (context() then reads in one step). `decoder` decodes the messages after the summary
    (layout/reader.py: decode)."""
    for _ in range(OPTIMISTIC_READS):
        guess = thread.hints.get(CONTEXT_HINT, ())
        reads = [chunk_read(thread.keys, first) for first in guess]
        counts = yield from stored_counts(thread, PLAN_MEMBERS, reads)
        if not counts.plannable:
            return None
        if not counts.unchanged:
            continue
        gen, last_seq, summary_last, summary_seq, deleted_before = counts.meta
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
                thread.keys.meta,
                deleted_before.decode(),
            )
        plan.window, plan.open_records = counts.window, counts.open_records
        done = yield from _select(
            thread, plan, max_tokens, counts.chunks, counts.large, [gen, last_seq]
        )
        if not done:
            continue
        if plan.summary_seq is not None and plan.summary_where is None:
            return None
        containers, low = plan.containers(), _window_low(plan)
        _remember(thread, containers)
        found = _read_ahead(containers, dict(zip(guess, counts.ahead, strict=True)))
        if found is None or (low is not None and counts.has_window):
            found = yield from _fetch(thread, plan, containers, low, gen, summary_seq)
        if found is not None:
            if low is not None:
                # The open chunk's messages are the window's newest: read with the counts.
                found.records.update(plan.open_records)
            return _cut(thread, plan, _fetched(plan, found), max_tokens, decoder)
    raise changed_under_reads()


def planned_context(
    thread: ThreadRef, max_tokens: int | None, decoder: Decoder = decode_records
) -> Operation[list[Any] | None]:
    """views.context() planned from the stored counts (no budget: one every message fits), a
    tool-call pair the summary split kept whole where it fits; None when the thread cannot be
    planned."""
    budget = MAX_THREAD_TOKENS if max_tokens is None else max_tokens
    planned = yield from budgeted_context(thread, budget, decoder)
    if planned is None:
        return None
    body = planned.body
    if planned.after is not None and planned.left != 0:
        extra = yield from openers_before(thread, planned.after, body)
        if extra:
            counts = yield from stored_tokens(thread, [m.seq_id for m in extra])
            if sum(counts.get(m.seq_id, 0) for m in extra) <= planned.left:
                body = extra + body
    return ([planned.summary] if planned.summary is not None else []) + without_orphans(body)


def openers_before(thread: ThreadRef, after: int, body: list[Any]) -> Operation:
    """The messages at and before the summary's boundary that `body`'s first answers need:
    from the oldest call they answer (among the PAIR_LOOKBACK messages before the boundary) up
    to the boundary; the caller keeps them when they fit what is left of its budget. A pair the
    summary split is kept whole this way; a call no longer stored leaves its answer out."""
    needed = {i for m in orphans(body) for i in answered_ids(m)}
    if not needed:
        return []
    page = yield from list_page(thread, after=after + 1, limit=PAIR_LOOKBACK, order="desc")
    newest_first = page.messages
    oldest = None
    for at, message in enumerate(newest_first):
        if needed.intersection(opened_ids(message)):
            oldest = at
    if oldest is None:
        return []
    return list(reversed(newest_first[: oldest + 1]))


def _select(
    thread: ThreadRef,
    plan: _Plan,
    max_tokens: int,
    chunks: list[ChunkEntry],
    large: list[LargeEntry],
    moment: list[Any],
) -> Operation:
    """Selects the plan's containers, reading the next index members below those read while the
    budget reaches past them; False when the thread changed meanwhile (meta's gen and last_seq
    are no longer `moment`)."""
    more_chunks, more_large = len(chunks) == PLAN_MEMBERS, len(large) == PLAN_MEMBERS
    while not plan.select(max_tokens, chunks, large, more_chunks, more_large):
        # The budget reaches past the members read: read the next ones below them.
        found_chunks, found_large, now = yield from older_members(
            thread,
            chunks[-1].first if more_chunks else None,
            large[-1].sequence if more_large else None,
            PLAN_MEMBERS,
        )
        if found_chunks is not None:
            chunks += found_chunks
            more_chunks = len(found_chunks) == PLAN_MEMBERS
        if found_large is not None:
            large += found_large
            more_large = len(found_large) == PLAN_MEMBERS
        if now != moment:
            return False
    return True


@dataclass(slots=True)
class _Plan:
    last_seq: int
    after: int | None
    summary_seq: int | None
    # The counts of the window's and the open chunk's messages, and the open chunk's records
    # (layout 3).
    window: dict[int, int] = field(default_factory=dict)
    open_records: dict[int, bytes] = field(default_factory=dict)
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

    def containers(self) -> list[int]:
        """The first sequences of the chunks (and oversized messages) the plan reads, the
        summary's among them."""
        found = [e.first for e in self.chunks] + [e.sequence for e in self.large]
        if self.summary_where and self.summary_where[0] == "chunk":
            found.append(self.summary_where[1].first)
        elif self.summary_where and self.summary_where[0] == "large":
            found.append(self.summary_where[1].sequence)
        return list(dict.fromkeys(found))

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
        for chunk in chunks:
            if chunk.first <= s <= chunk.last:
                # Its count is in the chunk's manifest, read with the chunk: the plan counts
                # none for it, so it may read more, never less.
                self.summary_where = ("chunk", chunk)
                return


def _window_low(plan: _Plan) -> int | None:
    """The lowest sequence of the window (and open chunk) the plan reads; None: none."""
    low = plan.window_from
    if plan.summary_where == ("window",):
        assert plan.summary_seq is not None  # located only for a summary
        low = plan.summary_seq if low is None else min(low, plan.summary_seq)
    return low


def _fetch(
    thread: ThreadRef,
    plan: _Plan,
    containers: list[int],
    window_low: int | None,
    gen: bytes,
    summary_seq: bytes | None,
) -> Operation:
    """The second read: the planned containers (the summary's among them) and a layout-2 window
    from `window_low` up, with each message's own count. None when messages moved or a
    compaction ran in between (plan again)."""
    windows = [] if window_low is None else [WindowRead(window_low, plan.last_seq)]
    found = yield from fetch(
        thread,
        Containers(windows, containers, tokens=True),
        [("HMGET", thread.keys.meta, "gen", "summary_seq")],
    )
    if list(found.checks[0]) != [gen, summary_seq]:
        return None
    return found


def _read_ahead(containers: list[int], ahead: dict[int, Any]) -> Found | None:
    """What the second read would find of the planned containers, when the first read each
    ahead as layout-3 strings (`ahead`: first sequence -> the MGET's reply); None else."""
    found = Found()
    for first in containers:
        manifest, data = ahead.get(first, (None, None))
        if manifest is None or data is None:
            return None
        found.records.update(split_chunk(manifest, data, found.tokens))
    return found


def _remember(thread: ThreadRef, containers: list[int]) -> None:
    """Keeps the plan's containers as the handle's guess of the next plan's (a hint: the same
    until a chunk closes or a compaction moves the summary); a large plan is not guessed."""
    if 0 < len(containers) <= MAX_AHEAD:
        thread.hints[CONTEXT_HINT] = tuple(containers)
    else:
        thread.hints.pop(CONTEXT_HINT, None)


def _fetched(plan: _Plan, found: Found) -> _Fetched:
    """The summary and the records and counts after it, of what the second read found."""
    # Each message counts its own: a chunk's from its manifest, the window's from the side
    # infos the plan read (a window member without one is left out).
    tokens = {s: plan.window[s] for s in found.records if s in plan.window}
    tokens.update(found.tokens)
    records = {s: record for s, record in found.records.items() if s in tokens}

    summary: SummaryMessage | None = None
    summary_tokens = 0
    if plan.summary_seq is not None:
        summary_tokens = tokens.get(plan.summary_seq, 0)
        record = records.get(plan.summary_seq)
        if record is not None:
            try:
                (decoded,) = decode_records([(plan.summary_seq, record)])
            except RecordError:
                decoded = None
            summary = decoded if isinstance(decoded, SummaryMessage) else None

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


def _cut(
    thread: ThreadRef, plan: _Plan, fetched: _Fetched, max_tokens: int, decoder: Decoder
) -> Budgeted:
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
    body = decode(thread, [(s, fetched.records[s]) for s in kept], [], decoder)
    return Budgeted(fetched.summary, plan.after, body, max(left, 0))
