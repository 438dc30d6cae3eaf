"""The thread's state a watcher reads: its event count, last sequence and incarnation, and its
event stream's ends (event_stream.py); and what an event's fields say of the thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .operation import Batch, Operation, ThreadRef
from .replies import stored_int
from .text import text as _text

# The incarnation of a thread made before incarnations were kept (meta without `born`, events
# without `g`); made ones are the server's time in microseconds.
NO_BORN = "0"


Turns = tuple[str | None, str | None]  # State.turns_to_end


@dataclass(frozen=True, slots=True)
class State:
    count: int  # the thread's event count
    last_seq: int
    born: str | None  # meta `born`
    oldest: tuple[int, int] | None  # the stream's oldest and newest events (n, s)
    newest: tuple[int, int] | None
    open_turn: str | None = None  # the thread's current turn (meta turn_id) while it is open
    older_turns: str | None = None  # the held turns a newer one superseded (meta older_turns)

    @property
    def turns_to_end(self) -> Turns | None:
        """What a watcher may have to end once a lease ended: the open turn and the superseded
        held turns (None: neither)."""
        return (self.open_turn, self.older_turns) if self.open_turn or self.older_turns else None

    @property
    def incarnation(self) -> str | None:
        """The thread's incarnation; None for a thread that had no event yet (the watcher takes
        the incarnation of the first event it reads)."""
        if self.born is not None:
            return self.born
        return NO_BORN if self.count or self.newest else None

    def position(self) -> tuple[int, int]:
        """The thread's newest event (n, s)."""
        if self.newest and self.newest[0] >= self.count:
            return self.newest
        return self.count, self.last_seq


def read_state(thread: ThreadRef) -> Operation:
    """The thread's event count, last sequence and incarnation, and the stream's ends."""
    keys = thread.keys
    meta, oldest, newest = yield Batch(
        [
            (
                "HMGET",
                keys.meta,
                "events",
                "last_seq",
                "born",
                "turn_id",
                "turn_outcome",
                "older_turns",
            ),
            ("XRANGE", keys.events, "-", "+", "COUNT", 1),
            ("XREVRANGE", keys.events, "+", "-", "COUNT", 1),
        ]
    )
    return State(
        stored_int(meta[0] or 0, "meta field events"),
        stored_int(meta[1] or 0, "meta field last_seq"),
        _text(meta[2]) if meta[2] is not None else None,
        id_numbers(oldest[0][0]) if oldest else None,
        id_numbers(newest[0][0]) if newest else None,
        _text(meta[3]) if meta[3] is not None and meta[4] in (b"open", "open") else None,
        _text(meta[5]) if meta[5] else None,
    )


def read_born(thread: ThreadRef) -> Operation:
    (born,) = yield Batch([("HGET", thread.keys.meta, "born")])
    return born


def id_numbers(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    n, _, s = text.partition("-")
    return int(n), int(s)


def stored_before(fields: dict[str, Any], s: int) -> int:
    """The thread's last sequence before the event: an append or a compaction stores after it,
    from `a` on; the other kinds store nothing (their `s`). 0 for a delete: nothing to page."""
    kind = _text(fields.get("k"))
    if kind in ("added", "compacted"):
        return event_int(fields.get("a")) - 1
    return 0 if kind == "deleted" else s


def event_int(value: bytes | None) -> int:
    """An event's number field (0 when it has none)."""
    return stored_int(value, "an event's field") if value else 0
