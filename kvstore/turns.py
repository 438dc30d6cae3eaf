"""The turn and event methods of Thread and AsyncThread: leases, deltas for watchers, a turn's
start and finish, and the watcher itself (docs/EVENTS.md)."""

from __future__ import annotations

from typing import Any

from ._engine import core
from ._engine.bounds import check_watch
from ._engine.watch_drivers import DEFAULT_BLOCK_MS, AsyncWatch, Watch
from .events import TurnLease
from .messages import Message
from .models import (
    TurnOutcome,
    TurnResult,
)
from .request_turns import RequestTurn, hold_request_turn, hold_request_turn_async
from .thread_base import (
    AwaitsOperations,
    RunsOperations,
    ThreadBase,
    turn_args,
)


class ThreadTurns(ThreadBase):
    """Thread's turn and event methods."""

    _store: RunsOperations[ThreadBase]

    def hold_turn(self, turn_id: str, call_id: str | None = None) -> TurnLease:
        """Starts turn `turn_id` if it is not started, and makes the caller its producer: returns
        a new lease of it. Any earlier lease is refused from then on (TurnFenced): a worker that
        takes over a turn fences off the one it replaces. Pass the lease where a turn id goes
        (:meth:`append`, :meth:`publish`, :meth:`finish_turn`). Raises TurnFinished for a
        finished turn.

        (:meth:`start_turn` is unchanged: a turn started with it has no lease until one is
        held, and its writers are not fenced.)

        Idempotent: each call has an id (`call_id`, made by the store unless you pass one) that
        the server remembers with the lease it gave, so the same call sent again (a timeout,
        cancellation, OutcomeUnknown, whose ``call_id`` it carries) returns that lease and takes
        no second one. Pass your own `call_id` to retry a call you cannot hold on to otherwise.

        Example::

            lease = thread.hold_turn("turn-1")
            thread.publish(lease, "Hel")
            thread.append(AssistantMessage(content="Hello"), turn_id=lease)
            thread.finish_turn(lease)
        """
        return self._store.run(core.hold_turn(self._ref, turn_id, call_id))

    def hold_turn_for(self, request: Message | dict[str, Any]) -> RequestTurn:
        """The idempotent turn (docs/EVENTS.md): stores `request`, a client's message carrying
        the client's otid for this send, and holds the turn that answers it, ``turn-<otid>``. A
        request sent again (a retry: the same otid) is the same turn: the request is stored once;
        a finished turn is not run again (``lease`` None, ``result`` its stored result); an open
        one is taken over (``taken_over``), and its earlier producer's writes are refused with
        TurnFenced from then on.

        Raises InvalidMessage (nothing written) for a request without an otid.

        Example::

            turn = thread.hold_turn_for(UserMessage(content="hi", otid="send-7"))
            if turn.lease is not None:
                thread.append(AssistantMessage(content="hello"), turn_id=turn.lease)
                turn_result = thread.finish_turn(turn.lease)
        """
        return hold_request_turn(self, request)

    def renew_turn(self, lease: TurnLease) -> None:
        """A held turn's heartbeat: its lease lasts ``StoreConfig.turn_lease`` again from now.
        Every append, publish and finish_turn under the lease renews it too; call this when the
        producer works longer than that without writing (a long tool call).

        Raises TurnFenced once another worker holds the turn, or once the lease ended (the turn
        is then finished as "abandoned"), TurnFinished once the turn is finished.

        Example::

            lease = thread.hold_turn("turn-1")
            thread.renew_turn(lease)
        """
        self._store.run(core.renew_turn(self._ref, lease))

    def expire_turn(self, turn_id: str | None = None) -> str | None:
        """Finishes turn `turn_id` (the thread's current turn for None) as "abandoned" if it is
        held and its lease ended, with its TurnFinished event; returns the turn's outcome after
        the call: "open" while it is not held or its lease has time left, None when the thread
        has no turn. Each held turn a newer one superseded is finished so too (docs/EVENTS.md).
        Watchers send it by themselves when the thread is quiet.

        Example::

            thread.expire_turn()  # "abandoned": the producer stopped renewing its lease
        """
        return self._store.run(core.expire_turn(self._ref, turn_id))

    def publish(
        self,
        turn: str | TurnLease,
        delta: Message | dict[str, Any] | str,
        call_id: str | None = None,
    ) -> str:
        """Adds a fragment of an open turn's output to the thread's event stream, for its
        watchers: never stored as a message. `delta` is a message in the list API's streaming
        shape (an AssistantMessage or ReasoningMessage with the new text, a ToolCallMessage with
        a ToolCallDelta) or a str (an AssistantMessage's text). Returns the event's cursor.

        Raises TurnNotFound for a turn never started, TurnFinished once it is finished (so
        finish_turn's event is the turn's last), TurnFenced for a lease another holds now.

        Idempotent as :meth:`hold_turn` is: the same call sent again (same `call_id`) adds no
        second delta and returns the first one's cursor.

        Example::

            thread.publish("turn-1", AssistantMessage(id="msg-1", content="Hel"))
        """
        return self._store.run(core.publish(self._ref, turn, delta, call_id))

    def watch(
        self,
        after: int | str | None = None,
        block_ms: int = DEFAULT_BLOCK_MS,
        messages: bool = True,
    ) -> Watch:
        """Every change to the thread, as it happens: an iterator of events (kvstore.events),
        blocking on the server on its own connection (docs/EVENTS.md).

        `after`: None for changes from now on; an event's ``cursor`` to go on right after it; a
        sequence for every message stored after it, then the changes. A cursor older than the
        event stream holds pages the stored messages first, with no gap and no repeat. Close the
        watcher (``with`` or ``close()``) to close its connection. ``messages=False``: events of
        new messages carry their sequences but not the messages (no read per event).

        On a cluster client the watcher follows the thread's slot through a move or a failover
        by itself, with no event lost or repeated; it raises ConnectionFailed when no primary of
        the slot answers for 30 s, or at once when a standalone server's connection fails (then
        resume with a new watcher from the last cursor).

        Example::

            with thread.watch(after=last_cursor) as events:
                for event in events:
                    send(event.kind, event.cursor)
        """
        check_watch(after, block_ms)
        return Watch(self._store, core.watch(self._ref, after, block_ms, messages), block_ms)

    def start_turn(self, turn_id: str) -> int:
        """Starts turn `turn_id`: records where its replies start, and returns that sequence.

        The turn's replies are the messages appended with this ``turn_id`` from here on (see
        :meth:`finish_turn`, :meth:`list` with ``turn_id``). Retry-safe: starting a turn already
        started (open or finished) returns the sequence recorded then and changes nothing.

        Raises InvalidMessage when `turn_id` is not 1-256 characters without tabs, newlines or
        NUL.

        Example::

            thread.append(UserMessage(content="hi", otid="req-1"), turn_id="turn-1")
            thread.start_turn("turn-1")
            thread.append(AssistantMessage(content="hello", otid="reply-1"), turn_id="turn-1")
            thread.finish_turn("turn-1")
        """
        return self._store.run(core.start_turn(self._ref, turn_id))

    def finish_turn(
        self, turn_id: str | TurnLease, outcome: TurnOutcome = "completed"
    ) -> TurnResult:
        """Finishes turn `turn_id` with `outcome`; returns its result (reply count, first and
        last sequence of its replies). With a :class:`TurnLease`, refused (TurnFenced) once
        another worker holds the turn.

        A finished turn takes no new message (an append to it raises TurnFinished). Retry-safe:
        finishing a finished turn returns the result recorded by the first call, whatever
        `outcome` the retry passes.

        Raises TurnNotFound when the turn was never started in this thread, InvalidMessage when
        `outcome` is not "completed", "steered", "cancelled" or "failed".

        Example::

            result = thread.finish_turn("turn-1", outcome="cancelled")
            result.reply_count, result.first_sequence, result.last_sequence
        """
        return self._store.run(core.finish_turn(self._ref, *turn_args(turn_id, outcome)))


class AsyncThreadTurns(ThreadBase):
    """AsyncThread's turn and event methods."""

    _store: AwaitsOperations[ThreadBase]

    async def hold_turn(self, turn_id: str, call_id: str | None = None) -> TurnLease:
        """The awaited :meth:`Thread.hold_turn`. To retry a call that was cancelled, pass the
        same `call_id` both times."""
        return await self._store.run(core.hold_turn(self._ref, turn_id, call_id))

    async def hold_turn_for(self, request: Message | dict[str, Any]) -> RequestTurn:
        """The awaited :meth:`Thread.hold_turn_for`: same argument, result and errors.

        Example::

            turn = await thread.hold_turn_for(UserMessage(content="hi", otid="send-7"))
        """
        return await hold_request_turn_async(self, request)

    async def renew_turn(self, lease: TurnLease) -> None:
        """The awaited :meth:`Thread.renew_turn`: same argument and errors.

        Example::

            await thread.renew_turn(lease)
        """
        await self._store.run(core.renew_turn(self._ref, lease))

    async def expire_turn(self, turn_id: str | None = None) -> str | None:
        """The awaited :meth:`Thread.expire_turn`: same argument, result and errors.

        Example::

            await thread.expire_turn()
        """
        return await self._store.run(core.expire_turn(self._ref, turn_id))

    async def publish(
        self,
        turn: str | TurnLease,
        delta: Message | dict[str, Any] | str,
        call_id: str | None = None,
    ) -> str:
        """The awaited :meth:`Thread.publish`. To retry a call that was cancelled, pass the
        same `call_id` both times."""
        return await self._store.run(core.publish(self._ref, turn, delta, call_id))

    def watch(
        self,
        after: int | str | None = None,
        block_ms: int = DEFAULT_BLOCK_MS,
        messages: bool = True,
    ) -> AsyncWatch:
        """The async iterator of :meth:`Thread.watch`. Cancelling the task that waits on it
        closes its connection.

        Example::

            async with thread.watch() as events:
                async for event in events:
                    ...
        """
        check_watch(after, block_ms)
        return AsyncWatch(self._store, core.watch(self._ref, after, block_ms, messages), block_ms)

    async def start_turn(self, turn_id: str) -> int:
        """The awaited :meth:`Thread.start_turn`: same arguments, result and errors.

        Example::

            await thread.start_turn("turn-1")
        """
        return await self._store.run(core.start_turn(self._ref, turn_id))

    async def finish_turn(
        self, turn_id: str | TurnLease, outcome: TurnOutcome = "completed"
    ) -> TurnResult:
        """The awaited :meth:`Thread.finish_turn`: same arguments, result and errors.

        Example::

            result = await thread.finish_turn("turn-1")
        """
        return await self._store.run(core.finish_turn(self._ref, *turn_args(turn_id, outcome)))
