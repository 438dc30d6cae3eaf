"""Page plans: which containers hold a page walk's next messages.

A plan starts from facts about the range: read natively (:func:`_native_facts`, sequence
cursors on a layout-2 thread) or replied by lua/page_plan.lua (an id cursor, a layout-1 thread).
:func:`_select` then names the chunks, the window and the oversized messages to read, and how
far the plan is complete; :func:`plan_reads` names the reads of them (reader.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..operation import (
    OPTIMISTIC_READS,
    Batch,
    Eval,
    Operation,
    ThreadRef,
    changed_under_reads,
    int_or_zero,
)
from ..scripts import SCRIPTS
from . import CURRENT, version
from .formats import ChunkEntry, LargeEntry
from .reader import Containers
from .v2 import WindowRead

# A cursor bound: ("", "") none, ("seq", "<sequence>") or ("id", "<message id>").
Bound = tuple[str, str]


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
class Plan:
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


def plan_walk(
    thread: ThreadRef, low: Bound, high: Bound, walk: str, need: int, max_chunks: int
) -> Operation:
    """Plans the walk's next `need` messages: with native reads for sequence cursors on a
    layout-2 thread, through lua/page_plan.lua for an id cursor or a layout-1 thread."""
    facts = None
    if low[0] != "id" and high[0] != "id":
        facts = yield from _native_facts(thread, low, high, walk, need, max_chunks)
    if facts is None:
        reply = yield Eval(
            SCRIPTS["page_plan"],
            thread.script_keys,
            SCRIPTS["page_plan"].args(
                lo_kind=low[0],
                lo=low[1],
                hi_kind=high[0],
                hi=high[1],
                walk=walk,
                need=need,
                max_chunks=max_chunks,
            ),
        )
        facts = _script_facts(reply)
    return _select(facts, walk, need, max_chunks)


def _native_facts(
    thread: ThreadRef, low: Bound, high: Bound, walk: str, need: int, max_chunks: int
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
    reads = _index_reads(thread, low, high, walk, need, max_chunks)
    for _ in range(OPTIMISTIC_READS):
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
        if version(layout, legacy) != CURRENT:  # lua/page_plan.lua plans the other layouts
            return None
        if [gen, last_seq] != again:
            continue
        deleted_before, last = int_or_zero(deleted_before), int_or_zero(last_seq)
        lo = int(low[1]) if low[0] else 0
        if deleted_before > 0 and lo < deleted_before - 1:
            lo = deleted_before - 1
        hi = min(int(high[1]) if high[0] else last + 1, last + 1)
        # Walk up: `near` is the chunk at or before the cursor; walk down: the window's count.
        if walk == "up":
            window_count, members = 0, near + chunks
        else:
            window_count = int(near)
            members = chunks if window_count < need else []
        large_in_range = [s for s in map(_large_sequence, large) if lo < s < hi][:need]
        chunk_candidates = [_chunk_candidate(m) for m in members]
        return _Facts(
            int_or_zero(gen),
            deleted_before,
            lo,
            hi,
            window_count,
            chunk_candidates,
            large_in_range,
            None,
        )
    raise changed_under_reads()


def _index_reads(
    thread: ThreadRef, low: Bound, high: Bound, walk: str, need: int, max_chunks: int
) -> list[tuple[Any, ...]]:
    """The native reads of a plan's indexes, from the sequence cursors as they are. Walk up: the
    chunk at or before `low`, the chunks above it, the oversized messages; walk down: the
    window's count in the range, the chunks from `high` down, the oversized messages."""
    keys = thread.keys
    lo_arg = low[1] if low[0] else "0"
    hi_arg = f"({high[1]}" if high[0] else "+inf"
    if walk == "up":
        return [
            ("ZRANGE", keys.chunk_index, lo_arg, "-inf", "BYSCORE", "REV", "LIMIT", 0, 1),
            (
                "ZRANGE",
                keys.chunk_index,
                f"({lo_arg}",
                hi_arg,
                "BYSCORE",
                "LIMIT",
                0,
                max_chunks + 1,
            ),
            ("ZRANGE", keys.large_index, f"({lo_arg}", hi_arg, "BYSCORE", "LIMIT", 0, need),
        ]
    return [
        ("ZCOUNT", keys.window, f"({lo_arg}", hi_arg),
        ("ZRANGE", keys.chunk_index, hi_arg, "-inf", "BYSCORE", "REV", "LIMIT", 0, max_chunks + 1),
        ("ZRANGE", keys.large_index, hi_arg, f"({lo_arg}", "BYSCORE", "REV", "LIMIT", 0, need),
    ]


def _script_facts(reply: list[Any]) -> _Facts:
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


def _select(facts: _Facts, walk: str, need: int, max_chunks: int) -> Plan:
    """Names the containers holding the next `need` messages of the walk: chunks by their index
    counts, then the window if the walk reaches it (walk down starts from the window)."""
    lo, hi = facts.lo, facts.hi
    if hi - lo <= 1:
        return Plan(
            facts.gen, facts.deleted_before, lo, hi, hi if walk == "up" else lo, False, [], []
        )
    candidates = facts.chunks
    if facts.legacy is not None:
        # The legacy hash, put among the chunks in walk order.
        at = next(
            (i for i, c in enumerate(candidates) if (facts.legacy[0] < c[0]) == (walk == "up")),
            len(candidates),
        )
        candidates = [*candidates[:at], facts.legacy, *candidates[at:]]
    if walk == "up":
        window, bound, chunks = _select_up(candidates, lo, hi, need, max_chunks)
        return Plan(facts.gen, facts.deleted_before, lo, hi, bound, window, chunks, facts.large)
    bound, chunks = _select_down(candidates, lo, hi, need - facts.window_count, max_chunks)
    return Plan(facts.gen, facts.deleted_before, lo, hi, bound, True, chunks, facts.large)


def _select_up(
    candidates: list[tuple[int, int, int, int]], lo: int, hi: int, need: int, max_chunks: int
) -> tuple[bool, int, list[tuple[int, int, int]]]:
    """Walk up: chunks from the lowest on until they hold `need` messages, then the window if
    they fall short. Returns (window, bound, chunks)."""
    chunks: list[tuple[int, int, int]] = []
    acc, bound = 0, hi
    for first, last, count, kind in candidates:
        n = _in_range(first, last, count, lo, hi)
        if n == 0:
            continue
        if acc >= need or len(chunks) >= max_chunks:
            return False, bound, chunks
        chunks.append((first, last, kind))
        acc += n
        bound = last
    if acc < need:
        return True, hi, chunks
    return False, bound, chunks


def _select_down(
    candidates: list[tuple[int, int, int, int]], lo: int, hi: int, need: int, max_chunks: int
) -> tuple[int, list[tuple[int, int, int]]]:
    """Walk down: the window first (`need` is what it leaves), then chunks from the highest
    down until they hold the rest. Returns (bound, chunks)."""
    chunks: list[tuple[int, int, int]] = []
    acc = 0
    for first, last, count, kind in candidates:
        if last <= lo:
            break
        n = _in_range(first, last, count, lo, hi)
        if n == 0:
            continue
        if acc >= need or len(chunks) >= max_chunks:
            return (chunks[-1][0] if chunks else lo), chunks
        chunks.append((first, last, kind))
        acc += n
    return lo, chunks


def _in_range(first: int, last: int, count: int, lo: int, hi: int) -> int:
    """How many of a chunk's messages can lie inside (lo, hi): at most its count and span."""
    a, b = max(first, lo + 1), min(last, hi - 1)
    return 0 if b < a else min(count, b - a + 1)


def plan_reads(plan: Plan, upward: bool, need: int) -> tuple[Containers, int]:
    """The reads of a plan's containers, and how far what they read is complete: the plan's
    bound, or nearer when only the walk's end of a legacy hash is read."""
    lo, hi, bound = plan.lo, plan.hi, plan.bound
    windows = [WindowRead(f"({lo}", f"({hi}", not upward, need)] if plan.window else []
    chunks: list[int] = []
    legacy: list[int] = []
    for first, last, kind in plan.chunks:
        if kind == 0:
            chunks.append(first)
            continue
        # The legacy hash of a layout-1 thread can span more than a page: read only the
        # walk's end of it, and trust the result only that far.
        legacy = list(range(max(first, lo + 1), min(last, hi - 1) + 1))
        if len(legacy) > need:
            legacy = legacy[:need] if upward else legacy[-need:]
            bound = min(bound, legacy[-1]) if upward else max(bound, legacy[0])
    return Containers(windows, [*chunks, *plan.large], legacy), bound
