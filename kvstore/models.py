"""What the store's reads return, besides messages."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from .messages import Message, SummaryMessage

TurnOutcome = Literal["completed", "steered", "cancelled", "failed"]


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True)


class MessagesPage(_Result):
    """One page of messages.

    has_more: messages exist beyond the page in the direction the cursor moved.
    deleted_before_sequence: every sequence below it was deleted by retention (None: nothing was).
    next_cursor: when has_more, the sequence to page on from, which retention cannot expire:
        pass it as `after=` to continue an `after=` (or cursor-less) page, as `before=` to
        continue a `before=` page, with the same order. None when there is nothing more.
    unreadable: sequences of stored records on this page that could not be decoded (written by
        an older version, a bug or raw commands), in page order: they are skipped, each with a
        warning logged on the ``kvstore`` logger naming the thread and the sequence, so a page may
        hold fewer than ``limit`` messages. They still count as places of the page: ``has_more``
        and ``next_cursor`` are as if they were read. ``get`` of such a message raises
        RecordError; ``replace`` and ``remove_turn`` of it work (docs/RELIABILITY.md).
    """

    messages: list[Message]
    has_more: bool
    deleted_before_sequence: int | None = None
    next_cursor: int | None = None
    unreadable: list[int] = []


class ThreadStats(_Result):
    stored_messages: int
    window_messages: int
    chunks: int
    stored_bytes: int
    media_bytes: int
    next_sequence: int
    deleted_before_sequence: int | None = None
    summary_last_sequence: int | None = None
    layout_version: int | None = None


class TurnResult(_Result):
    turn_id: str
    outcome: TurnOutcome
    reply_count: int
    first_sequence: int | None = None
    last_sequence: int | None = None


class TurnState(_Result):
    """The turn reply sequence: the current turn and where its replies start."""

    turn_id: str
    sequence: int
    outcome: Literal["open", "completed", "steered", "cancelled", "failed"]


class ThreadSnapshot(_Result):
    """The newest messages (oldest first), the context summary, the turn and the stats.

    ``unreadable``: the sequences (ascending) of records skipped because they could not be
    decoded, as in :class:`MessagesPage`; the summary's too, when it is the one unreadable.
    """

    messages: list[Message]
    summary: SummaryMessage | None = None
    turn: TurnState | None = None
    stats: ThreadStats
    unreadable: list[int] = []


class AppendResult(list):
    """What ``append`` returns: the stored messages, in the order given, as a plain list.

    ``replayed`` is true when every message of the call was already stored (its otids or ids
    were seen before): the call wrote nothing and the list holds the messages as first stored.
    """

    __slots__ = ("replayed",)

    def __init__(self, messages: Iterable[Message] = (), replayed: bool = False) -> None:
        super().__init__(messages)
        self.replayed = replayed

    def __repr__(self) -> str:
        return f"AppendResult({list.__repr__(self)}, replayed={self.replayed})"
