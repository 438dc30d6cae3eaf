"""What the writing scripts reply and what they store in small text values, as typed values.

Each ``<Script>Reply.decode`` reads one script's reply in the shape its header states (the
``Reply:`` line of ``lua/<script>.lua``); a reply of any other shape is a ServerError naming the
script, never an IndexError somewhere later. The parsers below read the values the scripts write
as text and Python reads back: a chunk index member and a turn's header (docs/LAYOUT.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .. import errors
from .layout import CURRENT
from .text import text as _text

_STORED_INT = re.compile(r"-?[0-9]{1,19}")


def stored_int(value: Any, what: str) -> int:
    """A number the scripts keep as text (a meta field, a member's field), read back; RecordError
    naming `what` for any other value (a number written as "1e+14", or a foreign value), never
    a bare ValueError."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    if not isinstance(text, str) or not _STORED_INT.fullmatch(text):
        raise errors.RecordError(f"{what} holds {value!r:.80}, not a number kvstore writes")
    return int(text)


def _unexpected(script: str, reply: Any) -> errors.ServerError:
    return errors.ServerError(
        f"script {script}.lua replied {reply!r:.200}, not the reply its header states"
    )


def _list(script: str, reply: Any, length: int) -> list[Any]:
    """The reply as a list of the length its script states, or a ServerError."""
    if not isinstance(reply, list) or len(reply) != length:
        raise _unexpected(script, reply)
    return reply


def _number(script: str, reply: Any) -> int:
    if isinstance(reply, bool) or not isinstance(reply, int):
        raise _unexpected(script, reply)
    return reply


# ----------------------------------------------------------------------- script replies
# Not frozen: a frozen dataclass's __init__ costs several times a plain one's, and every write
# decodes a reply.


@dataclass(slots=True)
class Replayed:
    """A message an append found already stored: its sequence, and its stored id (None where no
    side info names it: a layout-1 message not yet migrated)."""

    sequence: int
    id: str | None


@dataclass(slots=True)
class AppendReply:
    """lua/append.lua: the batch was stored from `first_sequence` on, or (a replay) every
    message was already stored, as `replayed` lists in batch order."""

    stored: bool
    first_sequence: int | None
    replayed: tuple[Replayed, ...]

    @classmethod
    def decode(cls, reply: Any, count: int | None = None) -> AppendReply:
        """`count`: the messages the call sent; a replay must name each of them."""
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == 1:
            return cls(True, int(reply[1]), ())
        replay_length = None if count is None else 2 * count + 1
        if (
            isinstance(reply, list)
            and len(reply) % 2 == 1
            and reply[0] == 0
            and len(reply) == (replay_length or len(reply))
        ):
            pairs = zip(reply[1::2], reply[2::2], strict=True)
            return cls(False, None, tuple(Replayed(int(s), _text(i) or None) for s, i in pairs))
        raise _unexpected("append", reply)


@dataclass(slots=True)
class CompactReply:
    """lua/compact.lua: the summary's sequence, and whether this call stored it (else it was a
    replay of the current summary) and how many chunks its retention deleted."""

    stored: bool
    summary_sequence: int
    chunks_deleted: int

    @classmethod
    def decode(cls, reply: Any) -> CompactReply:
        stored, sequence, deleted = _list("compact", reply, 3)
        return cls(stored == 1, int(sequence), int(deleted))


@dataclass(slots=True)
class RetainReply:
    """lua/retain.lua: the chunks this call deleted (at most max_chunks_per_call)."""

    chunks_deleted: int

    @classmethod
    def decode(cls, reply: Any) -> RetainReply:
        return cls(_number("retain", reply))


@dataclass(slots=True)
class StartTurnReply:
    """lua/start_turn.lua: the sequence the turn's replies start at."""

    reply_start: int

    @classmethod
    def decode(cls, reply: Any) -> StartTurnReply:
        return cls(_number("start_turn", reply))


@dataclass(slots=True)
class FinishTurnReply:
    """lua/finish_turn.lua: the result the turn's first finish recorded."""

    reply_count: int
    first_sequence: int | None
    last_sequence: int | None
    reply_start: int
    outcome: str

    @classmethod
    def decode(cls, reply: Any) -> FinishTurnReply:
        count, first, last, start, outcome = _list("finish_turn", reply, 5)
        return cls(int(count), int(first) or None, int(last) or None, int(start), _text(outcome))


@dataclass(slots=True)
class ReplaceReply:
    """lua/replace.lua: the replaced message's sequence (unchanged by the replace)."""

    sequence: int

    @classmethod
    def decode(cls, reply: Any) -> ReplaceReply:
        return cls(_number("replace", reply))


@dataclass(slots=True)
class RemoveTurnReply:
    """lua/remove_turn.lua: the messages this call removed, and how many the turn still holds
    (another call removes more)."""

    removed: int
    remaining: int

    @classmethod
    def decode(cls, reply: Any) -> RemoveTurnReply:
        removed, remaining = _list("remove_turn", reply, 2)
        return cls(int(removed), int(remaining))


@dataclass(slots=True)
class DeleteReply:
    """lua/delete.lua: whether the thread is gone (or, for 'continue', was not being deleted);
    False when more calls are needed."""

    done: bool

    @classmethod
    def decode(cls, reply: Any) -> DeleteReply:
        return cls(_number("delete", reply) == 1)


@dataclass(slots=True)
class MigrateReply:
    """lua/migrate.lua: one migration step. `scanning` while a layout-1 thread's legacy range is
    still being scanned (writes are refused until it ends); `fields_left`, once the layout is 2
    or 3, counts the legacy fields that were not sequences and stay; `window_left` the messages
    still in the window (the layout-2 leftover a layout-3 thread drains)."""

    chunks_written: int
    layout: int
    scanning: bool
    fields_left: int
    window_left: int

    @classmethod
    def decode(cls, reply: Any) -> MigrateReply:
        chunks, layout, scanning, left, window = _list("migrate", reply, 5)
        return cls(int(chunks), int(layout), bool(int(scanning)), int(left), int(window))

    @property
    def done(self) -> bool:
        """Whether the thread is in the current layout with an empty window."""
        return self.layout == CURRENT and self.window_left == 0


def score_pairs(reply: list[Any]) -> list[tuple[Any, Any]]:
    """(member, score) pairs of a WITHSCORES reply: flat in RESP2, nested in RESP3."""
    if reply and isinstance(reply[0], list):
        return [(member, score) for member, score in reply]
    return list(zip(reply[0::2], reply[1::2], strict=False))


def hash_pairs(reply: Any) -> list[tuple[Any, Any]]:
    """(field, value) pairs of an HGETALL reply: a dict from redis-py, a flat list otherwise."""
    if isinstance(reply, dict):
        return list(reply.items())
    return list(zip(reply[0::2], reply[1::2], strict=False))


@dataclass(slots=True)
class RestoreReply:
    """lua/restore.lua: the run's messages restored now, and those restored before."""

    restored: int
    already_stored: int

    @classmethod
    def decode(cls, reply: Any) -> RestoreReply:
        restored, already = _list("restore", reply, 2)
        return cls(_number("restore", restored), _number("restore", already))
