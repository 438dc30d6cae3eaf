"""Layout 2 (written now): the newest messages in the window (a sorted set, score = sequence,
with their side infos in a hash), older ones in chunks (a hash each: `_m` its manifest, `d` its
records), an oversized message in a chunk of its own; two sorted sets index the chunks and the
oversized messages (docs/LAYOUT.md). The native reads of those containers, and their replies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..operation import (
    OPTIMISTIC_READS,
    Batch,
    Operation,
    ThreadRef,
    changed_under_reads,
    int_or_zero,
)
from ..replies import hash_pairs, score_pairs
from .formats import ChunkEntry, LargeEntry, manifest_tokens, side_tokens, split_chunk
from .keys import ThreadKeys

__all__ = [
    "chunk_read",
    "chunk_records",
    "index_newest",
    "manifest_read",
    "manifest_tokens",
    "older_members",
    "only_layout_2",
    "size_reads",
    "stored_counts",
    "stored_tokens",
    "window_page",
    "window_read",
    "window_records",
]


@dataclass(frozen=True, slots=True)
class WindowRead:
    """ZRANGE BYSCORE of the window from `low` to `high`, as ZRANGE takes them (a sequence, or
    "(<sequence>" exclusive), newest first when `descending`, at most `limit` members.

    With `scores` each member's sequence is its score. Without them (a reply half the size) the
    range must be inclusive and ascending: its members are the sequences low..high when there
    are that many of them, and nothing is found otherwise."""

    low: int | str
    high: int | str
    descending: bool = False
    limit: int | None = None
    scores: bool = True


def window_read(keys: ThreadKeys, read: WindowRead) -> tuple[Any, ...]:
    bounds = (read.high, read.low) if read.descending else (read.low, read.high)
    command: tuple[Any, ...] = ("ZRANGE", keys.window, *bounds, "BYSCORE")
    if read.descending:
        command += ("REV",)
    if read.limit is not None:
        command += ("LIMIT", 0, read.limit)
    return (*command, "WITHSCORES") if read.scores else command


def window_records(read: WindowRead, reply: Any) -> dict[int, bytes]:
    if read.scores:
        return {int(float(score)): member for member, score in score_pairs(reply)}
    first, last = int(read.low), int(read.high)
    if len(reply) != last - first + 1:
        return {}
    return dict(zip(range(first, last + 1), reply, strict=True))


def chunk_read(keys: ThreadKeys, first: int) -> tuple[Any, ...]:
    return ("HMGET", keys.chunk(first), "_m", "d")


def chunk_records(manifest: bytes | None, data: bytes | None) -> dict[int, bytes]:
    return split_chunk(manifest, data)


def manifest_read(keys: ThreadKeys, first: int) -> tuple[Any, ...]:
    """A chunk's manifest alone: its messages' side infos (manifest_tokens reads the counts)."""
    return ("HGET", keys.chunk(first), "_m")


def index_newest(key: str, below: int | None, count: int) -> tuple[Any, ...]:
    """The `count` newest members of an index (chunk_index or large_index), below `below`."""
    top = "+inf" if below is None else f"({below}"
    return ("ZRANGE", key, top, "-inf", "BYSCORE", "REV", "LIMIT", 0, count)


def only_layout_2(layout: Any, legacy_exists: Any) -> bool:
    """Whether meta records layout 2 or 3 and no legacy hash is left beside it (a migration
    leaves one holding the fields that were not sequences)."""
    return layout in (b"2", b"3") and not legacy_exists


@dataclass(slots=True)
class StoredCounts:
    """What a budget plans from (budget.py), read in one round trip: meta's gen, last_seq,
    summary_last, summary_seq and deleted_before; whether the thread can be planned from stored
    counts (layout 2, not being deleted) and was the same throughout the reads; and, when both,
    the counts by sequence of the window's and the open chunk's messages (`window`) and the
    newest chunk and oversized index members."""

    meta: list[Any]
    plannable: bool
    unchanged: bool
    window: dict[int, int] = field(default_factory=dict)
    chunks: list[ChunkEntry] = field(default_factory=list)
    large: list[LargeEntry] = field(default_factory=list)
    # The open chunk's records (layout 3), and whether a layout-2 window holds messages too.
    open_records: dict[int, bytes] = field(default_factory=dict)
    has_window: bool = False
    # The replies to the caller's reads ahead, in order.
    ahead: list[Any] = field(default_factory=list)


def stored_counts(
    thread: ThreadRef, members: int, ahead: Sequence[tuple[Any, ...]] = ()
) -> Operation:
    """The StoredCounts of the thread, with the `members` newest members of each index and the
    open chunk's records; the `ahead` reads (a budget's guess of what it will fetch: budget.py)
    go between meta's two reads, so their replies are as of the same state."""
    keys = thread.keys
    meta, sides, (manifest, data), chunk_members, large_members, legacy, *read, again = yield Batch(
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
            ("MGET", keys.open_manifest, keys.open_data),
            index_newest(keys.chunk_index, None, members),
            index_newest(keys.large_index, None, members),
            ("EXISTS", keys.legacy),
            *ahead,
            ("HMGET", keys.meta, "gen", "last_seq", "summary_seq"),
        ]
    )
    gen, last_seq, summary_last, summary_seq, layout, deleting, deleted_before = meta
    counts = StoredCounts(
        [gen, last_seq, summary_last, summary_seq, deleted_before],
        deleting is None and only_layout_2(layout, legacy),
        list(again) == [gen, last_seq, summary_seq],
    )
    if counts.plannable and counts.unchanged:
        counts.window = {int(s): side_tokens(v) for s, v in hash_pairs(sides)}
        counts.has_window = bool(counts.window)
        counts.open_records = split_chunk(manifest, data, counts.window)
        counts.chunks = [ChunkEntry.parse(m) for m in chunk_members]
        counts.large = [LargeEntry.parse(m) for m in large_members]
        counts.ahead = read
    return counts


def older_members(
    thread: ThreadRef, chunks_below: int | None, large_below: int | None, members: int
) -> Operation:
    """The `members` index members below those read (None: that index is not read), and meta's
    gen and last_seq read after them: (chunks or None, large or None, [gen, last_seq])."""
    keys = thread.keys
    commands: list[tuple[Any, ...]] = []
    if chunks_below is not None:
        commands.append(index_newest(keys.chunk_index, chunks_below, members))
    if large_below is not None:
        commands.append(index_newest(keys.large_index, large_below, members))
    replies = iter((yield Batch([*commands, ("HMGET", keys.meta, "gen", "last_seq")])))
    chunks = [ChunkEntry.parse(m) for m in next(replies)] if chunks_below is not None else None
    large = [LargeEntry.parse(m) for m in next(replies)] if large_below is not None else None
    return chunks, large, list(next(replies))


def size_reads(keys: ThreadKeys) -> list[tuple[Any, ...]]:
    """Meta and the sizes stats() reads: the window's, chunk index's, large index's and the
    legacy hash's."""
    return [
        ("HGETALL", keys.meta),
        ("ZCARD", keys.window),
        ("ZCARD", keys.chunk_index),
        ("ZCARD", keys.large_index),
        ("HLEN", keys.legacy),
    ]


def window_page(
    members: list[Any], bottom: Any, last_seq: Any, deleted_before: Any, need: int
) -> tuple[list[tuple[int, bytes]], bool, int] | None:
    """The newest `need` - 1 records of a layout-2 thread newest first (entries, has_more,
    deleted_before), from its window's `need` newest members (ZRANGE window 0 need-1 REV), the
    `need`-th newest with its score (`bottom`) and meta's last_seq, read after the window; None
    when the page must be planned.

    The window holds the newest messages (docs/LAYOUT.md, "Invariants"). Its members are read
    without their scores (Redis 7.0 prints each score of a WITHSCORES reply as a double: 51 of
    them cost twice the records), and the sequences follow from two numbers: the score of the
    `need`-th newest member and last_seq. Window messages have distinct sequences, none above
    last_seq, so `need` of them from that score up to a last_seq `need - 1` above it are every
    sequence in between. A window shorter than `need` that holds last_seq messages is the whole
    thread. Anything else (an oversized or removed message among the newest, an append in
    between) is read through the plan.
    """
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


def stored_tokens(thread: ThreadRef, sequences: list[int]) -> Operation:
    """The stored token counts of these sequences, from their side infos (the window's, the open
    chunk's manifest, or their chunks' manifests, strings or hashes): two round trips. A
    sequence not stored is left out."""
    if not sequences:
        return {}
    keys = thread.keys
    low, high = min(sequences), max(sequences)
    for _ in range(OPTIMISTIC_READS):
        gen, sides, open_manifest, below, within, large, again = yield Batch(
            [
                ("HGET", keys.meta, "gen"),
                ("HMGET", keys.window_side, *sequences),
                ("GET", keys.open_manifest),
                ("ZRANGE", keys.chunk_index, low, "-inf", "BYSCORE", "REV", "LIMIT", 0, 1),
                ("ZRANGE", keys.chunk_index, f"({low}", high, "BYSCORE"),
                ("ZRANGE", keys.large_index, low, high, "BYSCORE"),
                ("HGET", keys.meta, "gen"),
            ]
        )
        if gen != again:
            continue
        tokens = {
            s: side_tokens(side)
            for s, side in zip(sequences, sides, strict=False)
            if side is not None
        }
        wanted = set(sequences) - set(tokens)
        tokens.update((s, t) for s, t in manifest_tokens(open_manifest).items() if s in wanted)
        wanted -= set(tokens)
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
        # Each chunk's manifest as a layout-3 string and as a layout-2 hash's field.
        reads = [(("GET", keys.chunk_manifest(f)), manifest_read(keys, f)) for f in chunks]
        replies = yield Batch([*(r for pair in reads for r in pair), ("HGET", keys.meta, "gen")])
        if replies[-1] != gen:
            continue
        for string, hashed in zip(replies[:-1:2], replies[1:-1:2], strict=True):
            manifest = string if string is not None else hashed
            tokens.update((s, t) for s, t in manifest_tokens(manifest).items() if s in wanted)
        return tokens
    raise changed_under_reads()
