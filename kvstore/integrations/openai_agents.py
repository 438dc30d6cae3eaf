"""The OpenAI Agents SDK's session (``agents.memory.SessionABC``) on a kvstore thread.

Each Responses input item is one kvstore message: the kvstore type that means the same (a user,
system, assistant, tool-call, tool-return or reasoning message, so ``context()``, compaction and
the CLI read it), with the item itself in the message's ``openai_item`` field, so it comes back
equal and no item type is ever dropped. A string ``content`` is stored once, in the message.

Ids: an item's otid is a hash of the item, its place in the batch and the batch's length, chained
to the message before it (the batch's previous item, or the thread's newest message when the batch
started, retracted or not). ``add_items`` is one atomic append; sent again after it ran (a retried
step), it finds its whole batch as the thread's newest and stores nothing; the same items added
at any other point (after a pop, later in the conversation, or the end or start of a longer batch
just stored) are stored (docs/INTEGRATIONS.md, "OpenAI Agents SDK").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings
from pydantic import ValidationError

from kvstore import errors
from kvstore.config import StoreConfig
from kvstore.importers.openai_agents import (
    ITEM_FIELD,
    POPPED_FIELD,
    dict_item,
    item_message,
    message_item,
)
from kvstore.messages import HiddenReasoningMessage, Message
from kvstore.store import AsyncMessageStore

from ._dicts import Stored, acontext, anewest, apage, as_model, page_size
from ._dicts import field as _field

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
        if not isinstance(store, AsyncMessageStore):
            raise TypeError(
                "the SDK's session is async: KvstoreSession takes an AsyncMessageStore,"
                f" not {type(store).__name__}"
            )
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
        limit = _limit(limit, self.session_settings)
        if limit is None:
            if self._history == "context":
                return await self.context_items(self._max_tokens)
            return [item async for item in self._all_items()]
        if limit <= 0:
            return []
        return [item for _, item in reversed(await self._newest_items(limit))]

    async def context_items(self, max_tokens: int | None = None) -> list[Any]:
        """The model input kvstore keeps: the latest summary, then the items after it, within
        `max_tokens` when given (reads only the chunks after the summary)."""
        context = await acontext(self.thread, max_tokens)
        return _items([m for m in context if not _retracted(m)])

    async def add_items(self, items: list[Any]) -> None:
        """Appends the items in one atomic call; a call sent again after it ran stores nothing.

        An item that is not a JSON object, holds a value JSON cannot carry (or kvstore's bounds
        refuse), or would not read back as it was given raises InvalidMessage; nothing is
        written then."""
        made = _prepared(items)
        if not made:
            return
        tail = await anewest(self.thread, len(made) + 1)
        if _is_replay(made, tail):
            return
        anchor = _mark(tail[0]) if tail else None
        otids = _otids([canonical for _, canonical in made], anchor)
        for (message, _), otid in zip(made, otids, strict=True):
            message.otid = otid
        await self.thread.append([message for message, _ in made])

    async def pop_item(self) -> Any | None:
        """Retracts the newest item and returns it (None when the session has none)."""
        found = await self._newest_items(1)
        if not found:
            return None
        newest, item = found[0]
        tombstone = HiddenReasoningMessage(state="omitted", otid=_field(newest, "otid"))
        setattr(tombstone, POPPED_FIELD, True)
        await self.thread.replace(str(_field(newest, "id")), tombstone)
        return item

    async def clear_session(self) -> None:
        """Deletes the session's thread (every key of it, in bounded steps)."""
        await self.thread.delete()

    async def compact(self, summary: str, keep_last: int = 0) -> None:
        """Stores `summary` of every item but the newest `keep_last`; the context (and with
        ``history="context"`` the history the model gets) then starts at it. Raises
        InvalidSummaryRange (nothing written) when keeping a tool call with its answer would
        leave nothing new before the summary in force (docs/HISTORY.md, rule 2)."""
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise ValueError(f"keep_last must be an int from 0 up, got {keep_last!r}")
        # Counted in items (summaries, retracted messages and messages without an item are
        # none), so the same call again names the same range and is a replay.
        newest = await self._newest_items(keep_last + 1)
        if len(newest) <= keep_last:
            return
        await self.thread.compact(summary, last_sequence=_field(newest[keep_last][0], "seq_id"))

    async def watch(self, after: int | str | None = None) -> AsyncIterator[Any]:
        """The thread's live tail (``thread.watch``): each event as kvstore yields it."""
        async for event in self.thread.watch(after=after):
            yield event

    async def _newest_items(self, count: int) -> list[tuple[Stored, Any]]:
        """The newest `count` items and their messages, newest first, read as stored dicts
        where a record allows: messages that are no item (retracted, summaries, others'
        messages without a Responses form) are passed over, older pages filling their places."""
        found: list[tuple[Stored, Any]] = []
        after: int | None = None
        pages = 0
        while len(found) < count:
            read = await apage(self.thread, after, page_size(count - len(found), pages), "desc")
            pages += 1
            for message in read.messages:
                item = None if _hidden(message) else _item(message)
                if item is not None and len(found) < count:
                    found.append((message, item))
            if not read.has_more or read.next_cursor is None:  # a page of bad records goes on
                break
            after = read.next_cursor
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
            if not read.has_more or read.next_cursor is None:  # a page of bad records goes on
                return
            after = read.next_cursor


def _hidden(message: Stored) -> bool:
    """Not one of the session's items: retracted, or a summary ``compact`` stored."""
    if isinstance(message, dict):
        return message.get("message_type") == "summary_message" or bool(message.get(POPPED_FIELD))
    return message.message_type == "summary_message" or _retracted(message)


def _retracted(message: Stored) -> bool:
    """Whether pop_item retracted the message (its stored dict's or model's mark)."""
    extra = message if isinstance(message, dict) else message.__pydantic_extra__ or {}
    return bool(extra.get(POPPED_FIELD))


def _item(message: Stored) -> Any:
    """The item of a stored message: from its dict where it holds one, else its model's."""
    if type(message) is dict:
        found, item = dict_item(message)
        if found:
            return item
    return message_item(as_model(message))


def _mark(message: Stored) -> str | None:
    """What the next item's otid is chained to: the message's otid, else its id (a message
    another writer stored may have no otid; every stored message has an id)."""
    mark: str | None = _field(message, "otid") or _field(message, "id")
    return mark


def _limit(limit: int | None, settings: Any) -> int | None:
    """The limit a read takes: the one given, else the session settings' (an object or, as the
    SDK also accepts, a dict)."""
    if limit is not None or settings is None:
        return limit
    if isinstance(settings, dict):
        return settings.get("limit")
    found: int | None = getattr(settings, "limit", None)
    return found


def _canonical(item: Any) -> bytes:
    text = json.dumps(
        item, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode()


def _prepared(items: Any) -> list[tuple[Message, bytes]]:
    """Each item's kvstore message (its otid not yet set) and canonical JSON; InvalidMessage,
    naming the item, for one that cannot be stored as it was given."""
    made = []
    for position, item in enumerate(list(items)):
        if not isinstance(item, dict):
            raise errors.InvalidMessage(
                f"item {position}: a Responses input item is a JSON object (a dict),"
                f" not {type(item).__name__}"
            )
        try:
            canonical = _canonical(item)
        except (TypeError, ValueError) as exc:  # a lone surrogate's UnicodeEncodeError too
            raise errors.InvalidMessage(f"item {position} is not plain JSON: {exc}") from None
        made.append((_message_of(item, canonical, position), canonical))
    return made


def _message_of(item: dict[str, Any], canonical: bytes, position: int) -> Message:
    """The message an item means, holding it so that it reads back equal (the item whole
    where the usual form would not give it back), else InvalidMessage."""
    try:
        message = item_message(item)
        if _canonical(message_item(message)) != canonical:
            setattr(message, ITEM_FIELD, dict(item))  # e.g. a message item without a role
    except ValidationError as exc:
        details = "; ".join(str(error["msg"]) for error in exc.errors(include_url=False))
        raise errors.InvalidMessage(f"item {position} cannot be stored: {details}") from None
    if _canonical(message_item(message)) != canonical:
        raise errors.InvalidMessage(
            f"item {position} would not read back as it was given"
            " (a message item needs its content)"
        )
    return message


def _otids(canonicals: list[bytes], anchor: str | None) -> list[str]:
    """Each item's otid: a hash of the item, its place in the batch and the batch's length,
    chained to the otid before it. The place and length make a stored batch whole: only the
    same items in a batch of the same length match it, not its first or last items alone."""
    otids = []
    count = len(canonicals)
    for position, canonical in enumerate(canonicals):
        place = f"{position}/{count}".encode()
        digest = hashlib.sha256((anchor or "").encode() + b"\n" + place + b"\n" + canonical)
        otid = "oa-h-" + digest.hexdigest()[:40]
        otids.append(otid)
        anchor = otid
    return otids


def _is_replay(made: list[tuple[Message, bytes]], tail: list[Stored]) -> bool:
    """Whether the thread's newest messages (`tail`, newest first) are these items, stored by
    an earlier call as one whole batch (each otid holds its place in its batch and the batch's
    length, so the end or start of a longer batch is no match) and none of them retracted
    since."""
    count = len(made)
    if len(tail) < count or any(_field(m, POPPED_FIELD) for m in tail[:count]):
        return False
    before = _mark(tail[count]) if len(tail) > count else None
    stored = [_field(m, "otid") for m in reversed(tail[:count])]
    return stored == _otids([canonical for _, canonical in made], before)


def _items(messages: list[Any]) -> list[Any]:
    items = (_item(m) for m in messages)
    return [item for item in items if item is not None]
