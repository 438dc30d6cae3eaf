"""Layout 3 (written now): the newest messages in the open chunk (two strings: `open:m` its
manifest, `open:d` its records, appended to in place), older ones in closed chunks (two strings
each, `chunk:<first>:m` and `:d`, or a layout-2 hash kept from before), an oversized message in
a chunk of its own; the two indexes as in layout 2 (docs/LAYOUT.md). A thread migrating from
layout 2 may still hold a window, older than its open chunk. The native reads of those
containers: a chunk's and the open chunk's, and the newest page in one round trip (two when the
page reaches into the newest closed chunks)."""

from __future__ import annotations

from typing import Any

from ..operation import Batch, Operation, ThreadRef, int_or_zero
from ..replies import score_pairs
from . import v2
from .formats import ChunkEntry, LargeEntry, split_chunk
from .keys import ThreadKeys

__all__ = ["chunk_read", "manifest_read", "newest_page", "open_read"]

# (sequence, record) pairs, newest first; has_more; deleted_before.
Page = tuple[list[tuple[int, bytes]], bool, int]


def chunk_read(keys: ThreadKeys, first: int) -> tuple[Any, ...]:
    """A closed chunk's manifest and records (layout-3 strings): both nil for none, or for a
    layout-2 hash (v2.chunk_read reads that)."""
    return ("MGET", keys.chunk_manifest(first), keys.chunk_data(first))


def open_read(keys: ThreadKeys) -> tuple[Any, ...]:
    """The open chunk's manifest and records, in one atomic command."""
    return ("MGET", keys.open_manifest, keys.open_data)


def manifest_read(keys: ThreadKeys, first: int) -> tuple[Any, ...]:
    """A closed chunk's manifest alone (layout-3 string; nil for a hash chunk)."""
    return ("GET", keys.chunk_manifest(first))


_META = ("deleted_before", "deleting", "last_seq", "gen", "layout", "stored", "window_bytes")


def newest_page(thread: ThreadRef, need: int) -> Operation:
    """The newest `need` - 1 records newest first (entries, has_more, deleted_before) from native
    reads, or None when the page must be planned.

    One round trip reads meta, the open chunk, the newest oversized members and the newest
    closed chunks' members, and meta's gen and last_seq again: equal, nothing moved, went or came
    in between. Every message from the open chunk's first sequence on is in the open chunk or
    oversized; every closed chunk and the window (of a thread migrating from layout 2) hold older
    ones. So the newest `need` messages are the open chunk's when no oversized one is among
    them. Else, with no window left and no oversized message in the way, the newest closed
    chunks add what they hold: read ahead in that round trip when it is the one chunk this
    handle's last newest page needed (its hint: the same while the open chunk fills; kept by
    pages the open chunk answers alone), else in a second round trip (gen compared). Anything
    else is planned. A layout-2 thread reads its window (v2.newest_page) in the same round trip;
    one this store has seen at layout 3 reads none (meta's window_bytes tells of a window left; a
    read at another layout since is planned, the next reads the window). Each command costs the
    client more than the strings it carries: the open and read-ahead chunks are one MGET.
    """
    # Closed chunk members enough for the page when they are full.
    members = need // thread.config.chunk_size + 2
    ahead = _ahead(thread, need)
    window_read = _LAYOUT_3 not in thread.hints
    replies = yield Batch(_newest_reads(thread.keys, need, members, ahead, window_read))
    meta, strings, large, newest_chunks, *window_replies, again = replies
    deleted_before, deleting, last_seq, gen, layout, stored, window_bytes = meta
    manifest, data = strings[:2]
    if deleting is not None or layout != b"3":
        thread.hints.pop(_AHEAD, None)
        thread.hints.pop(_LAYOUT_3, None)
    if deleting is not None:  # an interrupted delete(): the thread reads as empty
        return [], False, 0
    if layout != b"3":
        if not window_read:
            return None  # no window read: the plan reads this thread
        # Layout 2: last_seq as read after the window.
        window, bottom = window_replies
        return v2.window_page(window, bottom, again[1], deleted_before, need)
    thread.hints[_LAYOUT_3] = True
    # A migration's window left: read, or (not read) told by its bytes in meta.
    window = bool(window_replies[0]) if window_read else int_or_zero(window_bytes) > 0
    if [gen, last_seq] != list(again):
        return None
    records = split_chunk(manifest, data)
    oversized = sorted((LargeEntry.parse(m).sequence for m in large), reverse=True)
    floor = min(records) if records else int_or_zero(last_seq) + 1
    newest = sorted([*records, *(s for s in oversized if s >= floor)], reverse=True)
    page = _page(newest, records, need, int_or_zero(stored), int_or_zero(deleted_before))
    if page is not None or window or not newest_chunks or len(newest) >= need:
        return page
    chosen = _newest_chunks(newest_chunks, len(newest), need, members)
    # The newest closed chunks hold the next older messages, unless an oversized one is newer.
    if chosen is None or any(s >= chosen[-1].first for s in oversized):
        thread.hints.pop(_AHEAD, None)
        return None
    _remember(thread, chosen, len(newest))
    # Read ahead between meta's two reads, which are equal: as of the same state as the rest.
    found = {first: strings[2 + 2 * i : 4 + 2 * i] for i, first in enumerate(ahead)}
    if all(None not in found.get(entry.first, (None,)) for entry in chosen):
        return _with_read(chosen, found, records, need, stored, deleted_before)
    return (yield from _with_chunks(thread, chosen, records, need, gen, stored, deleted_before))


def _with_read(
    chosen: list[ChunkEntry],
    found: dict[int, Any],
    records: dict[int, bytes],
    need: int,
    stored: Any,
    deleted_before: Any,
) -> Page | None:
    """The page from the open chunk's `records` and the `chosen` chunks' strings as `found`."""
    both = dict(records)
    for entry in chosen:
        both.update(split_chunk(*found[entry.first]))
    newest = sorted(both, reverse=True)
    return _page(newest, both, need, int_or_zero(stored), int_or_zero(deleted_before))


def _newest_reads(
    keys: ThreadKeys, need: int, members: int, ahead: tuple[int, ...], window: bool
) -> list[tuple[Any, ...]]:
    """newest_page's one round trip: meta; the open chunk's strings and those of the closed
    chunks read `ahead`; the newest `need` oversized and `members` closed chunk members; with
    `window`, a layout-2 window's newest `need` members and the `need`-th newest with its
    score; meta's gen and last_seq again."""
    return [
        ("HMGET", keys.meta, *_META),
        (*open_read(keys), *(key for first in ahead for key in chunk_read(keys, first)[1:])),
        ("ZRANGE", keys.large_index, "+inf", "-inf", "BYSCORE", "REV", "LIMIT", 0, need),
        ("ZRANGE", keys.chunk_index, "+inf", "-inf", "BYSCORE", "REV", "LIMIT", 0, members),
        *(
            (
                ("ZRANGE", keys.window, 0, need - 1, "REV"),
                ("ZRANGE", keys.window, need - 1, need - 1, "REV", "WITHSCORES"),
            )
            if window
            else ()
        ),
        ("HMGET", keys.meta, "gen", "last_seq"),
    ]


# Set once this store read the thread at layout 3 (its newest page then reads no window).
_LAYOUT_3 = "newest_page_layout_3"

# The hint newest_page leaves: the first sequence of the one closed chunk it needed, and how
# many newer messages (the open chunk's, oversized ones) there were then.
_AHEAD = "newest_page_chunks"


def _ahead(thread: ThreadRef, need: int) -> tuple[int, ...]:
    """The closed chunk to read ahead: the hint's, unless the `need` newest messages were all
    newer than it when it was left (the open chunk only grows until it closes, and then the
    hint names a chunk the index no longer puts first). A page that needed no closed chunk
    keeps the hint: a short read of the newest (an append's look at the tail) reads no chunk
    ahead, and the next long one still reads its chunk in one round trip."""
    hint = thread.hints.get(_AHEAD)
    if hint is None or need <= hint[1]:
        return ()
    return (hint[0],)


def _remember(thread: ThreadRef, chosen: list[ChunkEntry], newer: int) -> None:
    # One chunk at most: a wrong guess costs one chunk's read.
    if len(chosen) == 1:
        thread.hints[_AHEAD] = (chosen[0].first, newer)
    else:
        thread.hints.pop(_AHEAD, None)


def _newest_chunks(
    members: list[Any], have: int, need: int, listed: int
) -> list[ChunkEntry] | None:
    """The newest closed chunks (index members, newest first) that add up to `need` with the
    `have` newer messages, or all of them; None when more may be needed than were listed."""
    chosen: list[ChunkEntry] = []
    for entry in map(ChunkEntry.parse, members):
        chosen.append(entry)
        if have + sum(e.count for e in chosen) >= need:
            return chosen
    return None if len(members) == listed else chosen


def _page(
    newest: list[int], records: dict[int, bytes], need: int, stored: int, deleted_before: int
) -> Page | None:
    """The page of the `newest` sequences (newest first) when they make it and `records` holds
    every one it shows: `need` of them, or every stored message."""
    if len(newest) >= need:
        shown = newest[: need - 1]
        has_more = True
    elif len(newest) == stored:
        shown, has_more = newest, False
    else:
        return None
    if any(s not in records for s in shown):
        return None
    return [(s, records[s]) for s in shown], has_more, deleted_before


def _with_chunks(
    thread: ThreadRef,
    chosen: list[ChunkEntry],
    records: dict[int, bytes],
    need: int,
    gen: Any,
    stored: Any,
    deleted_before: Any,
) -> Operation:
    """The page from the open chunk's `records` and the `chosen` newest closed chunks' (second
    round trip, gen compared; each chunk as strings or as a layout-2 hash), or None."""
    keys = thread.keys
    reads = [(chunk_read(keys, e.first), v2.chunk_read(keys, e.first)) for e in chosen]
    replies = yield Batch([*(r for pair in reads for r in pair), ("HGET", keys.meta, "gen")])
    if replies[-1] != gen:
        return None
    both = dict(records)
    for strings, hashed in zip(replies[:-1:2], replies[1:-1:2], strict=True):
        manifest, data = strings if strings[0] is not None and strings[1] is not None else hashed
        both.update(split_chunk(manifest, data))
    newest = sorted(both, reverse=True)
    return _page(newest, both, need, int_or_zero(stored), int_or_zero(deleted_before))


def window_bounds(reply_low: Any, reply_high: Any) -> tuple[int, int] | None:
    """The lowest and highest window sequence of two ZRANGE ... LIMIT 0 1 WITHSCORES replies."""
    low, high = score_pairs(reply_low), score_pairs(reply_high)
    if not low or not high:
        return None
    return int(float(low[0][1])), int(float(high[0][1]))
