"""A source session's records read: its pages (oldest first), each record's JSON, the digest
chain over them, and the kvstore messages each record makes, with their ids and metadata."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Generator
from typing import Any

from .. import errors
from .._engine.drivers import Step
from .._engine.record import encode_message
from ..errors import SourceChanged
from ..messages import Message
from .langchain import _from_langchain
from .llamaindex import _from_llamaindex
from .openai_agents import _from_openai_agents
from .records import Source, message_id, split_fields


class SourceRead(Step):
    """A read of the import's source client: ``source.<command>(*args)``."""

    __slots__ = ("args", "command")

    def __init__(self, command: str, args: tuple[Any, ...]) -> None:
        self.command, self.args = command, args

    def __call__(self, driver: Any) -> Any:
        return getattr(driver.source, self.command)(*self.args)


def _source_position(message: Message | None, kind: Source) -> int | None:
    metadata = (message.metadata or {}) if message is not None else {}
    position = metadata.get("source_position", "")
    return int(position) if metadata.get("source") == kind and position.isdigit() else None


def _ids(kind: Source, key: str, position: int, raw: bytes, digest: bytes) -> set[str]:
    """The ids an import gives the source message at `position` (none if it is not one)."""
    try:
        mapped = _map(kind, key, position, _parse(key, position, raw), digest)
        return {message.id for message in mapped if message.id is not None}
    except errors.InvalidMessage:
        return set()


def _page(
    kind: Source, key: str, start: int, end: int, total: int
) -> Generator[Any, Any, list[bytes]]:
    """The session's messages at positions start..end-1, oldest first, as stored (JSON bytes)."""
    if kind == "langchain":  # newest first: position p is index -(p + 1), stable under LPUSH
        page: list[bytes] = (yield SourceRead("lrange", (key, -end, -start - 1)))[::-1]
    else:
        page = yield SourceRead("lrange", (key, start, end - 1))
    if len(page) != end - start:
        raise SourceChanged(f"{key} changed while it was read (LLEN {total}, then fewer)")
    return page


def _parse(key: str, position: int, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise errors.InvalidMessage(f"{key}, message {position}: nested too deep to read") from None
    except ValueError as exc:
        raise errors.InvalidMessage(f"{key}, message {position}: not JSON ({exc})") from None


def _chain(digest: bytes, raw: bytes) -> bytes:
    """The digest of a session up to a message: of the one before it and of its record."""
    return hashlib.blake2b(digest + raw, digest_size=16).digest()


def _is_llamaindex(first: bytes | None, last: bytes | None) -> bool:
    """Whether a list is a LlamaIndex chat by its first and last elements: the first a
    ChatMessage as LlamaIndex dumps it (a role, blocks or content), and neither an object with
    a `type`, which the OpenAI Agents SDK's items have (function calls, outputs, reasoning, an
    assistant's output message) and a ChatMessage never does: where a role and content alone
    cannot tell the two apart. A last element that cannot be read at all does not decide: a
    chat with a damaged record is imported up to it, and fails there."""
    record, other = _object(first), _object(last)
    return (
        record is not None
        and "role" in record
        and ("blocks" in record or "content" in record)
        and "type" not in record
        and (other is None or "type" not in other)
    )


def _object(raw: bytes | None) -> dict[str, Any] | None:
    try:
        record = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


_CONVERTERS = {
    "langchain": _from_langchain,
    "llamaindex": _from_llamaindex,
    "openai_agents": _from_openai_agents,
}


def _map(kind: Source, key: str, position: int, record: Any, digest: bytes) -> list[Message]:
    try:
        made, fields = _CONVERTERS[kind](record)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # ValidationError included
        raise errors.InvalidMessage(
            f"{key}, message {position}: cannot be read as a {kind} message ({exc})"
        ) from None
    out = []
    for part, message in enumerate(made):
        metadata = {"source": kind, "source_position": str(position)}
        if part == 0 and fields:
            metadata.update(split_fields(fields, key, position))
        named = message.model_copy(
            update={"id": message_id(kind, key, position, part, digest), "metadata": metadata}
        )
        out.append(_encodable(named, key, position))
    return out


def _encodable(message: Message, key: str, position: int) -> Message:
    """`message`, if the store can encode it; else InvalidMessage, its session's error. A
    source's valid JSON can still hold what no UTF-8 text can ("\\ud800", a lone surrogate,
    in a text, a field or a key): found here, the messages before it are stored first."""
    try:
        encode_message(message)
    except errors.InvalidMessage as exc:
        raise errors.InvalidMessage(f"{key}, message {position}: {exc}") from None
    return message
