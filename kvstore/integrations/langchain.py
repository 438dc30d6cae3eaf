"""LangChain's chat message history on kvstore: :class:`KvstoreChatMessageHistory`.

Needs ``pip install "kvstore[langchain]"``. Messages go through the importer's conversions
(kvstore/importers/langchain.py), so what LangChain stores round-trips equal.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict

from .. import errors
from ..importers.langchain import _LC_LEFT_OUT, to_langchain
from ..importers.source import _map
from ..messages import Message
from ..store import AsyncMessageStore, MessageStore
from . import _dicts
from ._dicts import Stored

# Ids of the messages the adapter stores: uuid5 in this namespace of (thread, key).
_ADAPTER_IDS = uuid.UUID("9b3e54a0-2f1d-4c7e-8a65-0d4f7c2e91b3")


class KvstoreChatMessageHistory(BaseChatMessageHistory):
    """A LangChain ``BaseChatMessageHistory`` on one kvstore thread.

    `store` is a :class:`MessageStore` (sync methods) or an :class:`AsyncMessageStore`
    (``a``-prefixed methods). ``messages`` is bounded: the newest `max_messages`, or with
    `max_tokens` the thread's ``context(max_tokens)`` (the compaction's summary first, as a
    system message). ``add_messages`` is one atomic, idempotent append (see docs/INTEGRATIONS.md).

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
        if not 1 <= max_messages <= 1000:
            raise errors.InvalidCursor(f"max_messages must be 1..1000, got {max_messages!r}")
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
            raise TypeError("this history's store is sync: use the methods without the a prefix")
        return self.store

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The newest `max_messages` messages, oldest first, a compaction's summaries left out
        (or ``context(max_tokens)``, which starts at the summary)."""
        thread = self._handle(self._sync())
        if self.max_tokens is not None:
            return _to_lc(list(thread.context(self.max_tokens)))
        return _to_lc(_newest_dicts(thread, self.max_messages))

    async def aget_messages(self) -> list[BaseMessage]:
        """:attr:`messages` read through the async store."""
        thread = self._handle(self._async())
        if self.max_tokens is not None:
            return _to_lc(list(await thread.context(self.max_tokens)))
        return _to_lc(await _anewest_dicts(thread, self.max_messages))

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Stores the messages in one atomic, idempotent append."""
        if messages:
            self._sync().thread(self.thread_id).append(self._converted(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """:meth:`add_messages` through the async store."""
        if messages:
            await self._async().thread(self.thread_id).append(self._converted(messages))

    def clear(self) -> None:
        """Deletes the thread (every message, summary and turn)."""
        self._sync().thread(self.thread_id).delete()

    async def aclear(self) -> None:
        """:meth:`clear` through the async store."""
        await self._async().thread(self.thread_id).delete()

    def compact(self, summary: str, keep_last: int = 0) -> bool:
        """Stores `summary` of every message but the newest `keep_last` (``thread.compact``);
        with `max_tokens` the history handed to the model then starts at it. False (nothing
        written) when the thread holds no more than `keep_last` messages."""
        thread = self._sync().thread(self.thread_id)
        last = _oldest_summarized(_newest(thread, keep_last + 1), keep_last)
        if last is None:
            return False
        thread.compact(summary, last_sequence=last)
        return True

    async def acompact(self, summary: str, keep_last: int = 0) -> bool:
        """:meth:`compact` through the async store."""
        thread = self._async().thread(self.thread_id)
        last = _oldest_summarized(await _anewest(thread, keep_last + 1), keep_last)
        if last is None:
            return False
        await thread.compact(summary, last_sequence=last)
        return True

    def _handle(self, store: MessageStore | AsyncMessageStore) -> Any:
        """The thread's handle, kept while the store is the same (its newest page reads ahead
        the closed chunk it needed last)."""
        handle = getattr(self, "_thread", None)
        if handle is None or handle._store is not store:
            handle = self._thread = store.thread(self.thread_id)
        return handle

    def _converted(self, messages: Sequence[BaseMessage]) -> list[Message]:
        records = [message_to_dict(message) for message in messages]
        batch = hashlib.sha256(json.dumps(records, sort_keys=True, default=str).encode()).digest()
        out: list[Message] = []
        for index, (message, record) in enumerate(zip(messages, records, strict=True)):
            # The message's own id when set; else one derived from the batch and its place in
            # it, so the same batch sent again is a replay.
            key = message.id or f"batch:{batch.hex()}:{index}"
            name = uuid.uuid5(_ADAPTER_IDS, f"{self.thread_id}\x00{key}")
            position = name.int >> 80  # unique per message: groups never merge on the way out
            parts = _map("langchain", self.thread_id, position, record, batch)
            out.extend(
                part.model_copy(update={"id": f"message-{name}" + (f"-{n}" if n else "")})
                for n, part in enumerate(parts)
            )
        return out


def _newest(thread: Any, count: int) -> list[Message]:
    """The newest `count` messages but summaries, oldest first: one page unless the page holds
    summaries (a compaction's summary is stored after what it summarizes)."""
    found: list[Message] = []
    page = thread.list(limit=count, order="desc")
    while True:
        found.extend(m for m in page.messages if m.message_type != "summary_message")
        if len(found) >= count or not page.has_more:
            return found[:count][::-1]
        page = thread.list(after=page.next_cursor, limit=count - len(found), order="desc")


async def _anewest(thread: Any, count: int) -> list[Message]:
    """:func:`_newest` on an AsyncThread."""
    found: list[Message] = []
    page = await thread.list(limit=count, order="desc")
    while True:
        found.extend(m for m in page.messages if m.message_type != "summary_message")
        if len(found) >= count or not page.has_more:
            return found[:count][::-1]
        page = await thread.list(after=page.next_cursor, limit=count - len(found), order="desc")


def _newest_dicts(thread: Any, count: int) -> list[Stored]:
    """:func:`_newest` read as stored dicts where a record allows (kvstore/integrations/_dicts.py)."""
    found: list[Stored] = []
    page = _dicts.page(thread, limit=count, order="desc")
    while True:
        found.extend(m for m in page.messages if not _summary(m))
        if len(found) >= count or not page.has_more:
            return found[:count][::-1]
        page = _dicts.page(thread, page.next_cursor, count - len(found), "desc")


async def _anewest_dicts(thread: Any, count: int) -> list[Stored]:
    """:func:`_newest_dicts` on an AsyncThread."""
    found: list[Stored] = []
    page = await _dicts.apage(thread, limit=count, order="desc")
    while True:
        found.extend(m for m in page.messages if not _summary(m))
        if len(found) >= count or not page.has_more:
            return found[:count][::-1]
        page = await _dicts.apage(thread, page.next_cursor, count - len(found), "desc")


def _summary(message: Stored) -> bool:
    if type(message) is dict:
        return message.get("message_type") == "summary_message"
    return message.message_type == "summary_message"  # type: ignore[union-attr]  # a model


def _oldest_summarized(newest: list[Message], keep_last: int) -> int | None:
    """The sequence a compaction keeping the last `keep_last` of `newest` ends at (counted without
    summaries, so the same call again names the same range and is a replay); None when there
    is nothing before them."""
    return newest[0].seq_id if len(newest) > keep_last else None


def _to_lc(messages: list[Any]) -> list[BaseMessage]:
    return messages_from_dict(_langchain_dicts(messages))


# LangChain's type of each kvstore type whose one message _plain_record writes from its dict.
_PLAIN_TYPES = {"user_message": "human", "system_message": "system", "assistant_message": "ai"}
_LEFT_OUT = frozenset(cls.model_fields["message_type"].default for cls in _LC_LEFT_OUT)


def _langchain_dicts(messages: list[Any]) -> list[dict[str, Any]]:
    """``to_langchain`` of stored messages (models, or dicts as _dicts reads them): a plain
    message alone in its LangChain message (:func:`_plain_record`) from its dict, every other
    run of messages through to_langchain, which groups them as it always does."""
    # What to_langchain leaves out it skips before grouping: leaving it out first changes no group.
    messages = [m for m in messages if _kind(m) not in _LEFT_OUT]
    out: list[dict[str, Any]] = []
    run: list[Message] = []
    origins = [_origin_of(m) for m in messages]
    for index, message in enumerate(messages):
        record = None
        if type(message) is dict:
            alone = all(
                origins[index] is None or origins[index] != origins[near]
                for near in (index - 1, index + 1)
                if 0 <= near < len(messages)
            )
            following = messages[index + 1] if index + 1 < len(messages) else None
            record = _plain_record(message, following) if alone else None
        if record is None:
            run.append(_dicts.as_model(message))
            continue
        if run:
            out.extend(to_langchain(run))
            run = []
        out.append(record)
    out.extend(to_langchain(run))
    return out


def _origin_of(message: Stored) -> tuple[str, str] | None:
    """The LangChain record a message came from (importers.langchain._origin), dict or model."""
    metadata = message.get("metadata") if type(message) is dict else message.metadata  # type: ignore[union-attr]
    if metadata and metadata.get("source") == "langchain" and "source_position" in metadata:
        return metadata["source"], metadata["source_position"]
    return None


def _plain_record(message: dict[str, Any], following: Stored | None) -> dict[str, Any] | None:
    """The LangChain record of a user, system or assistant message with a string content and no
    source fields kept, as to_langchain writes it alone; None for any other (or for an
    assistant message a tool call follows: to_langchain may join them)."""
    kind = _PLAIN_TYPES.get(message.get("message_type"))  # type: ignore[arg-type]  # any value
    content = message.get("content")
    metadata = message.get("metadata")
    if kind is None or type(content) is not str or (metadata and "source_fields" in metadata):
        return None
    if kind == "ai" and following is not None and _kind(following) == "tool_call_message":
        return None
    data: dict[str, Any] = {"content": content, "type": kind}
    if message.get("name"):
        data["name"] = message["name"]
    if kind == "ai":
        data["tool_calls"] = []
    return {"type": kind, "data": data}


def _kind(message: Stored) -> Any:
    return message.get("message_type") if type(message) is dict else message.message_type  # type: ignore[union-attr]
