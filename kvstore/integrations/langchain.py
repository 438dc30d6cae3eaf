"""LangChain's chat message history on kvstore: :class:`KvstoreChatMessageHistory`.

Needs ``pip install "kvstore[langchain]"``. Messages go through the importer's conversions
(kvstore/importers/langchain.py), so what LangChain stores round-trips equal.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage
from langchain_core.runnables.config import run_in_executor

from .. import errors
from .._engine.layout.keys import check_thread_id
from ..messages import Message
from ..store import AsyncMessageStore, MessageStore
from . import _dicts
from ._dicts import Stored
from ._langchain_convert import (
    converted,
    is_replay,
    newest_start,
    stored,
    to_lc,
    whole_pairs,
)


class KvstoreChatMessageHistory(BaseChatMessageHistory):
    """A LangChain ``BaseChatMessageHistory`` on one kvstore thread.

    `store` is a :class:`MessageStore` (every method; the ``a``-prefixed ones run the sync ones
    in an executor, as the base class does) or an :class:`AsyncMessageStore` (the ``a``-prefixed
    methods; the sync ones raise TypeError). ``messages`` is bounded: the newest
    `max_messages` LangChain messages, or with `max_tokens` the thread's
    ``context(max_tokens)`` (the compaction's summary first, as a system message).
    ``add_messages`` is one atomic, idempotent append (see docs/INTEGRATIONS.md).

    Example::

        history = KvstoreChatMessageHistory(store, "user-42:chat-7", max_messages=100)
        history.add_messages([HumanMessage("hi")])
    """

    def __init__(
        self,
        store: MessageStore | AsyncMessageStore,
        thread_id: str,
        max_messages: int = 50,
        max_tokens: int | None = None,
    ) -> None:
        if not _is_int(max_messages) or not 1 <= max_messages <= 1000:
            raise errors.InvalidCursor(f"max_messages must be 1..1000, got {max_messages!r}")
        if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
            raise errors.InvalidCursor(f"max_tokens must be a positive int, got {max_tokens!r}")
        check_thread_id(thread_id)  # InvalidThreadId now, not at the first call
        self.store = store
        self.thread_id = thread_id
        self.max_messages = max_messages
        self.max_tokens = max_tokens

    def _sync(self) -> MessageStore:
        if not isinstance(self.store, MessageStore):
            raise TypeError("this history's store is async: use the a-prefixed methods")
        return self.store

    def _async(self) -> AsyncMessageStore:
        if not isinstance(self.store, AsyncMessageStore):
            raise TypeError("this history's store is neither a MessageStore nor an async one")
        return self.store

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The newest `max_messages` messages, oldest first, a compaction's summaries left out
        (or ``context(max_tokens)``, which starts at the summary)."""
        thread = self._handle(self._sync())
        if self.max_tokens is not None:
            return to_lc(_dicts.context(thread, self.max_tokens), thread)
        return to_lc(_newest_dicts(thread, self.max_messages), thread)[-self.max_messages :]

    async def aget_messages(self) -> list[BaseMessage]:
        """:attr:`messages` read through the async store (with a sync store, :attr:`messages`
        in an executor, as the base class runs it)."""
        if isinstance(self.store, MessageStore):
            return await run_in_executor(None, lambda: self.messages)
        thread = self._handle(self._async())
        if self.max_tokens is not None:
            return to_lc(await _dicts.acontext(thread, self.max_tokens), thread)
        return to_lc(await _anewest_dicts(thread, self.max_messages), thread)[-self.max_messages :]

    def add_messages(self, messages: Iterable[BaseMessage]) -> None:
        """Stores the messages in one atomic, idempotent append: sent again right after it
        ran, it stores nothing. A message that is not a LangChain message or holds a value
        JSON cannot carry raises InvalidMessage, and nothing is written."""
        thread = self._handle(self._sync())
        batch = converted(messages, self.thread_id)
        if not batch.groups:
            return
        anchor = None
        if batch.chained:
            tail = _dicts.newest(thread, batch.size + 1)
            if is_replay(batch, self.thread_id, tail):
                return
            anchor = _dicts.field(tail[0], "id") if tail else None
        thread.append(stored(batch, self.thread_id, anchor))

    async def aadd_messages(self, messages: Iterable[BaseMessage]) -> None:
        """:meth:`add_messages` through the async store (or in an executor, see
        :meth:`aget_messages`)."""
        if isinstance(self.store, MessageStore):
            return await run_in_executor(None, self.add_messages, list(messages))
        thread = self._handle(self._async())
        batch = converted(messages, self.thread_id)
        if not batch.groups:
            return
        anchor = None
        if batch.chained:
            tail = await _dicts.anewest(thread, batch.size + 1)
            if is_replay(batch, self.thread_id, tail):
                return
            anchor = _dicts.field(tail[0], "id") if tail else None
        await thread.append(stored(batch, self.thread_id, anchor))

    def clear(self) -> None:
        """Deletes the thread (every message, summary and turn)."""
        self._sync().thread(self.thread_id).delete()

    async def aclear(self) -> None:
        """:meth:`clear` through the async store (or in an executor, see :meth:`aget_messages`)."""
        if isinstance(self.store, MessageStore):
            return await run_in_executor(None, self.clear)
        await self._async().thread(self.thread_id).delete()

    def compact(self, summary: str, keep_last: int = 0) -> bool:
        """Stores `summary` of every message but the newest `keep_last` (``thread.compact``);
        with `max_tokens` the history handed to the model then starts at it. False (nothing
        written) when the thread holds no more than `keep_last` messages. Raises
        InvalidSummaryRange (nothing written) when keeping a tool call with its answer would
        leave nothing new before the summary in force (docs/HISTORY.md, rule 2)."""
        _check_keep_last(keep_last)
        thread = self._sync().thread(self.thread_id)
        read = lambda after, size: thread.list(after, None, size, "desc")  # noqa: E731
        found, start = _selected(read, keep_last, before=True)
        last = _last_summarized(found, start)
        if last is None:
            return False
        _dicts.compact(thread, summary, _asked(found, keep_last, last), last)
        return True

    async def acompact(self, summary: str, keep_last: int = 0) -> bool:
        """:meth:`compact` through the async store (or in an executor, see :meth:`aget_messages`)."""
        if isinstance(self.store, MessageStore):
            return await run_in_executor(None, self.compact, summary, keep_last)
        _check_keep_last(keep_last)
        thread = self._async().thread(self.thread_id)
        read = lambda after, size: thread.list(after, None, size, "desc")  # noqa: E731
        found, start = await _aselected(read, keep_last, before=True)
        last = _last_summarized(found, start)
        if last is None:
            return False
        await _dicts.acompact(thread, summary, _asked(found, keep_last, last), last)
        return True

    def _handle(self, store: MessageStore | AsyncMessageStore) -> Any:
        """The thread's handle (a store's handles of a thread share what its reads learnt: the
        newest page reads ahead the closed chunk it needed last)."""
        return store.thread(self.thread_id)


def _newest(thread: Any, count: int) -> list[Message]:
    """The thread's messages that make its newest `count` LangChain messages (a compaction's
    summaries left out), oldest first; read a page of `count` + 1 at a time, newest first."""
    found, start = _selected(lambda after, size: thread.list(after, None, size, "desc"), count)
    return found[start:]  # type: ignore[return-value]  # models, from thread.list


def _newest_dicts(thread: Any, count: int) -> list[Stored]:
    """:func:`_newest` read as stored dicts where a record allows (kvstore/integrations/_dicts.py)."""
    found, start = _selected(lambda after, size: _dicts.page(thread, after, size, "desc"), count)
    return found[start:]


async def _anewest_dicts(thread: Any, count: int) -> list[Stored]:
    """:func:`_newest_dicts` on an AsyncThread."""
    found, start = await _aselected(lambda a, size: _dicts.apage(thread, a, size, "desc"), count)
    return found[start:]


def _selected(read: Any, count: int, before: bool = False) -> tuple[list[Stored], int]:
    """The newest messages read (oldest first, summaries out) and where the newest `count`
    LangChain messages start among them (`before`: with a message before that start, when the
    thread holds one); `read(after, size)` is a page, newest first."""
    found: list[Stored] = []
    page, older = read(None, _dicts.page_size(count + 1, 0)), 0
    while (start := _settle(found, page, count, before)) is None:
        # The first older page as large (a message begun before the page), then larger ones
        # past what is passed over (summaries, deleted messages).
        page, older = read(page.next_cursor, _dicts.page_size(count + 1, older)), older + 1
    return found[::-1], start


async def _aselected(read: Any, count: int, before: bool = False) -> tuple[list[Stored], int]:
    """:func:`_selected` of an async `read`."""
    found: list[Stored] = []
    page, older = await read(None, _dicts.page_size(count + 1, 0)), 0
    while (start := _settle(found, page, count, before)) is None:
        page, older = await read(page.next_cursor, _dicts.page_size(count + 1, older)), older + 1
    return found[::-1], start


def _settle(found: list[Stored], page: Any, count: int, before: bool = False) -> int | None:
    """Adds a page (newest first) to `found`; the start of the newest `count` LangChain
    messages in ``found[::-1]`` (`before`, for a compaction: with a message before it, and
    every tool answer after it with its call's message), or None when an older page is needed."""
    found.extend(m for m in page.messages if not _summary(m))
    complete = not page.has_more or page.next_cursor is None  # bad records go on too
    start = newest_start(found[::-1], count, complete, before)
    if before and start is not None:
        start = whole_pairs(found[::-1], start, complete)
        if start == 0 and not complete:
            return None
    return start


def _summary(message: Stored) -> bool:
    if type(message) is dict:
        return message.get("message_type") == "summary_message"
    return message.message_type == "summary_message"  # type: ignore[union-attr]  # a model


def _last_summarized(found: list[Stored], start: int) -> int | None:
    """The sequence a compaction keeping ``found[start:]`` ends at: the message just before
    them (counted in LangChain messages without summaries, so the same call again names the
    same range and is a replay); None when there is none."""
    return _dicts.field(found[start - 1], "seq_id") if start > 0 else None


def _asked(found: list[Stored], keep_last: int, last: int) -> int:
    """The sequence the compaction keeping the newest `keep_last` ends at before whole_pairs
    moved it back (`last`): what the caller asked for, so that a move into the current
    summary's range is refused and the same call again is a replay (docs/HISTORY.md, rule 2)."""
    asked = _last_summarized(found, newest_start(found, keep_last, True, True) or 0)
    return last if asked is None else asked


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_keep_last(keep_last: int) -> None:
    if not _is_int(keep_last) or keep_last < 0:
        raise ValueError(f"keep_last must be an int from 0 up, got {keep_last!r}")
