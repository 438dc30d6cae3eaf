"""Page plans: which containers hold a page walk's next messages.

A plan starts from facts about the range: read natively (:func:`_native_facts`, sequence
cursors on a layout-2 thread) or replied by lua/page_plan.lua (an id cursor, a layout-1 thread).
:func:`_select` then names the chunks, the window and the oversized messages to read, and how
far the plan is complete; :func:`plan_reads` names the reads of them (reader.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ... import errors
from ..operation import (
    OPTIMISTIC_READS,
    Batch,
    Eval,
    Operation,
    ThreadRef,
    changed_under_reads,
    int_or_zero,
)
from ..replies import stored_int
from ..scripts import SCRIPTS
from . import CURRENT, version
from .formats import ChunkEntry, LargeEntry
from .reader import Containers
from .v2 import WindowRead
from .v3 import window_bounds

# A cursor bound: ("", "") none, ("seq", "<sequence>") or ("id", "<message id>").
Bound = tuple[str, str]


# A container of a plan: (first, last, count, kind), kind one of these.
CHUNK, LEGACY, WINDOW, OPEN = 0, 1, 2, 3
Unit = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class _Facts:
    """What a page plan reads (lua/page_plan.lua's reply, or _native_facts): the range
    (exclusive bounds, clamped), the containers overlapping it (chunk index members near it, the
    window's part in it, the open chunk, the legacy range of a layout-1 thread) and the
    oversized messages in it, in walk order, at most `need`."""

    gen: int
    deleted_before: int
    lo: int
    hi: int
    layout: int
    units: list[Unit]
    large: list[int]


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
    chunks: list[tuple[int, int, int]]  # (first, last, kind): kind CHUNK or LEGACY
    large: list[int]
    open: bool = False
    layout: int = CURRENT


def plan_walk(
    thread: ThreadRef, low: Bound, high: Bound, walk: str, need: int, max_chunks: int
) -> Operation:
    """Plans the walk's next `need` messages: with native reads for sequence cursors on a
    layout-2 or layout-3 thread, through lua/page_plan.lua for an id cursor or a layout-1
    thread."""
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


_META = (
    "gen",
    "deleted_before",
    "last_seq",
    "deleting",
    "layout",
    "open_first",
    "open_last",
    "open_count",
)


def _native_facts(
    thread: ThreadRef, low: Bound, high: Bound, walk: str, need: int, max_chunks: int
) -> Operation:
    """The facts of a plan from one pipeline of native reads, or None for a layout-1 thread.

    The pipeline is not atomic, so it reads meta's gen and last_seq first and last: equal, no
    message moved, went, came or changed in between (an append moves last_seq; whatever moves,
    removes or replaces a message moves gen), and the reads in between saw one state. The reads take the cursors as they are: nothing is stored below
    deleted_before (retention deletes everything there), so the clamp to it, applied after,
    changes no index read.
    """
    keys = thread.keys
    reads = _index_reads(thread, low, high, walk, need, max_chunks)
    for _ in range(OPTIMISTIC_READS):
        meta, legacy, *found, again = yield Batch(
            [
                ("HMGET", keys.meta, *_META),
                ("EXISTS", keys.legacy),
                *reads,
                ("HMGET", keys.meta, "gen", "last_seq"),
            ]
        )
        gen, deleted_before, last_seq, deleting, layout, open_first, open_last, open_count = meta
        if deleting is not None:  # an interrupted delete(): the thread reads as empty
            return _Facts(int_or_zero(gen), 0, 0, 1, CURRENT, [], [])
        if version(layout, legacy) not in (2, 3):  # lua/page_plan.lua plans the other layouts
            return None
        if [gen, last_seq] != again:
            continue
        deleted_before, last = int_or_zero(deleted_before), int_or_zero(last_seq)
        lo = int(low[1]) if low[0] else 0
        if deleted_before > 0 and lo < deleted_before - 1:
            lo = deleted_before - 1
        hi = min(int(high[1]) if high[0] else last + 1, last + 1)
        if walk == "up":
            near, chunks, large, window_count, window_low, window_high = found
            members = near + chunks
        else:
            members, large, window_count, window_low, window_high = found
        units = [_chunk_unit(m) for m in members]
        window = window_bounds(window_low, window_high)
        if window is not None:
            units.append((*window, int(window_count), WINDOW))
        if int_or_zero(open_count) > 0:
            open_unit = (open_first, open_last, open_count)
            first, last, count = (
                stored_int(v, "meta field open_first..open_count") for v in open_unit
            )
            units.append((first, last, count, OPEN))
        large_in_range = [s for s in map(_large_sequence, large) if lo < s < hi][:need]
        return _Facts(
            int_or_zero(gen), deleted_before, lo, hi, version(layout, legacy), units, large_in_range
        )
    raise changed_under_reads()


def _index_reads(
    thread: ThreadRef, low: Bound, high: Bound, walk: str, need: int, max_chunks: int
) -> list[tuple[Any, ...]]:
    """The native reads of a plan's indexes and window, from the sequence cursors as they are.
    Walk up: the chunk at or before `low`, the chunks above it, the oversized messages; walk
    down: the chunks from `high` down, the oversized messages. Then the window's count in the
    range and its lowest and highest member there."""
    keys = thread.keys
    lo_arg = low[1] if low[0] else "0"
    hi_arg = f"({high[1]}" if high[0] else "+inf"
    window = [
        ("ZCOUNT", keys.window, f"({lo_arg}", hi_arg),
        ("ZRANGE", keys.window, f"({lo_arg}", hi_arg, "BYSCORE", "LIMIT", 0, 1, "WITHSCORES"),
        (
            "ZRANGE",
            keys.window,
            hi_arg,
            f"({lo_arg}",
            "BYSCORE",
            "REV",
            "LIMIT",
            0,
            1,
            "WITHSCORES",
        ),
    ]
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
            *window,
        ]
    return [
        ("ZRANGE", keys.chunk_index, hi_arg, "-inf", "BYSCORE", "REV", "LIMIT", 0, max_chunks + 1),
        ("ZRANGE", keys.large_index, hi_arg, f"({lo_arg}", "BYSCORE", "REV", "LIMIT", 0, need),
        *window,
    ]


def _script_facts(reply: list[Any]) -> _Facts:
    """The facts lua/page_plan.lua replies."""
    if len(reply) < 7:
        # Lua drops a nil from the reply's table: a meta number (layout, gen, deleted_before…)
        # holds what no client writes.
        raise errors.RecordError(f"a meta field holds what kvstore does not write: {reply!r:.120}")
    gen, deleted_before, lo, hi, layout, below, above_count = reply[:7]
    above_end = 7 + int(above_count)
    members = ([below] if below else []) + reply[7:above_end]
    large_end = above_end + 1 + int(reply[above_end])
    tail = [int(v) for v in reply[large_end : large_end + 9]]
    legacy_first, legacy_last, legacy_count = tail[0:3]
    units = [_chunk_unit(m) for m in members]
    if legacy_last:
        units.append((legacy_first, legacy_last, legacy_count, LEGACY))
    if tail[5]:  # the window's count in the range
        units.append((tail[3], tail[4], tail[5], WINDOW))
    if tail[8]:  # the open chunk's count
        units.append((tail[6], tail[7], tail[8], OPEN))
    return _Facts(
        int(gen),
        int(deleted_before),
        int(lo),
        int(hi),
        int(layout),
        units,
        [_large_sequence(m) for m in reply[above_end + 1 : large_end]],
    )


def _chunk_unit(member: bytes) -> Unit:
    """(first, last, count, CHUNK) of a chunk index member."""
    entry = ChunkEntry.parse(member)
    return entry.first, entry.last, entry.count, CHUNK


def _large_sequence(member: bytes) -> int:
    return LargeEntry.parse(member).sequence


def _select(facts: _Facts, walk: str, need: int, max_chunks: int) -> Plan:
    """Names the containers holding the next `need` messages of the walk: the units in walk
    order (they are disjoint but for oversized messages, read apart) until they hold `need`,
    at most `max_chunks` chunks among them."""
    lo, hi, up = facts.lo, facts.hi, walk == "up"
    chunks: list[tuple[int, int, int]] = []
    window = in_open = False
    bound = hi if up else lo
    if hi - lo > 1:
        units = sorted(facts.units, key=lambda u: u[0] if up else -u[1])
        acc = 0
        for first, last, count, kind in units:
            n = _in_range(first, last, count, lo, hi)
            if n == 0:
                continue
            if acc >= need or (kind in (CHUNK, LEGACY) and len(chunks) >= max_chunks):
                break
            if kind == WINDOW:
                window = True
            elif kind == OPEN:
                in_open = True
            else:
                chunks.append((first, last, kind))
            acc += n
            bound = last if up else first
        else:
            bound = hi if up else lo
    return Plan(
        facts.gen,
        facts.deleted_before,
        lo,
        hi,
        bound,
        window,
        chunks,
        facts.large if hi - lo > 1 else [],
        in_open,
        facts.layout,
    )


def _in_range(first: int, last: int, count: int, lo: int, hi: int) -> int:
    """How many of a unit's messages can lie inside (lo, hi): at most its count and span."""
    a, b = max(first, lo + 1), min(last, hi - 1)
    return 0 if b < a else min(count, b - a + 1)


def plan_reads(plan: Plan, upward: bool, need: int) -> tuple[Containers, int]:
    """The reads of a plan's containers, and how far what they read is complete: the plan's
    bound, or nearer when only the walk's end of a legacy hash is read."""
    lo, hi, bound = plan.lo, plan.hi, plan.bound
    windows = [WindowRead(f"({lo}", f"({hi}", not upward, need)] if plan.window else []
    chunks: list[int] = []
    legacy: list[int] = []
    spans: dict[int, Sequence[int]] = {first: (first,) for first in plan.large}
    for first, last, kind in plan.chunks:
        if kind == CHUNK:
            chunks.append(first)
            spans[first] = range(max(first, lo + 1), min(last, hi - 1) + 1)
            continue
        # The legacy hash of a layout-1 thread can span more than a page: read only the
        # walk's end of it, and trust the result only that far.
        legacy = list(range(max(first, lo + 1), min(last, hi - 1) + 1))
        if len(legacy) > need:
            legacy = legacy[:need] if upward else legacy[-need:]
            bound = min(bound, legacy[-1]) if upward else max(bound, legacy[0])
    containers = Containers(
        windows,
        [*chunks, *plan.large],
        legacy,
        open=plan.open,
        hashes=plan.layout < 3,
        spans=spans,
    )
    return containers, bound
