"""kvstore as LlamaIndex's chat store: ``KvstoreChatStore``, a ``BaseChatStore`` whose keys are
thread ids (docs/INTEGRATIONS.md, "LlamaIndex").

Needs the ``llamaindex`` extra (``pip install "kvstore[llamaindex]"``). Every add is one atomic,
idempotent append; ``max_messages`` or ``max_tokens`` bound what ``get_messages`` reads (the
newest page, or ``Thread.context(max_tokens)``), so a LlamaIndex memory built on this store
hands its model a bounded history however long the thread runs.
"""

from __future__ import annotations

import operator
from typing import Any

import redis
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.storage.chat_store.base import BaseChatStore
from pydantic import BaseModel, PrivateAttr, ValidationError

from .. import errors
from .._engine.layout.keys import check_thread_id, meta_pattern, thread_of_meta_key
from .._engine.prepare import prepare_batch
from ..config import StoreConfig
from ..messages import MAX_JSON_DEPTH, Message, _check_json
from ..store import AsyncMessageStore, MessageStore
from . import _dicts
from ._dicts import Stored
from ._llamaindex_convert import chat_dict, to_chat, to_kvstore, tombstone

__all__ = ["KvstoreChatStore"]

_BATCH = 100  # messages per append of set_messages
_SCAN_PAGE = 200  # a delete_message's read, a page at a time


class KvstoreChatStore(BaseChatStore):
    """LlamaIndex's ``BaseChatStore`` on kvstore threads: a key is a thread id.

    `store` serves the sync methods, `async_store` (optional) the ``a*`` ones (without it they
    run the sync ones in a worker thread, as LlamaIndex's default does). ``max_messages``: reads
    return the newest that many (one page, at most 1000); ``max_tokens``: reads return
    ``Thread.context(max_tokens)`` (the summary a compaction stored and the newest messages
    that fit). Neither: the whole history, read a page at a time.

    Example::

        store = MessageStore.from_url("redis://localhost:6379/0")
        chat_store = KvstoreChatStore(store, max_messages=50)
        memory = ChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key="user-42")
    """

    max_messages: int | None = None
    max_tokens: int | None = None
    _store: MessageStore = PrivateAttr()
    _async_store: AsyncMessageStore | None = PrivateAttr(default=None)

    def __init__(
        self,
        store: MessageStore,
        async_store: AsyncMessageStore | None = None,
        *,
        max_messages: int | None = None,
        max_tokens: int | None = None,
    ) -> None:
        if not isinstance(store, MessageStore):
            raise TypeError(f"store must be a MessageStore, not {type(store).__name__}")
        if async_store is not None and not isinstance(async_store, AsyncMessageStore):
            raise TypeError(
                f"async_store must be an AsyncMessageStore, not {type(async_store).__name__}"
            )
        if max_messages is not None and not (_is_int(max_messages) and 1 <= max_messages <= 1000):
            raise errors.ConfigError(f"max_messages must be 1..1000, not {max_messages!r}")
        if max_tokens is not None and not (_is_int(max_tokens) and max_tokens >= 1):
            raise errors.ConfigError(f"max_tokens must be a positive int, not {max_tokens!r}")
        super().__init__(max_messages=max_messages, max_tokens=max_tokens)
        self._store = store
        self._async_store = async_store

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's name of this component."""
        return "KvstoreChatStore"

    # --- sync ---------------------------------------------------------------------------------

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """Replaces the thread's messages: a delete, then appends of at most 100 messages
        (each atomic). A concurrent reader may see the thread empty or holding a prefix. Every
        message is checked first: a bad one raises, and the history is left as it was."""
        thread = self._store.thread(key)
        batches = _batches(self._store.config, messages, key)
        thread.delete()
        for batch in batches:
            thread.append(batch)

    def get_messages(self, key: str) -> list[ChatMessage]:
        """The thread's history: bounded by ``max_messages`` / ``max_tokens`` when set."""
        thread = self._thread(key)
        if self.max_tokens is not None:
            return _chat(_dicts.context(thread, self.max_tokens), thread)
        if self.max_messages is not None:
            newest: list[ChatMessage] = []
            limit = self.max_messages
            pages = 0
            page = _dicts.page(thread, limit=limit, order="desc")
            while True:  # deleted messages in the page: older, larger pages fill their places
                newest = _chat(reversed(page.messages), thread) + newest
                if len(newest) >= limit or not page.has_more:
                    return newest[-limit:]
                pages += 1
                page = _dicts.page(
                    thread, page.next_cursor, _dicts.page_size(limit - len(newest), pages), "desc"
                )
        return _chat(_dicts.iterate(thread), thread)

    def add_message(self, key: str, message: ChatMessage) -> None:
        """Appends one message: one atomic, idempotent script call."""
        text_field = self._store.config.unknown_fields == "keep"
        self._store.thread(key).append(_message(message, key, text_field))

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        """Deletes the thread. Returns None: the deleted history is not read first (it may be
        long; LlamaIndex's memories ignore the value)."""
        self._store.thread(key).delete()
        return None

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Deletes the message at position `idx` (0: the oldest kept), None when there is none.

        Reads up to `idx` + 1 messages oldest first, then replaces the one found, by its id, with
        a tombstone reads leave out: one atomic script. Appends never move a position, so a
        concurrent append cannot make it delete another message. `idx` must be an int
        (TypeError); a negative one deletes nothing, as in LlamaIndex's Redis chat store."""
        if operator.index(idx) < 0:
            return None
        thread = self._store.thread(key)
        found = _nth(thread.iter(), idx, thread)
        if found is None:
            return None
        thread.replace(str(found[0].id), tombstone())
        return found[1]

    def delete_last_message(self, key: str) -> ChatMessage | None:
        """Deletes the newest message (None on an empty thread), read from the newest page and
        replaced by its id: a message appended meanwhile is not the one deleted."""
        thread = self._store.thread(key)
        found = _nth(thread.iter(order="desc"), 0, thread)
        if found is None:
            return None
        thread.replace(str(found[0].id), tombstone())
        return found[1]

    def get_keys(self) -> list[str]:
        """Every thread id of the store's namespace: a SCAN of the whole keyspace (its cost
        grows with every key of the database, not with the answer), which needs ``+scan``
        (the application user's ACL does not grant it: PermissionDenied then)."""
        return _keys(self._store)

    # --- async --------------------------------------------------------------------------------

    async def aset_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """See :meth:`set_messages`."""
        if self._async_store is None:
            return await super().aset_messages(key, messages)
        thread = self._async_store.thread(key)
        batches = _batches(self._async_store.config, messages, key)
        await thread.delete()
        for batch in batches:
            await thread.append(batch)
        return None

    async def aget_messages(self, key: str) -> list[ChatMessage]:
        """See :meth:`get_messages`."""
        if self._async_store is None:
            return await super().aget_messages(key)
        thread = self._thread(key, asynchronous=True)
        if self.max_tokens is not None:
            return _chat(await _dicts.acontext(thread, self.max_tokens), thread)
        if self.max_messages is not None:
            newest: list[ChatMessage] = []
            limit = self.max_messages
            pages = 0
            page = await _dicts.apage(thread, limit=limit, order="desc")
            while True:
                newest = _chat(reversed(page.messages), thread) + newest
                if len(newest) >= limit or not page.has_more:
                    return newest[-limit:]
                pages += 1
                page = await _dicts.apage(
                    thread, page.next_cursor, _dicts.page_size(limit - len(newest), pages), "desc"
                )
        return _chat([message async for message in _dicts.aiterate(thread)], thread)

    async def async_add_message(self, key: str, message: ChatMessage) -> None:
        """See :meth:`add_message`."""
        if self._async_store is None:
            return await super().async_add_message(key, message)
        text_field = self._async_store.config.unknown_fields == "keep"
        await self._async_store.thread(key).append(_message(message, key, text_field))
        return None

    async def adelete_messages(self, key: str) -> list[ChatMessage] | None:
        """See :meth:`delete_messages`."""
        if self._async_store is None:
            return await super().adelete_messages(key)
        await self._async_store.thread(key).delete()
        return None

    async def adelete_message(self, key: str, idx: int) -> ChatMessage | None:
        """See :meth:`delete_message`."""
        if self._async_store is None:
            return await super().adelete_message(key, idx)
        return await self._adelete_at(key, idx, "asc")

    async def adelete_last_message(self, key: str) -> ChatMessage | None:
        """See :meth:`delete_last_message`."""
        if self._async_store is None:
            return await super().adelete_last_message(key)
        return await self._adelete_at(key, 0, "desc")

    async def aget_keys(self) -> list[str]:
        """See :meth:`get_keys` (SCAN runs on the sync store's client)."""
        return await super().aget_keys()

    def _thread(self, key: str, asynchronous: bool = False) -> Any:
        """The thread handle of `key` (a store's handles of a thread share what its reads
        learnt: the newest page reads ahead what it needed last)."""
        store: Any = self._async_store if asynchronous else self._store
        return store.thread(key)

    async def _adelete_at(self, key: str, idx: int, order: Any) -> ChatMessage | None:
        assert self._async_store is not None
        if operator.index(idx) < 0:
            return None
        thread = self._async_store.thread(key)
        seen = 0
        async for message in thread.iter(order=order):
            made = _chat_of(message, thread)
            if made is None:
                continue
            if seen == idx:
                await thread.replace(str(message.id), tombstone())
                return made
            seen += 1
        return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dump(message: Any, position: int = 0) -> dict[str, Any]:
    if not isinstance(message, ChatMessage):
        raise errors.InvalidMessage(
            f"message {position}: a chat store takes LlamaIndex ChatMessages,"
            f" not {type(message).__name__}"
        )
    try:
        # The rule every message's free-form JSON is held to: what would read back changed (a
        # NaN, bytes, a set or tuple, a datetime, a key that is no string) is refused.
        _check_json(_models_dumped(message.additional_kwargs), "additional_kwargs")
    except ValueError as exc:
        raise errors.InvalidMessage(f"message {position}: {exc}") from None
    try:
        dumped: dict[str, Any] = message.model_dump(mode="json")
    except ValueError as exc:  # pydantic's PydanticSerializationError: a value JSON cannot carry
        raise errors.InvalidMessage(f"message {position}: {exc}") from None
    return dumped


def _models_dumped(value: Any, depth: int = 0) -> Any:
    """`value` with each pydantic model in it as its ``model_dump()``, as LlamaIndex serializes
    it (its OpenAI LLM keeps tool-call objects in additional_kwargs). Past MAX_JSON_DEPTH it is
    left as it is, for the JSON check to refuse."""
    if depth > MAX_JSON_DEPTH:
        return value
    if isinstance(value, BaseModel):
        return _models_dumped(value.model_dump(), depth + 1)
    if isinstance(value, list):
        return [_models_dumped(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {name: _models_dumped(item, depth + 1) for name, item in value.items()}
    return value


def _message(message: Any, key: str, text_field: bool, position: int = 0) -> Message:
    """The kvstore message of a ChatMessage; InvalidMessage for anything it cannot store."""
    try:
        return to_kvstore(_dump(message, position), key, text_field)
    except ValidationError as exc:
        raise errors.InvalidMessage(f"{key}, message {position}: {exc}") from None


def _batches(config: StoreConfig, messages: list[Any], key: str) -> list[list[Message]]:
    """set_messages' appends, each message converted and every limit checked (as the append
    will check it) before anything is deleted."""
    text_field = config.unknown_fields == "keep"
    converted = [_message(message, key, text_field, n) for n, message in enumerate(messages)]
    batches = [converted[start : start + _BATCH] for start in range(0, len(converted), _BATCH)]
    for batch in batches:
        prepare_batch(config, batch, None)
    return batches


def _chat_of(message: Stored, thread: Any) -> ChatMessage | None:
    """The ChatMessage of a stored message (a model, or a dict as _dicts reads it); None for a
    deleted one, and for one no ChatMessage can be made of (its kept fields broken by another
    writer), which is logged, as a page read logs a record it cannot read."""
    try:
        found = False
        if type(message) is dict:
            found, record = chat_dict(message)
        if not found:
            record = to_chat(_dicts.as_model(message))
        return None if record is None else ChatMessage.model_validate(record)
    except _dicts.CONVERSION_ERRORS as exc:
        _dicts.skipped(thread, [message], exc)
        return None


def _chat(messages: Any, thread: Any = None) -> list[ChatMessage]:
    """ChatMessages of stored messages, deleted ones (and ones none can be made of) left out."""
    made = (_chat_of(message, thread) for message in messages)
    return [message for message in made if message is not None]


def _nth(messages: Any, idx: int, thread: Any) -> tuple[Message, ChatMessage] | None:
    """The `idx`-th message get_messages shows (and its ChatMessage), or None."""
    seen = 0
    for message in messages:
        made = _chat_of(message, thread)
        if made is None:
            continue
        if seen == idx:
            return message, made
        seen += 1
    return None


def _keys(store: MessageStore) -> list[str]:
    namespace = store.config.namespace
    try:
        found = store.client.scan_iter(match=meta_pattern(namespace), count=1000)
        ids = {thread_of_meta_key(namespace, key) for key in found}
    except redis.exceptions.NoPermissionError:
        raise errors.PermissionDenied(
            "get_keys lists threads with SCAN, which this user may not run: grant +scan, or"
            " keep the thread ids in your application"
        ) from None
    return sorted(t for t in ids if _holds_messages(store, t))


def _holds_messages(store: MessageStore, thread_id: str) -> bool:
    """Whether a meta key's thread holds messages: False for a key no thread is made of (an id
    kvstore refuses, another writer's key of another type; the latter is logged)."""
    try:
        check_thread_id(thread_id)
        return store.thread(thread_id).stats().stored_messages > 0
    except errors.InvalidThreadId:
        return False
    except errors.MigrationPending:
        raise
    except errors.LayoutError as exc:
        _dicts.log.warning("get_keys: passed over thread %r: %s", thread_id, exc)
        return False
