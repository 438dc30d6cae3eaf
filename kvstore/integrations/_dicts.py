"""The adapters' reads of stored message dicts (the engine's ``list_dicts``), sync and async.

A framework that is handed dicts (or builds its own objects from dicts) need not have kvstore's
message models built first: these reads return each message as its stored dict where
kvstore/_engine/record_dicts.py vouches that validation would keep it as it is, else as the
validated model; unreadable records are skipped, logged and named as every page read does. An
adapter converts a dict it knows the shape of directly and any other message through its typed
conversion (:func:`as_model` first).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, Literal

from .._engine import core
from ..messages import MESSAGE_ADAPTER, Message

log = logging.getLogger("kvstore")

_PAGE = 1000  # the largest page kvstore lists in one call

CONVERSION_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError)
"""What converting a stored message another writer broke may raise (pydantic's ValidationError
and json's JSONDecodeError are ValueErrors): the adapters skip and log such a message."""

Stored = dict[str, Any] | Message
"""A message as these reads return it: its stored dict, or its model."""


def as_model(message: Stored) -> Message:
    """The model of a message these reads returned (a dict was vouched for: it validates)."""
    if type(message) is dict:
        return MESSAGE_ADAPTER.validate_python(message)
    return message  # type: ignore[return-value]  # not a dict: a model


def page(
    thread: Any, after: int | None = None, limit: int = 50, order: Literal["asc", "desc"] = "asc"
) -> core.DictsPage:
    """``thread.list(after=..., limit=..., order=...)`` of a sync Thread, as dicts."""
    result: core.DictsPage = thread._store.run(
        core.list_dicts(thread._ref, after, None, limit, order)
    )
    return result


async def apage(
    thread: Any, after: int | None = None, limit: int = 50, order: Literal["asc", "desc"] = "asc"
) -> core.DictsPage:
    """:func:`page` of an AsyncThread."""
    result: core.DictsPage = await thread._store.run(
        core.list_dicts(thread._ref, after, None, limit, order)
    )
    return result


def compact(thread: Any, summary: str, last_sequence: int, moved: int) -> None:
    """``thread.compact(summary, last_sequence)`` of a sync Thread whose caller moved
    `last_sequence` back to `moved` to keep its own messages whole (the engine's `moved`)."""
    thread._store.run(core.compact(thread._ref, summary, last_sequence, None, None, moved))


async def acompact(thread: Any, summary: str, last_sequence: int, moved: int) -> None:
    """:func:`compact` of an AsyncThread."""
    await thread._store.run(core.compact(thread._ref, summary, last_sequence, None, None, moved))


def context(thread: Any, max_tokens: int | None = None) -> list[Stored]:
    """``thread.context(max_tokens)`` of a sync Thread, the messages after the summary as dicts
    where a plan from the stored counts reads them (the summary and system messages: models)."""
    found: list[Stored] = thread._store.run(core.context_dicts(thread._ref, max_tokens))
    return found


async def acontext(thread: Any, max_tokens: int | None = None) -> list[Stored]:
    """:func:`context` of an AsyncThread."""
    found: list[Stored] = await thread._store.run(core.context_dicts(thread._ref, max_tokens))
    return found


def iterate(thread: Any, order: Literal["asc", "desc"] = "asc") -> Iterator[Stored]:
    """``thread.iter(order)`` of a sync Thread (the same pages), as dicts."""
    for read in thread._store.stream(core.pages(thread._ref, order, read=core.list_dicts)):
        yield from read.messages


async def aiterate(thread: Any, order: Literal["asc", "desc"] = "asc") -> AsyncIterator[Stored]:
    """:func:`iterate` of an AsyncThread."""
    async for read in thread._store.stream(core.pages(thread._ref, order, read=core.list_dicts)):
        for message in read.messages:
            yield message


def page_size(missing: int, before: int) -> int:
    """The size of a newest-first read's next page, which passes messages over (retracted,
    deleted, summaries): what it still misses, four times that for each of the `before` older
    pages it read already, up to the largest page. Passing k messages over takes about log4(k)
    pages, and one summary in the way costs a page of what is missing, not a thousand."""
    return min(_PAGE, max(1, missing) << (2 * min(before, 5)))


def newest(thread: Any, count: int) -> list[Stored]:
    """The newest `count` stored records of a sync Thread, newest first, a page of at most
    1,000 at a time: each message (any kind), and in an unreadable record's place a stand-in
    (:func:`unreadable`), so that what lies between two messages is never taken for nothing."""
    found: list[Stored] = []
    after: int | None = None
    while len(found) < count:
        read = page(thread, after, min(_PAGE, count - len(found)), "desc")
        found.extend(_in_place(read))
        if not read.has_more or read.next_cursor is None:  # a page of bad records goes on
            break
        after = read.next_cursor
    return found[:count]


async def anewest(thread: Any, count: int) -> list[Stored]:
    """:func:`newest` of an AsyncThread."""
    found: list[Stored] = []
    after: int | None = None
    while len(found) < count:
        read = await apage(thread, after, min(_PAGE, count - len(found)), "desc")
        found.extend(_in_place(read))
        if not read.has_more or read.next_cursor is None:  # a page of bad records goes on
            break
        after = read.next_cursor
    return found[:count]


def unreadable(sequence: int) -> dict[str, Any]:
    """The stand-in of the unreadable record at `sequence` in :func:`newest`: no message type
    an adapter knows, an id of its own (what the next message is chained to), no otid."""
    return {"message_type": "unreadable", "id": f"unreadable-{sequence}", "seq_id": sequence}


def _in_place(read: core.DictsPage) -> list[Stored]:
    """A newest-first page's messages with its unreadable records' stand-ins in their places."""
    if not read.unreadable:
        return list(read.messages)
    merged = [*read.messages, *(unreadable(sequence) for sequence in read.unreadable)]
    return sorted(merged, key=lambda message: -int(field(message, "seq_id")))


def field(message: Stored, name: str) -> Any:
    """A field of a stored message, dict or model (None when it has none)."""
    return message.get(name) if type(message) is dict else getattr(message, name, None)


def skipped(thread: Any, messages: Iterable[Stored], error: Exception) -> None:
    """Logs the messages a read leaves out because the adapter can make no framework message
    of them (a stored message whose kept fields another writer broke), naming the thread and
    each sequence, as a page read logs a record it cannot read (docs/RELIABILITY.md)."""
    name = thread._ref.keys.meta.rpartition(":")[0] if thread is not None else "?"
    for message in messages:
        log.warning(
            "thread %s: skipped a message the adapter cannot convert: sequence %s: %s: %s",
            name,
            field(message, "seq_id"),
            type(error).__name__,
            error,
        )
