"""What ``thread.watch()`` yields, and the lease of a turn (docs/EVENTS.md).

Every event has a ``cursor``: pass it as ``watch(after=...)`` (or as an SSE ``Last-Event-ID``) to
go on right after that event. A cursor is ``"<n>-<s>@<born>"`` for an event of the thread's
stream (its n-th event, made when the thread's last sequence was s) or ``"<s>@<born>"`` for
messages paged from storage, up to sequence s; ``born`` names the thread's incarnation, so that
a thread deleted and made again under the id is never taken for the one the cursor came from
(``@0``: a thread made before incarnations were kept). ``kind`` names the event (the SSE event
name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .messages import Message
from .models import TurnOutcome


@dataclass(frozen=True, slots=True)
class TurnLease:
    """A turn held by one producer (``thread.hold_turn``). Pass it where a turn id goes
    (``append(..., turn_id=lease)``, ``publish(lease, delta)``): once another worker holds the
    turn, this lease's writes are refused with ``errors.TurnFenced``."""

    turn_id: str
    lease: int
    reply_start: int


@dataclass(frozen=True, slots=True)
class ThreadEvent:
    """Base of every event: where to resume after it."""

    cursor: str
    kind: ClassVar[str] = "event"


@dataclass(frozen=True, slots=True)
class MessagesAdded(ThreadEvent):
    """Messages stored by one append (from the stream), or a page of stored messages a watcher
    caught up with (``paged``). Messages deleted since (retention, remove_turn) are missing;
    ``messages`` is empty for a watcher made with ``messages=False`` (the sequences say what was
    stored). ``message_ids`` are the ids of ``messages`` (and of a paged event's; empty with
    ``messages=False``, except on events written before layout 3, which listed them)."""

    messages: list[Message]
    first_sequence: int
    last_sequence: int
    turn_id: str | None = None
    paged: bool = False
    message_ids: tuple[str, ...] = ()
    kind: ClassVar[str] = "messages_added"


@dataclass(frozen=True, slots=True)
class MessageReplaced(ThreadEvent):
    """A stored message was replaced (same id and sequence); ``message`` is its content now,
    None when it was deleted since."""

    message_id: str
    sequence: int
    message: Message | None
    kind: ClassVar[str] = "message_replaced"


@dataclass(frozen=True, slots=True)
class TurnStarted(ThreadEvent):
    """A turn started, or was taken over by a new holder (``lease`` > 0)."""

    turn_id: str
    reply_start: int
    lease: int
    kind: ClassVar[str] = "turn_started"


@dataclass(frozen=True, slots=True)
class TurnFinished(ThreadEvent):
    """A turn finished: its last event; every delta of the turn came before it."""

    turn_id: str
    outcome: TurnOutcome
    reply_count: int
    first_sequence: int | None
    last_sequence: int | None
    kind: ClassVar[str] = "turn_finished"


@dataclass(frozen=True, slots=True)
class TurnRemoved(ThreadEvent):
    """Messages of a turn were retracted (``remove_turn``, in steps: ``done`` on the last)."""

    turn_id: str
    removed: int
    done: bool
    kind: ClassVar[str] = "turn_removed"


@dataclass(frozen=True, slots=True)
class Compacted(ThreadEvent):
    """A summary was stored; ``summary`` is None when it was deleted since."""

    summary: Message | None
    summary_sequence: int
    last_sequence: int
    kind: ClassVar[str] = "compacted"


@dataclass(frozen=True, slots=True)
class ThreadDeleted(ThreadEvent):
    """The thread was deleted (another thread may hold its id by now): the watch ends after this
    event. Its cursor names the deleted thread; ``watch(after=0)`` gives the one the id holds now
    from its beginning."""

    kind: ClassVar[str] = "thread_deleted"


@dataclass(frozen=True, slots=True)
class Delta(ThreadEvent):
    """A fragment of a turn's output as it is produced (``thread.publish``), never stored: a
    message in the list API's streaming shape (an AssistantMessage or ReasoningMessage holding
    the new text, a ToolCallMessage holding a ToolCallDelta)."""

    turn_id: str
    message: Message
    lease: int
    kind: ClassVar[str] = "delta"
