"""The stored record: how one message is kept as opaque bytes in Redis.

Lua never looks inside a record. The message's sequence is NOT in the record: it is the hash field
or sorted-set score the record lives under, and the reader passes it to :func:`decode_records`,
which sets ``seq_id`` from it.

Version 2 (written now)
    A msgpack array ``[2, message]`` or ``[2, message, turn_id]``: ``message`` is the message's
    JSON-mode dump without ``None`` fields and without ``seq_id``; strings are msgpack str, never
    bin (``use_bin_type=True``). Content keeps the shape it was stored with: a string stays a
    string.

Version 1 (read only)
    Plain JSON bytes of the message, so its first byte is ``{`` (a version-2 record starts with a
    msgpack array byte, never ``{``). Version 1 knew only string content; a user or assistant
    message's string ``content`` reads as one text part, which carries the same meaning in
    version 2. Tool returns are read as stored (a ``tool_return`` string is valid version 2 as it
    is).

Reading never trusts the bytes: every malformed record, unknown version, nesting bomb or invalid
message raises RecordError naming the record's sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
from pydantic import ValidationError
from pydantic_core import from_json

from kvstore.errors import InvalidMessage, RecordError
from kvstore.messages import (
    MESSAGE_ADAPTER,
    MESSAGE_LIST_ADAPTER,
    BaseMessage,
    Message,
    describe_errors,
)

__all__ = ["RECORD_VERSION", "decode_records", "encode_record", "record_turn_id"]

RECORD_VERSION = 2

_JSON_RECORD_START = b"{"
# Version 1 wrote these types' content as a plain string; version 2 reads it as one text part.
_V1_PART_CONTENT_TYPES = frozenset({"user_message", "assistant_message"})


def encode_record(message: BaseMessage, turn_id: str | None = None) -> bytes:
    """The version-2 record of ``message``; ``len()`` of the result is its stored size.

    Refuses no size (limits are the engine's); raises InvalidMessage only for a message that
    cannot be encoded at all (a lone surrogate in a string, an integer wider than 64 bits).
    """
    # The serializer directly, and seq_id popped rather than excluded: both measurably cheaper
    # than model_dump(exclude=...) on this hot path.
    body = message.__pydantic_serializer__.to_python(message, mode="json", exclude_none=True)
    body.pop("seq_id", None)  # the sequence lives in the key, not the record
    fields = [RECORD_VERSION, body] if turn_id is None else [RECORD_VERSION, body, turn_id]
    try:
        return msgpack.packb(fields, use_bin_type=True)
    except (ValueError, TypeError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidMessage(f"{message.message_type} cannot be encoded: {exc}") from exc


def decode_records(entries: Sequence[tuple[int, bytes]]) -> list[Message]:
    """The messages of ``(sequence, record)`` entries, in order, each with ``seq_id`` set."""
    bodies = [_record_body(sequence, record) for sequence, record in entries]
    try:
        # One validation call per page: the per-call overhead dominates for small messages.
        return MESSAGE_LIST_ADAPTER.validate_python(bodies)
    except ValidationError as exc:
        index = _first_failing_index(exc)
        sequence = entries[index][0]
        detail = describe_errors(exc, bodies)
        try:
            # Re-validate the culprit alone so the error names its fields, not the page's indexes.
            MESSAGE_ADAPTER.validate_python(bodies[index])
        except ValidationError as single:
            detail = describe_errors(single, bodies[index])
        raise RecordError(
            f"record at sequence {sequence} does not hold a valid message: {detail}"
        ) from exc


def record_turn_id(record: bytes) -> str | None:
    """The turn id stored in a record, without decoding the message (None for version 1)."""
    if record[:1] == _JSON_RECORD_START:
        return None
    unpacker = msgpack.Unpacker(
        raw=False, max_buffer_size=max(len(record), 1), max_bin_len=0, max_ext_len=0
    )
    try:
        unpacker.feed(record)
        length = unpacker.read_array_header()
        version = unpacker.unpack()
        if not _is_current_version(version) or length not in (2, 3):
            raise ValueError(f"version {version!r} with {length} fields")
        if length == 2:
            return None
        unpacker.skip()
        turn_id = unpacker.unpack()
    except Exception as exc:  # any failure of msgpack on foreign bytes is a bad record
        raise RecordError(f"not a readable record: {_unpack_failure(exc)}") from exc
    if not isinstance(turn_id, str):
        raise RecordError(f"record turn id is a {type(turn_id).__name__}, not a string")
    return turn_id


def _record_body(sequence: int, record: bytes) -> dict[str, Any]:
    """The message dict of one record, with its ``seq_id``, not yet validated."""
    if record[:1] == _JSON_RECORD_START:
        body = _version_1_body(sequence, record)
    else:
        body = _version_2_body(sequence, record)
    body["seq_id"] = sequence
    return body


def _version_2_body(sequence: int, record: bytes) -> dict[str, Any]:
    try:
        # Records carry only JSON values, so bin and ext types are refused outright; the other
        # length limits default to the record's own size, and nesting is capped by msgpack's stack.
        fields = msgpack.unpackb(record, raw=False, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises ValueError subclasses, TypeError, and more on junk
        raise RecordError(
            f"record at sequence {sequence} is not valid msgpack: {_unpack_failure(exc)}"
        ) from exc
    if not isinstance(fields, list) or len(fields) not in (2, 3):
        raise RecordError(
            f"record at sequence {sequence} is not a [version, message, turn_id?] array"
        )
    if not _is_current_version(fields[0]):
        raise RecordError(
            f"record at sequence {sequence} has version {fields[0]!r}; "
            f"this kvstore reads versions 1 and {RECORD_VERSION}"
        )
    body = fields[1]
    if not isinstance(body, dict):
        raise RecordError(
            f"record at sequence {sequence} holds a {type(body).__name__}, not a message"
        )
    if len(fields) == 3 and not isinstance(fields[2], str):
        raise RecordError(f"record at sequence {sequence} has a {type(fields[2]).__name__} turn id")
    return body


def _version_1_body(sequence: int, record: bytes) -> dict[str, Any]:
    try:
        # pydantic-core's parser caps nesting depth where json.loads would raise RecursionError.
        body = from_json(record, allow_inf_nan=False)
    except ValueError as exc:
        raise RecordError(
            f"version-1 record at sequence {sequence} is not valid JSON: {exc}"
        ) from exc
    if not isinstance(body, dict):
        raise RecordError(f"version-1 record at sequence {sequence} is not a JSON object")
    content = body.get("content")
    if isinstance(content, str) and body.get("message_type") in _V1_PART_CONTENT_TYPES:
        body["content"] = [{"type": "text", "text": content}]
    return body


def _is_current_version(version: Any) -> bool:
    # `type(...) is int` so that True or 2.0 are not taken for a version.
    return type(version) is int and version == RECORD_VERSION


def _unpack_failure(exc: Exception) -> str:
    if isinstance(exc, msgpack.StackError):
        return "nested too deep"
    return str(exc) or type(exc).__name__


def _first_failing_index(exc: ValidationError) -> int:
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        if loc and isinstance(loc[0], int):
            return loc[0]
    return 0
