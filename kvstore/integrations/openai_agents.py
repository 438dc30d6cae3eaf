"""The OpenAI Agents SDK's session (``agents.memory.SessionABC``) on a kvstore thread.

Each Responses input item is one kvstore message: the kvstore type that means the same (a user,
system, assistant, tool-call, tool-return or reasoning message, so ``context()``, compaction and
the CLI read it), with the item itself in the message's ``openai_item`` field, so it comes back
equal and no item type is ever dropped. A string ``content`` is stored once, in the message.

Ids: an item's otid is made from its own ``id`` when it has one, else from a hash of the item and
the otid before it (the batch's previous item, or the thread's newest message when the batch
started). ``add_items`` is one atomic append; sent again after it ran (a retried step), it finds
its items as the thread's newest and stores nothing (docs/INTEGRATIONS.md, "OpenAI Agents SDK").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings

from kvstore.config import StoreConfig
from kvstore.importers.openai_agents import POPPED_FIELD, dict_item, item_message, message_item
from kvstore.messages import HiddenReasoningMessage, Message
from kvstore.store import AsyncMessageStore

from ._dicts import Stored, apage, as_model

_PAGE = 1000  # the largest page kvstore lists in one call


class KvstoreSession(SessionABC):
    """An Agents SDK session whose items live in one kvstore thread.

    Example::

        store = AsyncMessageStore.from_url("redis://localhost:6379/0")
        session = KvstoreSession("user-42", store)
        await Runner.run(agent, "hi", session=session)

    ``history="context"`` makes ``get_items()`` (no limit) return ``thread.context(max_tokens)``:
    the latest summary and what follows it, within the token budget, instead of every item.
    """

    def __init__(
        self,
        session_id: str,
        store: AsyncMessageStore,
        *,
        session_settings: SessionSettings | None = None,
        history: str = "all",
        max_tokens: int | None = None,
        owns_store: bool = False,
    ) -> None:
        if history not in ("all", "context"):
            raise ValueError(f"history must be 'all' or 'context', not {history!r}")
        self.session_id = session_id
        self.session_settings = session_settings
        self.store = store
        self.thread = store.thread(session_id)
        self._history = history
        self._max_tokens = max_tokens
        self._owns_store = owns_store

    @classmethod
    def from_url(
        cls,
        session_id: str,
        url: str,
        config: StoreConfig | None = None,
        **kwargs: Any,
    ) -> KvstoreSession:
        """A session over a new store on `url`; ``close()`` closes that store.

        Example: ``session = KvstoreSession.from_url("chat-7", "redis://localhost:6379/0")``
        """
        store = AsyncMessageStore.from_url(url, config)
        return cls(session_id, store, owns_store=True, **kwargs)

    async def close(self) -> None:
        """Closes the store if this session made it (``from_url``)."""
        if self._owns_store:
            await self.store.close()

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The newest `limit` items, oldest first (one bounded page read); with no limit, the
        session settings' limit, else the whole history (or the context, see the class)."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is None:
            if self._history == "context":
                return await self.context_items(self._max_tokens)
            return [item async for item in self._all_items()]
        if limit <= 0:
            return []
        return await self._newest(limit)

    async def context_items(self, max_tokens: int | None = None) -> list[Any]:
        """The model input kvstore keeps: the latest summary, then the items after it, within
        `max_tokens` when given (reads only the chunks after the summary)."""
        context = await self.thread.context(max_tokens=max_tokens)
        return _items([m for m in context if not _retracted(m)])

    async def add_items(self, items: list[Any]) -> None:
        """Appends the items in one atomic call; a call sent again after it ran stores nothing."""
        if not items:
            return
        tail = await self._tail(len(items) + 1)
        if _is_replay(items, tail):
            return
        anchor = tail[-1].otid if tail else None
        await self.thread.append(_messages(items, anchor))

    async def pop_item(self) -> Any | None:
        """Retracts the newest item and returns it (None when the session is empty)."""
        tail = await self._tail(1)
        if not tail:
            return None
        newest = tail[-1]
        assert newest.id is not None  # every stored message has one
        tombstone = HiddenReasoningMessage(state="omitted", otid=newest.otid)
        setattr(tombstone, POPPED_FIELD, True)
        await self.thread.replace(newest.id, tombstone)
        return message_item(newest)

    async def clear_session(self) -> None:
        """Deletes the session's thread (every key of it, in bounded steps)."""
        await self.thread.delete()

    async def compact(self, summary: str, keep_last: int = 0) -> None:
        """Stores `summary` of every item but the newest `keep_last`; the context (and with
        ``history="context"`` the history the model gets) then starts at it."""
        # Counted in items (summaries and retracted items are none), so the same call again
        # names the same range and is a replay.
        newest = await self._tail(keep_last + 1)
        if len(newest) <= keep_last:
            return
        last = newest[-keep_last - 1].seq_id
        assert last is not None
        await self.thread.compact(summary, last_sequence=last)

    async def watch(self, after: int | str | None = None) -> AsyncIterator[Any]:
        """The thread's live tail (``thread.watch``): each event as kvstore yields it."""
        async for event in self.thread.watch(after=after):
            yield event

    async def _newest(self, limit: int) -> list[Any]:
        """The newest `limit` items, oldest first, from the stored dicts (no model built where
        a record's shape allows): the same items as ``_items(await self._tail(limit))``."""
        found: list[Stored] = []
        after: int | None = None
        while len(found) < limit:
            read = await apage(self.thread, after, min(_PAGE, limit - len(found)), "desc")
            found.extend(m for m in read.messages if not _hidden(m))
            if not read.has_more or not read.messages:
                break
            after = read.next_cursor
        found = found[:limit]
        found.reverse()
        return _items(found)

    async def _tail(self, count: int) -> list[Message]:
        """The newest `count` live messages, oldest first: pages back past retracted ones."""
        found: list[Message] = []
        after: int | None = None  # in descending order, "after" is older
        while len(found) < count:
            page = await self.thread.list(
                after=after, limit=min(_PAGE, count - len(found)), order="desc"
            )
            found.extend(m for m in page.messages if not _hidden(m))
            if not page.has_more or not page.messages:
                break
            after = page.messages[-1].seq_id
        found = found[:count]
        found.reverse()
        return found

    async def _all_items(self) -> AsyncIterator[Any]:
        # Pages of the most kvstore lists at once, as stored dicts where a record allows.
        after: int | None = None
        while True:
            read = await apage(self.thread, after, _PAGE)
            for message in read.messages:
                if not _hidden(message):
                    item = _item(message)
                    if item is not None:
                        yield item
            if not read.has_more or not read.messages:
                return
            after = read.next_cursor


def _hidden(message: Stored) -> bool:
    """Not one of the session's items: retracted, or a summary ``compact`` stored."""
    if isinstance(message, dict):
        return message.get("message_type") == "summary_message" or bool(message.get(POPPED_FIELD))
    return message.message_type == "summary_message" or _retracted(message)


def _retracted(message: Message) -> bool:
    extra = message.__pydantic_extra__ or {}
    return bool(extra.get(POPPED_FIELD))


def _item(message: Stored) -> Any:
    """The item of a stored message: from its dict where it holds one, else its model's."""
    if type(message) is dict:
        found, item = dict_item(message)
        if found:
            return item
    return message_item(as_model(message))


def _canonical(item: Any) -> bytes:
    return json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _otids(items: list[Any], anchor: str | None) -> list[str]:
    otids = []
    for item in items:
        own = item.get("id") if isinstance(item, dict) else None
        if isinstance(own, str) and own and len(own) <= 100:
            otid = "oa-id-" + hashlib.sha256(own.encode()).hexdigest()[:32]
        else:
            digest = hashlib.sha256((anchor or "").encode() + b"\n" + _canonical(item))
            otid = "oa-h-" + digest.hexdigest()[:40]
        otids.append(otid)
        anchor = otid
    return otids


def _is_replay(items: list[Any], tail: list[Message]) -> bool:
    """Whether the thread's newest messages are these items, stored by an earlier call."""
    if len(tail) < len(items):
        return False
    before = tail[-len(items) - 1].otid if len(tail) > len(items) else None
    stored = [m.otid for m in tail[-len(items) :]]
    return stored == _otids(items, before)


def _messages(items: list[Any], anchor: str | None) -> list[Message]:
    return [
        item_message(item, otid) for item, otid in zip(items, _otids(items, anchor), strict=True)
    ]


def _items(messages: list[Any]) -> list[Any]:
    items = (_item(m) for m in messages)
    return [item for item in items if item is not None]
