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
    messages: list[Message]
    has_more: bool
    deleted_before_sequence: int | None = None


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
    messages: list[Message]
    summary: SummaryMessage | None = None
    turn: TurnState | None = None
    stats: ThreadStats


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
