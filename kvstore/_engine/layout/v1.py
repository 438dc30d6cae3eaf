"""What layout 1 still needs: a thread not yet migrated keeps its records in one legacy hash,
field = sequence (lua/migrate.lua moves them into chunks; the thread is then in layout 2, and
becomes layout 3 as any layout-2 thread does)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .keys import ThreadKeys


def is_layout_1(layout: Any, legacy_exists: Any) -> bool:
    """Whether meta's `layout` field and the legacy hash's existence show a layout-1 thread:
    layout 1 recorded, or none recorded beside a legacy hash (a thread no write touched)."""
    return layout == b"1" or (layout is None and bool(legacy_exists))


def untouched_layout_1(layout: int | None, legacy_fields: int, legacy_last: int | None) -> bool:
    """Whether a thread is in layout 1 and no write has touched it yet (meta's `layout` and
    `legacy_last`, and the legacy hash's size): then meta counts none of its messages."""
    return bool(legacy_fields) and layout in (None, 1) and legacy_last is None


def legacy_read(keys: ThreadKeys, sequences: Sequence[int]) -> tuple[Any, ...]:
    return ("HMGET", keys.legacy, *sequences)


def legacy_records(sequences: Sequence[int], reply: Sequence[Any]) -> dict[int, bytes]:
    return {s: record for s, record in zip(sequences, reply, strict=False) if record is not None}
