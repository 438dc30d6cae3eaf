"""The stored layout of a thread, on the Python side: the only code that knows it.

Everything else asks the calls of its modules (docs/LAYOUT.md describes the layout;
lua/includes/ knows the same on the server side). This package imports none of them itself:
keys.py is imported by the config and by operation.py, which reader.py imports in turn.

- keys.py: every key name (ThreadKeys, check_thread_id, check_namespace).
- formats.py: what the scripts store as text: index members (ChunkEntry, LargeEntry), side
  infos and chunk manifests (side_tokens, manifest_tokens, split_chunk), turn headers
  (TurnHeader), and the token rule of a record stored without a count (record_tokens). The
  record itself is record.py's: its bytes are the same in every container of every layout.
- reader.py: the one container reader: Containers (what to read), fetch (one round trip, with
  the caller's checks), cut (in order, inside a range), decode.
- plan.py: which containers hold a page walk's next messages (plan_walk), and their reads
  (plan_reads).
- v3.py: layout 3's native reads: a closed chunk's two strings, the open chunk, the newest
  page in one round trip from the open chunk (two with the newest closed chunks, one again when
  the handle's hint read them ahead; newest_page, which reads a layout-2 thread's window in the
  same round trip).
- v2.py: layout 2's native reads: the newest page of a window (window_page), chunk hashes,
  index and manifest reads (stored_counts, stored_tokens: of layout 3's containers too), the
  sizes stats() reads.
- v1.py: what layout 1 still needs: its legacy hash's reads, and telling such a thread apart
  (is_layout_1).

The layout version is meta's `layout` field (absent beside a legacy hash: 1, never written).
A reader asks :func:`version`; a new layout is a new module beside v2.py and v3.py behind the same calls
(reader.py and plan.py dispatch to it), plus its migration (lua/migrate.lua, lifecycle.migrate).
"""

from __future__ import annotations

from typing import Any

from ... import errors
from .v1 import is_layout_1

# The layout new threads are written in.
CURRENT = 3


def version(layout: Any, legacy_exists: Any) -> int:
    """The layout of a thread from meta's `layout` field and whether its legacy hash exists."""
    if is_layout_1(layout, legacy_exists):
        return 1
    try:
        return int(layout or CURRENT)
    except ValueError:  # something else wrote it: a RecordError naming the field
        raise errors.RecordError(
            f"meta field layout holds {layout!r:.80}, not a layout kvstore writes"
        ) from None


__all__ = ["CURRENT", "version"]
