"""What Thread and AsyncThread share: their store (as a protocol: a thread only asks it to run
core operations), the thread's keys, and the types of their arguments."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator
from typing import Any, Literal, Protocol, TypeVar, overload

from ._engine import core
from ._engine.bounds import check_lease
from ._engine.core import ThreadRef
from .events import TurnLease
from .messages import Message

Order = Literal["asc", "desc"]
"""A page's order: "asc" lists oldest first, "desc" newest first."""
Messages = Message | dict[str, Any] | Iterable[Message | dict[str, Any]]
"""What ``append`` takes: one message (a model or a dict in the list API's shape), or several."""
# Inside Thread, `list` is the method: an annotation evaluated in the class's scope (pdoc,
# Python 3.14's lazy annotations) needs the builtin under another name.
_MessageList = list[Message]
_Result = TypeVar("_Result")  # a core operation's result
_Thread = TypeVar("_Thread", covariant=True)  # the store's threads (Thread, AsyncThread)


class RunsOperations(Protocol[_Thread]):
    """What a Thread asks of its store (a MessageStore)."""

    def run(self, operation: core.Operation[_Result]) -> _Result:
        """Runs a core operation; returns its result."""

    def stream(self, operation: Any) -> Iterator[Any]:
        """Runs a core operation, handing out its outputs (pages) as they come."""

    def thread(self, thread_id: str, owner: str | None = None) -> _Thread:
        """The thread `thread_id` of this store."""


class AwaitsOperations(Protocol[_Thread]):
    """What an AsyncThread asks of its store (an AsyncMessageStore)."""

    def run(self, operation: core.Operation[_Result]) -> Awaitable[_Result]:
        """Runs a core operation; its result, awaited."""

    def stream(self, operation: Any) -> AsyncIterator[Any]:
        """Runs a core operation, handing out its outputs (pages) as they come."""

    def thread(self, thread_id: str, owner: str | None = None) -> _Thread:
        """The thread `thread_id` of this store."""


class ThreadBase:
    """What Thread and AsyncThread share: their store and the thread's keys."""

    def __init__(self, store: Any, ref: ThreadRef) -> None:
        self._store = store
        self._ref = ref

    @property
    def keys(self) -> core.ThreadKeys:
        """The names of the thread's keys (docs/LAYOUT.md), all under one hash tag."""
        return self._ref.keys

    @property
    def thread_id(self) -> str:
        """The thread's id."""
        return self._ref.thread_id

    @property
    def owner(self) -> str | None:
        """The thread's owner (docs/OWNERS.md), None for a thread of its own."""
        return self._ref.owner


def thread_id_of(ref: ThreadRef) -> str:
    """The thread's id (within its owner's, for an owned thread)."""
    return ref.thread_id


_Between = TypeVar("_Between")  # what comes between a turn's id and its lease


@overload
def turn_args(turn: str | TurnLease | None) -> tuple[str | None, int]: ...
@overload
def turn_args(turn: str | TurnLease, between: _Between, /) -> tuple[str, _Between, int]: ...
def turn_args(turn: str | TurnLease | None, *between: Any) -> tuple[Any, ...]:
    """A turn id or lease as the core takes it: the id, what comes between, the lease (0: none)."""
    if isinstance(turn, TurnLease):
        return (turn.turn_id, *between, check_lease(turn.lease))
    return (turn, *between, 0)
