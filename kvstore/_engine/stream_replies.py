"""XREAD's replies as a watcher's core reads them: the entries, and the mark of the first read
after a recovery (its slot's primary changed: event_stream.py checks the history it delivered)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class AfterRecovery(list[Any]):
    """The entries of the first read on the node a watcher's recovery found."""


def stream_entries(reply: Any) -> Sequence[tuple[Any, dict[bytes, bytes]]]:
    """XREAD's reply as a list of (id, fields), for RESP2 and RESP3 clients."""
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3: {key: [entries]}
        (entries,) = reply.values()
        return entries[0] if len(entries) == 1 and isinstance(entries[0], list) else entries
    resp2: Sequence[tuple[Any, dict[bytes, bytes]]] = reply[0][1]  # [[key, entries]]
    return resp2
