"""What an operator sees of a thread's layout (kvstore/admin.py: inspect, migrate): whether the
thread is there and in which layout, its window, its index members, as read by native reads."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..operation import Batch, Operation, ThreadRef
from ..replies import hash_pairs, score_pairs
from ..text import text as _text
from . import CURRENT, version
from .formats import ChunkEntry, LargeEntry

# Index members read per ZRANGE: a thread of millions of messages is listed without one huge reply.
INDEX_PAGE = 5000


@dataclass(frozen=True, slots=True)
class Presence:
    """Which of a thread's roots exist: its meta hash, a layout-1 legacy hash; and whether the
    thread is in the current layout with no window left (nothing for migrate to do)."""

    meta: bool
    legacy: bool
    current: bool = True

    @property
    def exists(self) -> bool:
        return self.meta or self.legacy


@dataclass(frozen=True, slots=True)
class Containers:
    """A thread's containers at a glance: meta's fields, the window's sequences and record bytes,
    the legacy hash's fields (layout 1), the chunks and the oversized messages."""

    meta: dict[str, str]
    window_sequences: list[int]
    window_bytes: int
    legacy_messages: int
    chunks: int
    oversized: int


def presence(thread: ThreadRef) -> Operation:
    keys = thread.keys
    meta, legacy, layout, window = yield Batch(
        [
            ("EXISTS", keys.meta),
            ("EXISTS", keys.legacy),
            ("HGET", keys.meta, "layout"),
            ("EXISTS", keys.window),
        ]
    )
    current = version(layout, legacy) == CURRENT and not window
    return Presence(bool(meta), bool(legacy), current or not (meta or legacy))


def containers(thread: ThreadRef) -> Operation:
    keys = thread.keys
    meta, window, legacy, chunks, large = yield Batch(
        [
            ("HGETALL", keys.meta),
            ("ZRANGE", keys.window, 0, -1, "WITHSCORES"),
            ("HLEN", keys.legacy),
            ("ZCARD", keys.chunk_index),
            ("ZCARD", keys.large_index),
        ]
    )
    pairs = score_pairs(window)
    return Containers(
        {_text(k): _text(v) for k, v in hash_pairs(meta)},
        [int(float(score)) for _, score in pairs],
        sum(len(member) for member, _ in pairs),
        int(legacy),
        int(chunks),
        int(large),
    )


def index_page(thread: ThreadRef, oversized: bool, after: int | None) -> Operation:
    """Up to INDEX_PAGE members of the chunk index (or the large index) above sequence `after`,
    in order: (ChunkEntry or LargeEntry, score). Paging by score, not rank, so members retention
    deletes meanwhile shift nothing."""
    key = thread.keys.large_index if oversized else thread.keys.chunk_index
    low = "-inf" if after is None else f"({after}"
    (page,) = yield Batch(
        [("ZRANGE", key, low, "+inf", "BYSCORE", "LIMIT", 0, INDEX_PAGE, "WITHSCORES")]
    )
    parse = LargeEntry.parse if oversized else ChunkEntry.parse
    return [(parse(member), int(float(score))) for member, score in score_pairs(page)]


def entries(run: Any, thread: ThreadRef, oversized: bool) -> Iterator[Any]:
    """Every member of an index, in order, an index_page at a time through `run` (a store's
    executor of operations)."""
    after = None
    while True:
        page = run(index_page(thread, oversized, after))
        yield from (entry for entry, _ in page)
        if len(page) < INDEX_PAGE:
            return
        after = page[-1][1]
