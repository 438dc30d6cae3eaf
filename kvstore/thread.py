"""Thread: one conversation, each method one call to its store.

Every method hands one core operation (kvstore._engine.core) to the store it was made by
(kvstore/store.py), which runs it: sync on MessageStore, awaited on AsyncMessageStore
(AsyncThread, kvstore/async_thread.py, importable from here too). The turn and event methods are
in kvstore/turns.py, what both threads share in kvstore/thread_base.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ._engine import core, owner_entries, owners
from ._engine.core import Cursor
from .async_thread import AsyncThread as AsyncThread  # kvstore.thread.AsyncThread, as before
from .events import TurnLease
from .messages import CompactionStats, Message, SummaryMessage
from .models import (
    AppendResult,
    MessagesPage,
    ThreadInfo,
    ThreadSnapshot,
    ThreadStats,
)
from .thread_base import (
    Messages,
    Order,
    RunsOperations,
    _MessageList,
    thread_id_of,
    turn_args,
)
from .turns import ThreadTurns


class Thread(ThreadTurns):
    """One conversation. Cheap to make; holds no state beyond its keys (and a read hint: which
    closed chunks its last newest page needed, checked by every read that uses it).

    Made by :meth:`MessageStore.thread`. Every method is one call to the store, safe to run
    from any number of processes on the same thread at once: each write is one atomic script
    on the server.

    Example::

        thread = store.thread("user-42:session-7")
        stored = thread.append([UserMessage(content="hi"), AssistantMessage(content="hello")])
        page = thread.list(limit=50, order="desc")
    """

    _store: RunsOperations[Thread]

    def append(
        self,
        messages: Messages,
        turn_id: str | TurnLease | None = None,
        tokens: Sequence[int] | None = None,
    ) -> AppendResult:
        """Stores the messages in one atomic call; returns the stored copies (id, date, seq_id).

        `tokens`: each message's token count, one int from 0 to 2**31 per message in order (an int for a
        single message); without it the store's ``count_tokens`` counts them, else one token
        per 4 bytes of a message's record (docs/HISTORY.md, "Counting tokens"). A count that is
        not an int from 0 to 2**31, or a list of another length, raises InvalidMessage before
        anything is sent; a write that would take the thread's token total past 2**52 raises
        MessageTooLarge (docs/LAYOUT.md, "Number bounds").

        `turn_id` may be a :class:`TurnLease` (:meth:`hold_turn`): the append is then refused
        with TurnFenced once another worker holds the turn.

        Idempotent: every message the call sends carries an id, the call's token. A message of
        yours without an id (a model or a dict; JSON text cannot carry it back) gets the one the
        store made set on it before the call is sent, so sending the same messages again, after
        any interruption (a timeout, cancellation, KeyboardInterrupt, OutcomeUnknown, a retried
        request), is a replay: it writes nothing and returns the messages as first stored, with
        ``replayed`` true. To store the same content again as a new message, send a new message
        (or a copy without its id). Otids work the same way across processes: a batch whose
        otids are all stored is a replay.
        """
        return self._store.run(core.append(self._ref, messages, *turn_args(turn_id), tokens=tokens))

    def list(
        self,
        after: Cursor = None,
        before: Cursor = None,
        limit: int = 50,
        order: Order = "asc",
        turn_id: str | None = None,
    ) -> MessagesPage:
        """One page of the thread's messages, in the list API's paging terms.

        ``order="asc"`` lists oldest first, ``"desc"`` newest first. A cursor is a message id
        or a sequence (an int). ``after=X`` returns the `limit` messages that follow X *in the
        chosen order* (the next page); ``before=X`` returns the `limit` messages that precede X
        in that order (the previous page), still listed in that order; both together bound a
        range. So with ``order="desc"``, ``after=X`` gives messages older than X and
        ``before=X`` newer ones. Without a cursor the page starts at the oldest message
        ("asc") or the newest ("desc"). With `turn_id`, only that turn's messages are paged.

        ``page.has_more`` says whether messages exist beyond the page in the direction the
        cursor moved; ``page.next_cursor`` continues it (pass it as ``after=`` after an
        ``after=`` or cursor-less page, as ``before=`` after a ``before=`` page, same order):
        it is a sequence, which retention cannot expire. ``page.deleted_before_sequence`` is
        set when retention has deleted older messages. A page may hold fewer than `limit`
        messages when stored records cannot be read (``page.unreadable``).

        Raises InvalidCursor (`limit` outside 1..1000, an `order` other than "asc"/"desc", a
        malformed cursor), MessageNotFound (an id cursor that names no stored message),
        CursorExpired (an id cursor whose message retention may have deleted).

        Example, newest first, then the page of older messages::

            page = thread.list(limit=50, order="desc")
            if page.has_more:
                older = thread.list(after=page.next_cursor, limit=50, order="desc")
        """
        return self._store.run(core.list_page(self._ref, after, before, limit, order, turn_id))

    def iter(self, order: Order = "asc") -> Iterator[Message]:
        """Every kept message of the thread, in `order`, read a page at a time: 200 messages
        first, then twice as many each page, up to 1,000 (a long thread in few round trips).

        It is not one state of the thread: messages appended while it runs appear when their
        place has not been passed yet; use :meth:`snapshot` or :meth:`context` for one state.

        Example::

            for message in thread.iter(order="desc"):
                print(message.seq_id, message.message_type)
        """
        for page in self._store.stream(core.pages(self._ref, order)):
            yield from page.messages

    def get(self, message_id: str) -> Message:
        """The stored message with that id.

        Raises MessageNotFound when none is stored (or retention deleted it), RecordError when
        its stored record cannot be decoded.

        Example::

            message = thread.get(stored[0].id)
        """
        return self._store.run(core.get(self._ref, message_id))

    def get_by_otid(self, otid: str) -> Message:
        """The stored message with that otid; MessageNotFound if none is (or it was deleted).

        RecordError when its stored record cannot be decoded.

        Example::

            reply = thread.get_by_otid("reply-1")
        """
        return self._store.run(core.get_by_otid(self._ref, otid))

    def snapshot(self) -> ThreadSnapshot:
        """The newest 200 messages (oldest first), the context summary, the current turn and the
        stats, all of one state of the thread, even while other workers append or compact.

        Example::

            snap = thread.snapshot()
            snap.messages[-1], snap.summary, snap.turn, snap.stats.stored_messages
        """
        return self._store.run(core.snapshot(self._ref))

    def context(
        self, max_tokens: int | None = None, count_tokens: Callable[[Message], int] | None = None
    ) -> _MessageList:
        """The model input: the latest summary (if any) and every message after the sequence it
        covers, oldest first. Without a compaction, every stored message. The system messages
        the thread starts with come first in every context, also when a summary covers them,
        and are counted against `max_tokens` first (docs/HISTORY.md, "The system prompt").

        With `max_tokens`, the summary and the newest messages whose tokens fit what the summary
        leaves. Without `count_tokens` the counts stored with the messages decide (given to
        :meth:`append`, or counted when written), planned in two round trips whatever the
        thread's length; with `count_tokens` (your tokenizer) each message read is counted by
        it, pages read newest first (one or two round trips for a budget of a few hundred
        messages). The system messages the thread starts with and the summary are always
        included, even alone over the budget.

        A tool-call pair is never split (docs/HISTORY.md): a tool return or approval response
        whose call the summary covers brings that call (and what lies between) back in when it
        is still stored and fits the budget, and is otherwise left out; a budget that cuts
        between a call and its answer leaves the answer out.

        It reads only the chunks after the summary, and one state of the thread: a compaction
        landing while it reads makes it read again.

        Example::

            prompt = [m.to_dict() for m in thread.context(max_tokens=8000)]
        """
        return self._store.run(core.context(self._ref, max_tokens, count_tokens))

    def compact(
        self,
        summary: str,
        last_sequence: int,
        stats: CompactionStats | dict[str, Any] | None = None,
        tokens: int | None = None,
    ) -> SummaryMessage:
        """Stores a summary of the messages up to `last_sequence`, and returns it (a
        SummaryMessage with its id, date and seq_id).

        From then on :meth:`context` starts at this summary, and retention may delete the
        oldest chunks the summary covers while keeping at least
        ``StoreConfig.retained_message_limit`` messages after them. Retry-safe: sending the same
        `last_sequence` again returns the summary already stored (the same summary and
        `last_sequence`: also after another caller compacted further). `stats` is the list API's
        CompactionStats (a model or a dict); `tokens` the summary's token count (counted as
        append counts a message when not given).

        Raises InvalidSummaryRange when `last_sequence` is not a positive int no later than the
        thread's last sequence, or is before the current summary's (summaries only move
        forward); MessageTooLarge as append does.

        A `last_sequence` between a tool call (or approval request) and its answer is moved
        back to just before the call, so that the summary never covers half of a pair
        (docs/HISTORY.md); :meth:`stats` shows where it ended. It never moves into the current
        summary's range: a call just after it raises InvalidSummaryRange, nothing written.

        Example::

            last = thread.stats().next_sequence - 1
            summary = thread.compact("The user asked about Oslo's weather.", last)
        """
        return self._store.run(core.compact(self._ref, summary, last_sequence, stats, tokens))

    def fork(self, new_thread_id: str, at: str | int) -> Thread:
        """Makes the thread `new_thread_id` hold this thread's history up to and including
        message `at` (its id, or its sequence), and returns it: for "edit a message and
        regenerate", or for trying two continuations.

        Messages keep their ids and sequences; the summary (if stored by then), retention
        (``deleted_before``) and the turns started by then are carried over, a turn with
        messages after `at` open again. ``stats()`` of the new thread names its parent and
        fork point. The copy runs in bounded steps (the threads live in their own hash slots),
        each idempotent: a fork interrupted anywhere is finished by calling it again, and a
        finished one returns at once.

        Raises MessageNotFound when `at` is not stored (or retention deleted it), or when this
        thread was deleted (expired, made again) during the copy, RestoreConflict when
        `new_thread_id` already holds other messages or is a finished fork with another point
        or source (a fork keeps its point), or was deleted or erased between two of the copy's
        steps (call it again), ServerError when a compaction ran during the copy (call it
        again). An owned thread's fork is its owner's
        (docs/OWNERS.md): QuotaExceeded or StorageQuotaExceeded when the owner's quotas refuse
        it, at any of its steps, and then no thread is left (the copy so far is deleted).

        Example::

            draft = thread.fork("user-42:session-7:edit-1", at=user_message_id)
            draft.append(UserMessage(content="Actually, Bergen."))
        """
        new = self._store.thread(new_thread_id, self._ref.owner)
        self._store.run(core.fork(self._ref, thread_id_of(self._ref), new._ref, at))
        return new

    def replace(
        self, message_id: str, message: Message | dict[str, Any], tokens: int | None = None
    ) -> Message:
        """Replaces the stored message `message_id` by `message`; returns the stored copy.

        The new message keeps the original's id, sequence, turn and otid (an otid it carries is
        ignored), and its date unless it sets one. It may be of another message type (the
        thread's current summary replaced by a non-summary leaves the thread without one:
        docs/HISTORY.md, "Replacing the summary"). `tokens` is the new message's token count
        (counted as append counts a message when not given).

        Raises MessageNotFound when no stored message has that id, InvalidMessage /
        MessageTooLarge for the new message as append does.

        Example::

            thread.replace(message.id, AssistantMessage(content="Cloudy, 5 °C."))
        """
        return self._store.run(core.replace(self._ref, message_id, message, tokens))

    def remove_turn(self, turn_id: str) -> int:
        """Retracts turn `turn_id`: removes every message appended with it, wherever it is
        stored; returns how many were removed (0 when none is stored).

        The thread's sequences are not reused; removed messages give their bytes back.

        Raises InvalidMessage for a malformed `turn_id`.

        Example::

            removed = thread.remove_turn("turn-1")
        """
        return self._store.run(core.remove_turn(self._ref, turn_id))

    def migrate(self, max_calls: int | None = None) -> int:
        """Moves a thread of an older layout to the current one (layout 3), one bounded call at
        a time; returns the number of calls made (the last one finds the thread done, so a
        thread already in layout 3 takes one).

        A layout-1 thread's legacy hash moves into chunks (layout 2 on the way); a layout-2
        thread becomes layout 3 and the window it kept moves into chunks. Stops when the thread
        is in layout 3 with no window left, or after `max_calls` calls (None: until done). A
        thread's writes do the same a step at a time; call it to finish a thread ahead of time.
        Stopped anywhere and called again, it goes on where the thread is.

        Example, in steps of at most 10 calls::

            while thread.migrate(max_calls=10) == 10:
                pass
        """
        return self._store.run(core.migrate(self._ref, max_calls))

    def stats(self) -> ThreadStats:
        """The thread's counts and sizes: stored and window messages, chunks, stored and media
        bytes, the next sequence, what retention and compaction covered, the layout version.

        An unknown thread reads as empty (``stored_messages == 0``, ``next_sequence == 1``).

        Example::

            stats = thread.stats()
            stats.stored_messages, stats.next_sequence, stats.deleted_before_sequence
        """
        return self._store.run(core.stats(self._ref))

    def info(self) -> ThreadInfo | None:
        """An owned thread's title, metadata, times and counts, from its owner's directory
        (no message is read); None when it is not listed (nothing written yet, or deleted) or
        has no owner.

        Example::

            info = store.thread("session-7", owner="user-42").info()
        """
        return self._store.run(owner_entries.thread_info(self._ref))

    def set_info(
        self, *, title: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> bool:
        """Sets an owned thread's title and/or its metadata (a map of at most 16 str keys to str
        values, replaced whole; None keeps what is there, an empty title removes it). A thread
        not listed yet is listed from now on, before its first message: checked against the
        owner's thread quota (QuotaExceeded). Not activity: the thread keeps its place. Returns
        True when this call listed the thread.

        Example::

            chat = store.thread("session-7", owner="user-42")
            chat.set_info(title="Weather in Oslo", metadata={"model": "small"})
        """
        return self._store.run(owners.set_info(self._ref, title, metadata))

    def delete(self) -> None:
        """Deletes the thread: every key it has, a bounded number per call.

        If it is interrupted, the thread already reads as empty, and the next delete, or the
        next write, finishes the deletion. Deleting an unknown thread does nothing.

        Example::

            thread.delete()
            assert thread.stats().stored_messages == 0
        """
        self._store.run(core.delete(self._ref))
