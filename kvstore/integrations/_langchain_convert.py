"""LangChain messages and kvstore messages, both ways, for the chat message history adapter.

Writing (:func:`converted`, :func:`stored`): each LangChain message through the importer's
conversion (kvstore/importers/langchain.py); its kvstore id comes from the thread and the
message's own ``id``, else from the batch, the message's place in it and the message stored
just before the batch, so the same batch sent again right away is a replay and the same words
said later in the conversation are stored. Reading (:func:`to_lc`): stored messages (models, or
dicts as kvstore/integrations/_dicts.py reads them) cut into the runs ``to_langchain`` may make
one LangChain message of; a plain message alone in its run is converted from its dict, and a
run no LangChain message can be made of is skipped and logged, never the whole read.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict

from .. import errors
from ..importers.langchain import _LC_LEFT_OUT, to_langchain
from ..importers.source import _map
from ..messages import Message
from . import _dicts
from ._dicts import Stored

# Ids of the messages the adapter stores: uuid5 in this namespace of (thread, key).
_ADAPTER_IDS = uuid.UUID("9b3e54a0-2f1d-4c7e-8a65-0d4f7c2e91b3")


class Batch(NamedTuple):
    """An add's messages converted, their ids not yet made: each LangChain message's own id
    (or None) and its kvstore messages, and the digest of the whole batch."""

    groups: list[tuple[str | None, list[Message]]]
    digest: str

    @property
    def size(self) -> int:
        """How many kvstore messages the batch stores."""
        return sum(len(parts) for _, parts in self.groups)

    @property
    def chained(self) -> bool:
        """Whether an id depends on the message stored before the batch (a message without
        its own id)."""
        return any(own is None for own, _ in self.groups)


def converted(messages: Iterable[Any], thread_id: str) -> Batch:
    """The batch of `messages`; InvalidMessage, naming the message, for one that is not a
    LangChain message or holds a value JSON cannot carry (nothing is sent then)."""
    given = list(messages)
    for position, message in enumerate(given):
        if not isinstance(message, BaseMessage):
            raise errors.InvalidMessage(
                f"{thread_id}, message {position}: a chat message history takes LangChain"
                f" messages (BaseMessage), not {type(message).__name__}"
            )
    records = [message_to_dict(message) for message in given]
    try:
        text = json.dumps(records, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidMessage(
            f"{thread_id}: a message holds a value JSON cannot carry ({exc})"
        ) from None
    groups = [
        (message.id or None, _map("langchain", thread_id, position, record, b""))
        for position, (message, record) in enumerate(zip(given, records, strict=True))
    ]
    return Batch(groups, hashlib.sha256(text.encode()).hexdigest())


def stored(batch: Batch, thread_id: str, anchor: str | None) -> list[Message]:
    """The batch's kvstore messages with their ids, `anchor` being the id of the thread's
    newest message before the batch (None on an empty thread)."""
    out: list[Message] = []
    for index, (own, parts) in enumerate(batch.groups):
        key = own or f"batch:{batch.digest}:{index}" + (f":{anchor}" if anchor else "")
        name = uuid.uuid5(_ADAPTER_IDS, f"{thread_id}\x00{key}")
        position = str(name.int >> 80)  # unique per message: groups never merge on the way out
        for n, part in enumerate(parts):
            metadata = {**(part.metadata or {}), "source_position": position}
            made = f"message-{name}" + (f"-{n}" if n else "")
            out.append(part.model_copy(update={"id": made, "metadata": metadata}))
    return out


def is_replay(batch: Batch, thread_id: str, tail: list[Stored]) -> bool:
    """Whether the thread's newest messages (`tail`, newest first, at least ``batch.size + 1``
    of them when the thread holds that many) are this batch, stored by an earlier call."""
    size = batch.size
    if len(tail) < size:
        return False
    before = _dicts.field(tail[size], "id") if len(tail) > size else None
    newest = [_dicts.field(message, "id") for message in reversed(tail[:size])]
    return newest == [message.id for message in stored(batch, thread_id, before)]


# --------------------------------------------------------------------------------- reading


def to_lc(messages: Iterable[Stored], thread: Any) -> list[BaseMessage]:
    """LangChain messages of stored messages, oldest first (what ``to_langchain`` makes of
    them); a run of messages no LangChain message can be made of is skipped and logged."""
    out: list[BaseMessage] = []
    for run in _runs(m for m in messages if _kind(m) not in _LEFT_OUT):
        try:
            out.extend(messages_from_dict(_records(run)))
        except _dicts.CONVERSION_ERRORS as exc:
            _dicts.skipped(thread, run, exc)
    return out


def langchain_records(messages: Iterable[Stored]) -> list[dict[str, Any]]:
    """``to_langchain`` of stored messages, run by run as :func:`to_lc` converts them (a plain
    message from its dict): the same records as ``to_langchain`` of their models."""
    runs = _runs(m for m in messages if _kind(m) not in _LEFT_OUT)
    return [record for run in runs for record in _records(run)]


def _runs(items: Iterable[Any], message_of: Any = None) -> Iterator[list[Any]]:
    """The messages (or the items `message_of` gives the message of) cut into to_langchain's
    groups: converting run by run makes the same LangChain messages as the whole at once."""
    run: list[Any] = []
    for item in items:
        if run and not _joins(_of(run[-1], message_of), _of(item, message_of)):
            yield run
            run = []
        run.append(item)
    if run:
        yield run


def _of(item: Any, message_of: Any) -> Stored:
    found: Stored = item if message_of is None else message_of(item)
    return found


def _joins(previous: Stored, message: Stored) -> bool:
    """Whether to_langchain makes one LangChain message of `message` and the one before (its
    grouping, exactly): the same LangChain record's parts, or a tool call following the text or
    call of its step."""
    origin = _origin_of(message)
    if origin is not None:
        return origin == _origin_of(previous)
    if _origin_of(previous) is not None or _kind(message) != "tool_call_message":
        return False
    if _kind(previous) not in ("assistant_message", "tool_call_message"):
        return False
    steps = (_dicts.field(previous, "step_id"), _dicts.field(message, "step_id"))
    return None in steps or steps[0] == steps[1]


def _made(run: list[Stored]) -> int:
    """How many LangChain messages to_langchain makes of a run: one, but a tool return of
    several tools (``tool_returns``, stored by another writer) makes one per tool."""
    if len(run) == 1 and _origin_of(run[0]) is None and _kind(run[0]) == "tool_return_message":
        returns = _dicts.field(run[0], "tool_returns")
        if returns:
            return len(returns)
    return 1


def newest_start(
    messages: list[Stored], count: int, complete: bool, before: bool = False
) -> int | None:
    """Where the newest `count` LangChain messages start in `messages` (the thread's newest
    messages, oldest first, summaries out; `complete` when they reach its start): the index of
    the first message of the oldest run they need, never inside a LangChain message (past the
    end for 0). None when older messages must be read first: the oldest run read may begin
    before them, or (`before`) no message before the start was read yet."""
    kept = [n for n, message in enumerate(messages) if _kind(message) not in _LEFT_OUT]
    runs = list(_runs(kept, lambda n: messages[n]))
    made, start, oldest = 0, len(messages), False
    for number, run in enumerate(reversed(runs), 1):
        if made >= count:
            break
        made += _made([messages[n] for n in run])
        start, oldest = run[0], number == len(runs)
    if complete:
        return start
    if made < count or oldest or (before and start == 0):
        return None
    return start


def whole_pairs(messages: list[Stored], start: int, complete: bool) -> int | None:
    """`start` (in :func:`newest_start`'s `messages`) moved back until every tool answer from
    it on has the whole LangChain message of its call with it: kvstore's compaction never
    covers half of a pair, and would move back to just before the call, inside that message.
    None when a call is older than the messages read (and `complete` is false)."""
    while True:
        answered = {i for m in messages[start:] for i in _ids(m, "tool_return", "tool_returns")}
        answered -= {i for m in messages[start:] for i in _ids(m, "tool_call", "tool_calls")}
        if not answered:
            return start
        calls = [n for n in range(start) if answered & _ids(messages[n], "tool_call", "tool_calls")]
        found = set().union(*(_ids(messages[n], "tool_call", "tool_calls") for n in calls))
        if not complete and not answered <= found:
            return None  # a call before the messages read
        if not calls:
            return start  # calls the thread no longer holds: nothing to keep
        kept = [n for n, message in enumerate(messages) if _kind(message) not in _LEFT_OUT]
        runs = list(_runs(kept, lambda n: messages[n]))
        start = next(run[0] for run in runs if calls[0] in run)
        if runs[0][0] == start and not complete:
            return None  # the call's message may begin before the messages read


def _ids(message: Stored, one: str, many: str) -> set[str]:
    """The tool call ids a tool call message calls (``tool_call``, ``tool_calls``) or a tool
    return message answers (``tool_return`` / ``tool_returns``), dict or model."""
    kind = _kind(message)
    if kind != f"{one}_message":
        return set()
    own = _dicts.field(message, "tool_call_id") if one == "tool_return" else None
    items = [_dicts.field(message, one) if one == "tool_call" else None]
    items += list(_dicts.field(message, many) or [])
    found = {own} if isinstance(own, str) else set()
    for item in items:
        value = (
            item.get("tool_call_id")
            if isinstance(item, dict)
            else getattr(item, "tool_call_id", None)
        )
        if isinstance(value, str):
            found.add(value)
    return found


def _records(run: list[Stored]) -> list[dict[str, Any]]:
    if len(run) == 1 and type(run[0]) is dict:
        record = _plain_record(run[0])
        if record is not None:
            return [record]
    return to_langchain([_dicts.as_model(message) for message in run])


# LangChain's type of each kvstore type whose one message _plain_record writes from its dict.
_PLAIN_TYPES = {"user_message": "human", "system_message": "system", "assistant_message": "ai"}
_LEFT_OUT = frozenset(cls.model_fields["message_type"].default for cls in _LC_LEFT_OUT)


def _origin_of(message: Stored) -> tuple[str, str] | None:
    """The LangChain record a message came from (importers.langchain._origin), dict or model."""
    metadata = _dicts.field(message, "metadata")
    if metadata and metadata.get("source") == "langchain" and "source_position" in metadata:
        return metadata["source"], metadata["source_position"]
    return None


def _plain_record(message: dict[str, Any]) -> dict[str, Any] | None:
    """The LangChain record of a user, system or assistant message alone in its run, with a
    string content and no source fields kept, as to_langchain writes it; None for any other."""
    kind = _PLAIN_TYPES.get(message.get("message_type"))  # type: ignore[arg-type]  # any value
    content = message.get("content")
    metadata = message.get("metadata")
    if kind is None or type(content) is not str or (metadata and "source_fields" in metadata):
        return None
    data: dict[str, Any] = {"content": content, "type": kind}
    if message.get("name"):
        data["name"] = message["name"]
    if kind == "ai":
        data["tool_calls"] = []
    return {"type": kind, "data": data}


def _kind(message: Stored) -> Any:
    return _dicts.field(message, "message_type")
