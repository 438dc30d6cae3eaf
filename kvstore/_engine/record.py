"""The stored record: how one message is kept as opaque bytes in Redis.

Lua never looks inside a record. The message's sequence is NOT in the record: it is the hash field
or sorted-set score the record lives under, and the reader passes it to :func:`decode_records`,
which sets ``seq_id`` from it.

Version 2 (written now)
    A msgpack array ``[2, message]`` or ``[2, message, turn_id]``: ``message`` is the message's
    JSON-mode dump without ``None`` fields and without ``seq_id``; strings are msgpack str, never
    bin (``use_bin_type=True``). Content keeps the shape it was stored with: a string stays a
    string. Unknown fields are in the dump, so in the record and its size, like any other.
    An integer beyond msgpack's 64 bits (free-form JSON holds up to MAX_JSON_INT_BITS) is the
    msgpack extension type 1, its bytes the integer's two's complement, big-endian, in the fewest
    whole bytes that keep its sign: JSON numbers have no size, so the record keeps them exactly.
    That is the only extension type; a reader older than it refuses such a record (RecordError).

Version 1 (read only)
    Plain JSON bytes of the message, so its first byte is ``{`` (a version-2 record starts with a
    msgpack array byte, never ``{``). Version 1 knew only string content; a user or assistant
    message's string ``content`` reads as one text part, which carries the same meaning in
    version 2. Tool returns are read as stored (a ``tool_return`` string is valid version 2 as it
    is).

Writing validates what it writes: :func:`encode_message` validates the very JSON-mode dump it
packs, so a record always holds a valid message, whatever was done to the object in place.

Reading never trusts the bytes: every malformed record, unknown version, nesting bomb or invalid
message is a RecordError naming the record's sequence (``.sequence``). :func:`decode_records`
raises it, or, for a page read, skips that record and hands the error back, so one bad record
never hides the others. :func:`salvage` reads what it can of a record without validating it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, cast

import msgpack
from pydantic import TypeAdapter, ValidationError
from pydantic_core import from_json

from kvstore._engine.text import unsendable_key
from kvstore.errors import InvalidMessage, RecordError
from kvstore.messages import (
    MAX_JSON_INT_BITS,
    MESSAGE_ADAPTER,
    MESSAGE_LIST_ADAPTER,
    BaseMessage,
    Message,
    Timestamp,
    describe_errors,
    invalid_message,
    parse_message,
)

__all__ = [
    "RECORD_VERSION",
    "Salvaged",
    "decode_records",
    "encode_message",
    "encode_record",
    "record_turn_id",
    "salvage",
]

RECORD_VERSION = 2

_JSON_RECORD_START = b"{"
# Version 1 wrote these types' content as a plain string; version 2 reads it as one text part.
_V1_PART_CONTENT_TYPES = frozenset({"user_message", "assistant_message"})
# An integer beyond 64 bits, as a msgpack extension (its two's complement, big-endian).
_BIG_INT_EXT = 1
_MAX_BIG_INT_BYTES = MAX_JSON_INT_BITS // 8 + 1


def _pack_big_int(value: Any) -> msgpack.ExtType:
    """msgpack's `default`: it calls this for what it cannot pack, an int beyond 64 bits among."""
    if type(value) is not int:
        raise TypeError(f"cannot pack a {type(value).__name__}")
    if value.bit_length() > MAX_JSON_INT_BITS:
        raise OverflowError(
            f"an integer of {value.bit_length()} bits; at most {MAX_JSON_INT_BITS} are kept"
        )
    return msgpack.ExtType(
        _BIG_INT_EXT, value.to_bytes(value.bit_length() // 8 + 1, "big", signed=True)
    )


def _unpack_ext(code: int, data: bytes) -> int:
    if code != _BIG_INT_EXT:
        raise ValueError(f"unknown extension type {code}")
    return int.from_bytes(data, "big", signed=True)


# Records hold JSON values only: bin is refused outright, ext is the big integer alone; the other
# length limits default to the record's own size, and nesting is capped by msgpack's stack.
_UNPACK_LIMITS: dict[str, Any] = {
    "raw": False,
    "max_bin_len": 0,
    "max_ext_len": _MAX_BIG_INT_BYTES,
    "ext_hook": _unpack_ext,
}


def encode_message(
    message: BaseMessage | Mapping[str, Any] | str | bytes,
    turn_id: str | None = None,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[Message, bytes]:
    """The message as stored and its version-2 record; ``len()`` of the record is its stored size.

    What is packed is exactly what is validated: the message's JSON-mode dump (a dict is parsed
    first), after ``edit`` has set fields on it (JSON values: the store's ids and dates). So a
    message whose list or dict was changed in place after it was built cannot be stored, and the
    message returned is the validated copy, sharing nothing with ``message``. Refuses no size
    (limits are the engine's); every failure is an InvalidMessage naming the field.
    """
    if not isinstance(message, BaseMessage):
        message = parse_message(message)
    body = _dump(message)
    body.pop("seq_id", None)  # the sequence lives in the key, not the record
    if edit is not None:
        edit(body)
    try:
        stored = MESSAGE_ADAPTER.validate_python(body)
    except ValidationError as exc:
        raise invalid_message(exc, body) from exc
    fields = [RECORD_VERSION, body] if turn_id is None else [RECORD_VERSION, body, turn_id]
    try:
        record = msgpack.packb(fields, use_bin_type=True, default=_pack_big_int)
    except (ValueError, TypeError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        field = _unpackable_path(body) or "turn_id"
        raise InvalidMessage(f"{stored.message_type} cannot be encoded: {field}: {exc}") from exc
    if _REPLACED in record:
        # The JSON-mode dump writes a key holding a lone surrogate as U+FFFD: a key changed
        # without a word. Look only when the record holds that character at all.
        key = unsendable_key(message.model_dump(mode="python"))
        if key is not None:
            raise InvalidMessage(
                f"{stored.message_type} cannot be encoded: {key}: not valid Unicode"
            )
    return stored, record


# U+FFFD in UTF-8.
_REPLACED = b"\xef\xbf\xbd"


def encode_record(message: BaseMessage | Mapping[str, Any], turn_id: str | None = None) -> bytes:
    """The version-2 record of ``message`` (:func:`encode_message` without the stored message)."""
    return encode_message(message, turn_id)[1]


def decode_records(
    entries: Sequence[tuple[int, bytes]], unreadable: list[RecordError] | None = None
) -> list[Message]:
    """The messages of ``(sequence, record)`` entries, in order, each with ``seq_id`` set.

    An unreadable record raises RecordError naming its sequence. Given ``unreadable``, it is
    skipped instead and its error appended there (in entry order): the other messages are read.
    """
    failed: dict[int, RecordError] = {}  # entry position -> error
    bodies, positions = [], []
    for position, (sequence, record) in enumerate(entries):
        try:
            bodies.append(_record_body(sequence, record))
        except RecordError as exc:
            exc.sequence = sequence
            if unreadable is None:
                raise
            failed[position] = exc
        else:
            positions.append(position)
    while True:
        try:
            # One validation call per page: the per-call overhead dominates for small messages.
            messages = MESSAGE_LIST_ADAPTER.validate_python(bodies)
            break
        except ValidationError as exc:
            # Items validate independently, so dropping the failing ones leaves a valid page.
            bad = _failing_indexes(exc) or set(range(len(bodies)))
            for index in sorted(bad):
                error = _invalid_record(entries[positions[index]][0], bodies[index], exc)
                if unreadable is None:
                    raise error from exc
                failed[positions[index]] = error
            bodies = [b for i, b in enumerate(bodies) if i not in bad]
            positions = [p for i, p in enumerate(positions) if i not in bad]
    if unreadable is not None:
        unreadable.extend(failed[position] for position in sorted(failed))
    return messages


class Salvaged(NamedTuple):
    """What :func:`salvage` could read of a record; None where it could not."""

    otid: str | None
    date: str | None  # ISO 8601, as stored
    turn_id: str | None


def salvage(record: bytes) -> Salvaged:
    """The otid, date and turn id of a record that may not be readable, without validating the
    message (each value is checked on its own). Never raises: what cannot be read is None."""
    try:
        if record[:1] == _JSON_RECORD_START:
            body, turn_id = from_json(record, allow_inf_nan=False), None
        else:
            fields = msgpack.unpackb(record, **_UNPACK_LIMITS)
            if not isinstance(fields, list) or len(fields) not in (2, 3):
                return Salvaged(None, None, None)
            body, turn_id = fields[1], fields[2] if len(fields) == 3 else None
    except Exception:  # foreign bytes may fail in any way; nothing is known then
        return Salvaged(None, None, None)
    if not isinstance(body, dict):
        body = {}
    otid = body.get("otid")
    return Salvaged(
        otid if isinstance(otid, str) else None,
        _salvaged_date(body.get("date")),
        turn_id if isinstance(turn_id, str) else None,
    )


def record_turn_id(record: bytes) -> str | None:
    """The turn id stored in a record, without decoding the message (None for version 1)."""
    if record[:1] == _JSON_RECORD_START:
        return None
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(record), 1), **_UNPACK_LIMITS)
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


# What the container reader puts at the sequences of a chunk the chunk index lists but whose keys
# are gone: each reads as an unreadable record (0xc1 starts no msgpack), never as no message.
MISSING_RECORD = b"\xc1 the chunk holding this record is missing"


def _record_body(sequence: int, record: bytes) -> dict[str, Any]:
    """The message dict of one record, with its ``seq_id``, not yet validated."""
    if record is MISSING_RECORD:
        raise RecordError(
            f"record at sequence {sequence} is missing: the chunk index lists its chunk,"
            " whose keys are gone"
        )
    if record[:1] == _JSON_RECORD_START:
        body = _version_1_body(sequence, record)
    else:
        body = _version_2_body(sequence, record)
    body["seq_id"] = sequence
    return body


def _version_2_body(sequence: int, record: bytes) -> dict[str, Any]:
    try:
        # _UNPACK_LIMITS, spelt out: a page unpacks every record, and ** costs on each.
        fields = msgpack.unpackb(
            record, raw=False, max_bin_len=0, max_ext_len=_MAX_BIG_INT_BYTES, ext_hook=_unpack_ext
        )
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


def _failing_indexes(exc: ValidationError) -> set[int]:
    return {
        error["loc"][0]
        for error in exc.errors(include_url=False)
        if error["loc"] and isinstance(error["loc"][0], int)
    }


def _invalid_record(sequence: int, body: dict[str, Any], exc: ValidationError) -> RecordError:
    try:
        # Re-validate the culprit alone so the error names its fields, not the page's indexes.
        MESSAGE_ADAPTER.validate_python(body)
        detail = describe_errors(exc, body)
    except ValidationError as single:
        detail = describe_errors(single, body)
    error = RecordError(f"record at sequence {sequence} does not hold a valid message: {detail}")
    error.sequence = sequence
    return error


def _dump(message: BaseMessage) -> dict[str, Any]:
    """The JSON-mode dump of a message; what is not a valid value shows when it is validated."""
    try:
        # The serializer directly: measurably cheaper than model_dump on this hot path. Its
        # warnings about values of the wrong type are left out: validation names those fields.
        return message.__pydantic_serializer__.to_python(  # type: ignore[no-any-return]  # pydantic-core types it Any
            message, mode="json", exclude_none=True, warnings=False
        )
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # PydanticSerializationError (a ValueError) names no field: find it.
        field = "(message)"
        for name in [*type(message).model_fields, *(message.__pydantic_extra__ or ())]:
            try:
                message.__pydantic_serializer__.to_python(
                    message, mode="json", include={name}, warnings=False
                )
            except (ValueError, TypeError, OverflowError, RecursionError):
                field = name
                break
        kind = message.__dict__.get("message_type")
        raise InvalidMessage(f"{kind} cannot be encoded: {field}: {exc}") from exc


def _unpackable_path(value: Any, path: str = "") -> str:
    """The path of the first part of a valid message's dump that msgpack cannot pack."""
    if isinstance(value, dict):
        items: Any = ((f"{path}.{key}" if path else str(key), item) for key, item in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{index}]", item) for index, item in enumerate(value))
    else:
        return path
    for item_path, item in items:
        try:
            msgpack.packb(item, use_bin_type=True, default=_pack_big_int)
        except (ValueError, TypeError, OverflowError):
            return _unpackable_path(item, item_path)
    return path


_TIMESTAMP: TypeAdapter[Any] = TypeAdapter(Timestamp)


def _salvaged_date(value: Any) -> str | None:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return None
    try:
        return cast(str, _TIMESTAMP.dump_python(_TIMESTAMP.validate_python(value), mode="json"))
    except (ValidationError, ValueError, OverflowError):
        return None
