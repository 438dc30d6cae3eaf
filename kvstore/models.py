"""What the store's reads return, besides messages."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from .messages import Message, SummaryMessage

# How a turn ended: "abandoned" is the server's, for a held turn whose lease ended
# (StoreConfig.turn_lease); finish_turn takes the others.
TurnOutcome = Literal["completed", "steered", "cancelled", "failed", "abandoned"]
"""How a turn ended, as ``Thread.finish_turn`` records it."""


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

    Example::

        page = thread.list(limit=50, order="desc")
        while page.has_more:
            page = thread.list(after=page.next_cursor, limit=50, order="desc")
    """

    messages: list[Message]
    has_more: bool
    deleted_before_sequence: int | None = None
    next_cursor: int | None = None
    unreadable: list[int] = []


class ThreadStats(_Result):
    """A thread's counts and sizes, from ``Thread.stats()`` (and ``ThreadSnapshot.stats``).

    stored_messages: messages stored (in the window and in chunks).
    window_messages: messages not yet in a closed chunk: the open chunk's (and, on a thread
        migrating from layout 2, its window's).
    chunks: chunks stored (a message larger than ``chunk_max_bytes`` is a chunk of its own).
    stored_bytes / media_bytes: record bytes stored, and the decoded inline media among them.
    next_sequence: the sequence the next message gets (1 for an empty thread).
    deleted_before_sequence: every sequence below it was deleted by retention (None: none was).
    summary_last_sequence: the last sequence the latest summary covers (None: no compaction).
    layout_version: 3; 2 or 1 for a thread this release has not written yet; None for an unknown
        thread.
    forked_from / fork_sequence: for a thread made by ``Thread.fork``, the thread it was forked
    from and the sequence of its fork point (None otherwise, and while the fork is unfinished).
    tokens: the stored messages' token counts summed (each message's count as it was given or
    counted when it was written; docs/HISTORY.md, "Counting tokens").
    history_checked: strict history checks cover the thread (every message of it was written
    with ``history_checks="strict"``), so its writes are checked (docs/HISTORY.md).
    restore_unfinished: a restore into the thread (``kvstore import``, ``Thread.fork``) has not
    run its last step: it holds a part of the backup, and every write is refused
    (``RestoreIncomplete``) until the same import or fork is run again (docs/RELIABILITY.md).
    owner, title, metadata, created_at, last_activity_at: an owned thread's entry in its owner's
    directory (docs/OWNERS.md), read in the same round trip as the counts (None, and an empty
    metadata, for a thread without an owner or one its owner's directory does not list);
    created_at and last_activity_at are the server's time in ms.

    Example: ``thread.stats().next_sequence - 1`` is the last sequence given out.
    """

    stored_messages: int
    window_messages: int
    chunks: int
    stored_bytes: int
    media_bytes: int
    next_sequence: int
    deleted_before_sequence: int | None = None
    summary_last_sequence: int | None = None
    layout_version: int | None = None
    forked_from: str | None = None
    fork_sequence: int | None = None
    tokens: int = 0
    history_checked: bool = False
    restore_unfinished: bool = False
    owner: str | None = None
    title: str | None = None
    metadata: dict[str, str] = {}
    created_at: int | None = None
    last_activity_at: int | None = None


class TurnResult(_Result):
    """What ``Thread.finish_turn`` records and returns: the turn's `outcome`, how many replies
    it got (`reply_count`) and the first and last sequence of them (None without replies).

    Example: ``thread.finish_turn("turn-1").reply_count``
    """

    turn_id: str
    outcome: TurnOutcome
    reply_count: int
    first_sequence: int | None = None
    last_sequence: int | None = None


class TurnState(_Result):
    """The turn reply sequence: the current turn and where its replies start.

    `outcome` is "open" until ``Thread.finish_turn`` records how the turn ended, or until a held
    turn's lease ends ("abandoned").

    Example: ``thread.snapshot().turn`` is one (None before the first ``start_turn``).
    """

    turn_id: str
    sequence: int
    outcome: Literal["open", "completed", "steered", "cancelled", "failed", "abandoned"]


class ThreadSnapshot(_Result):
    """The newest messages (oldest first), the context summary, the turn and the stats.

    ``unreadable``: the sequences (ascending) of records skipped because they could not be
    decoded, as in :class:`MessagesPage`; the summary's too, when it is the one unreadable.

    Example::

        snap = thread.snapshot()
        recent, summary, turn = snap.messages, snap.summary, snap.turn
    """

    messages: list[Message]
    summary: SummaryMessage | None = None
    turn: TurnState | None = None
    stats: ThreadStats
    unreadable: list[int] = []


class AppendResult(list[Message]):
    """What ``append`` returns: the stored messages, in the order given, as a plain list.

    ``replayed`` is true when every message of the call was already stored (its otids or ids
    were seen before): the call wrote nothing and the list holds the messages as first stored.

    Example::

        stored = thread.append(UserMessage(content="hi", otid="req-1"))
        stored[0].seq_id, stored.replayed  # (1, False); sending it again: replayed is True
    """

    __slots__ = ("replayed",)

    def __init__(self, messages: Iterable[Message] = (), replayed: bool = False) -> None:
        super().__init__(messages)
        self.replayed = replayed

    def __repr__(self) -> str:
        return f"AppendResult({list.__repr__(self)}, replayed={self.replayed})"


class ThreadInfo(_Result):
    """An owned thread as its owner's directory holds it (docs/OWNERS.md): read without
    touching its messages.

    created_at, last_activity_at: the server's time in ms when the thread was made (its first
    write, or its first ``set_info``) and when a write last changed it.
    messages, stored_bytes, tokens: its counts as its last write left them.

    Example::

        for info in store.threads(owner="user-42").threads:
            print(info.thread_id, info.title, info.last_activity_at)
    """

    thread_id: str
    owner: str
    title: str | None = None
    metadata: dict[str, str] = {}
    created_at: int = 0
    last_activity_at: int = 0
    messages: int = 0
    stored_bytes: int = 0
    tokens: int = 0


class ThreadsPage(_Result):
    """One page of an owner's threads (``MessageStore.threads``).

    next_cursor: pass it as ``after=`` for the next page (same order and filter); None when
        the listing is done. A filtered page may hold fewer than ``limit`` threads and still
        have a cursor.
    """

    threads: list[ThreadInfo]
    next_cursor: str | None = None


class OwnerUsage(_Result):
    """An owner's totals over its threads and its quotas (None: no quota), in one call.

    Example::

        usage = store.owner_usage("user-42")
        usage.threads, usage.messages, usage.stored_bytes
    """

    owner: str
    threads: int
    messages: int
    stored_bytes: int
    tokens: int
    max_threads: int | None = None
    max_bytes: int | None = None
    max_messages_per_minute: int | None = None
    erasing: bool = False


class ErasureReceipt(_Result):
    """What ``MessageStore.erase_owner`` erased: threads and messages (over every call of an
    erasure that was stopped and run again)."""

    owner: str
    threads: int
    messages: int
