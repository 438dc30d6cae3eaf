"""Records read as message dicts: for readers that hand a framework dicts, not message models.

A version-2 record holds its message as the JSON-mode dict it was validated as when it was
written. :func:`decode_dicts` returns that dict (``seq_id`` set, as :func:`record.decode_records`
sets it) when a quick check of its shape shows that validation would accept it and keep every
value as it is: the fields of the common message types, each of the exact JSON type validation
keeps unchanged (strings, text and plain image parts, complete tool calls, metadata within its
bounds, a date of the form the store writes), unknown fields plain JSON within the bounds
(``messages._plain_json``, the check validation itself runs first). Anything else (a version-1
record, another message type, a field of another shape, a null, an unreadable record) goes
through :func:`record.decode_records`: such a record comes back as the validated model, or, when
it is unreadable, raises or is reported exactly as every other read reports it
(docs/RELIABILITY.md, "One bad record"). So a reader sees either a dict that validation would
have turned into a model holding the same values, or the model itself: never a record that
other reads would refuse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import msgpack

from kvstore.errors import RecordError
from kvstore.messages import (
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    BaseMessage,
    Message,
    _plain_json,
)

from .record import _MAX_BIG_INT_BYTES, RECORD_VERSION, _unpack_ext, decode_records

__all__ = ["decode_dicts", "plain_body"]


def _date(value: Any) -> bool:
    """A date as the store writes it (pydantic's JSON form of a UTC instant, with or without
    microseconds: ``2026-12-05T03:04:05.123456Z``), which validation reads as it is."""
    if type(value) is not str or len(value) not in (20, 27) or not value.isascii():
        return False
    if value[10] != "T" or value[-1] != "Z" or (len(value) == 27 and value[19] != "."):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:  # not that form, or no such day or hour
        return False
    return True


def _metadata(value: Any) -> bool:
    if type(value) is not dict or len(value) > MAX_METADATA_PAIRS:
        return False
    for key, item in value.items():
        if type(key) is not str or type(item) is not str:
            return False
        if len(key) > MAX_METADATA_KEY_CHARS or len(item) > MAX_METADATA_VALUE_CHARS:
            return False
    return True


def _text_part(part: Any) -> bool:
    if type(part) is not dict or part.get("type") != "text" or type(part.get("text")) is not str:
        return False
    size = len(part)
    return size == 2 or (size == 3 and type(part.get("signature")) is str)


def _image_part(part: Any) -> bool:
    if type(part) is not dict or len(part) != 2 or part.get("type") != "image":
        return False
    source = part.get("source")
    if type(source) is not dict or not all(type(v) is str for v in source.values()):
        return False
    kind, size = source.get("type"), len(source)
    if kind == "url":
        return size == 2 and "url" in source
    if kind == "base64":
        both = "data" in source and "media_type" in source
        return both and (size == 3 or (size == 4 and "detail" in source))
    return False


def _text_content(value: Any) -> bool:
    return type(value) is str or (type(value) is list and all(_text_part(p) for p in value))


def _content(value: Any) -> bool:
    if type(value) is str:
        return True
    return type(value) is list and all(_text_part(p) or _image_part(p) for p in value)


def _tool_call(value: Any) -> bool:
    return (
        type(value) is dict
        and len(value) == 3
        and type(value.get("arguments")) is str
        and type(value.get("name")) is str
        and type(value.get("tool_call_id")) is str
    )


def _tool_calls(value: Any) -> bool:
    return type(value) is list and all(_tool_call(call) for call in value)


def _one_of(*values: str) -> Callable[[Any], bool]:
    allowed = frozenset(values)
    return lambda value: type(value) is str and value in allowed


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_bool(value: Any) -> bool:
    return type(value) is bool


# A rule per field: `str` for "a str", else a check. A field of the type without a rule here
# (attachments, statuses of a thread message, a summary's stats, ...) sends the body to validation.
_Rules = dict[str, Any]
_BASE: _Rules = {
    **dict.fromkeys(("id", "name", "otid", "run_id", "step_id", "sender_id", "assistant_id"), str),
    "message_type": str,
    "date": _date,
    "seq_id": _is_int,
    "is_err": _is_bool,
    "metadata": _metadata,
}
_TYPES: dict[str, tuple[_Rules, tuple[str, ...]]] = {
    "system_message": ({"content": str}, ("content",)),
    "user_message": ({"content": _content}, ("content",)),
    "assistant_message": ({"content": _text_content}, ("content",)),
    "reasoning_message": (
        {
            "reasoning": str,
            "signature": str,
            "source": _one_of("reasoner_model", "non_reasoner_model"),
        },
        ("reasoning",),
    ),
    "hidden_reasoning_message": (
        {"state": _one_of("redacted", "omitted"), "hidden_reasoning": str},
        ("state",),
    ),
    "tool_call_message": ({"tool_call": _tool_call, "tool_calls": _tool_calls}, ("tool_call",)),
    "tool_return_message": (
        {"status": _one_of("success", "error"), "tool_call_id": str, "tool_return": str},
        ("status", "tool_call_id", "tool_return"),
    ),
    "summary_message": ({"summary": str}, ("summary",)),
}


def _kinds() -> dict[str, tuple[_Rules, tuple[str, ...], frozenset[str]]]:
    declared: dict[str, frozenset[str]] = {}
    for model in BaseMessage.__subclasses__():
        declared[model.model_fields["message_type"].default] = frozenset(model.model_fields)
    return {
        kind: ({**_BASE, **rules}, required, declared[kind])
        for kind, (rules, required) in _TYPES.items()
    }


_KINDS = _kinds()


# A body's shape (its type and its keys, in order) -> what to check of its values: the keys
# whose value must be a str, the (key, check) pairs, the unknown keys; None when the shape
# alone sends it to validation. Bounded: cleared when full (a thread's bodies share a few).
_Shape = tuple[tuple[str, ...], tuple[tuple[str, Any], ...], tuple[str, ...]]
_SHAPES: dict[tuple[Any, ...], _Shape | None] = {}
_MAX_SHAPES = 1024


def _shape(kind: str, keys: tuple[Any, ...]) -> _Shape | None:
    rules, required, declared = _KINDS[kind]
    if not all(name in keys for name in required):
        return None
    strs, checks, extras = [], [], []
    for key in keys:
        rule = rules.get(key)
        if rule is str:
            strs.append(key)
        elif rule is not None:
            checks.append((key, rule))
        elif type(key) is not str or key in declared:
            return None  # a field of the type this check leaves to validation
        else:
            extras.append(key)
    return tuple(strs), tuple(checks), tuple(extras)


def plain_body(body: dict[str, Any]) -> bool:
    """Whether validation of the message dict `body` would accept it and keep each value as it
    is (True), or it must be validated to tell (False: no verdict either way)."""
    kind = body.get("message_type")
    if type(kind) is not str or kind not in _KINDS:
        return False
    keys = (kind, *body)
    try:
        shape = _SHAPES[keys]
    except KeyError:
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        shape = _SHAPES[keys] = _shape(kind, keys[1:])
    if shape is None:
        return False
    strs, checks, extras = shape
    for key in strs:
        if type(body[key]) is not str:
            return False
    for key, check in checks:
        if not check(body[key]):
            return False
    for key in extras:  # unknown fields: JSON within the bounds, as validation checks them
        value = body[key]
        if type(value) is not str and not _plain_json(value, 1):
            return False
    return True


def _plain_record(sequence: int, record: bytes) -> dict[str, Any] | None:
    """The message dict of a version-2 record whose message passes :func:`plain_body`, or None."""
    if record[:1] == b"{":
        return None  # version 1: validation reads its string content as a part
    try:
        fields = msgpack.unpackb(
            record, raw=False, max_bin_len=0, max_ext_len=_MAX_BIG_INT_BYTES, ext_hook=_unpack_ext
        )
    except Exception:  # decode_records tells what is wrong with it
        return None
    if type(fields) is not list or not 2 <= len(fields) <= 3:
        return None
    version, body = fields[0], fields[1]
    if type(version) is not int or version != RECORD_VERSION or type(body) is not dict:
        return None
    if len(fields) == 3 and type(fields[2]) is not str:
        return None
    body["seq_id"] = sequence
    return body if plain_body(body) else None


def decode_dicts(
    entries: Sequence[tuple[int, bytes]], unreadable: list[RecordError] | None = None
) -> list[dict[str, Any] | Message]:
    """The messages of ``(sequence, record)`` entries, in order, each with ``seq_id`` set: the
    stored dict where :func:`plain_body` vouches for it, else the model validation makes.

    Errors as :func:`record.decode_records`: an unreadable record raises RecordError naming its
    sequence, or, given `unreadable`, is skipped and its error appended there.
    """
    out: list[Any] = []
    others: list[tuple[int, bytes]] = []
    for sequence, record in entries:
        body = _plain_record(sequence, record)
        if body is None:
            others.append((sequence, record))
            out.append(sequence)  # its place, filled below (or left out when unreadable)
        else:
            out.append(body)
    if not others:
        return out
    validated = {m.seq_id: m for m in decode_records(others, unreadable)}
    return [
        validated[item] if type(item) is int else item
        for item in out
        if type(item) is not int or item in validated
    ]
