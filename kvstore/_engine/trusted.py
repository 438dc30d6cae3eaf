"""The trusted read: a version-2 record's message built without running the whole validator.

A version-2 record was validated when it was written (record.encode_message), so most of what
validation does on a read only confirms what is known. :func:`trusted_message` builds the message
straight from the record's dict when a cheap shape check shows the dict is one validation takes
as it is, value for value: every field the message type declares, each value of the exact type
its field takes (a ``str`` for a string, an ``int`` for an integer, one of a literal's values …),
content a string or text parts, a tool call as three strings. Dates are parsed by pydantic-core's
own datetime validator, so they are the datetimes validation makes.

Anything else returns None and the caller validates the dict in full: an unknown field (its JSON
is checked there), ``None`` for a field, metadata, attachments, images, tool returns, event data,
any value of another type, a naive date. So the trusted read never accepts what validation
refuses, and what it builds equals what validation builds, field for field, fields set and
unknown fields included (tests/offline/test_trusted_read.py compares both on generated messages
of every type).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import SchemaValidator, ValidationError, core_schema

from ..messages import (
    ApprovalRequestMessage,
    ApprovalResponseMessage,
    AssistantMessage,
    CompactionStats,
    HiddenReasoningMessage,
    IncompleteDetails,
    ReasoningMessage,
    SummaryMessage,
    SystemMessage,
    TextContent,
    Timestamp,
    ToolCall,
    ToolCallDelta,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
    _NullIsAbsent,
)

__all__ = ["trusted_message"]

# A field's kind: how its value is checked (a frozenset: a literal's values; a callable: a
# nested value's builder, returning None when the value is not one it builds).
_STR, _INT, _BOOL, _DATE = "str", "int", "bool", "date"
_EXACT = {_STR: str, _INT: int, _BOOL: bool}
_REQUIRED: Any = object()  # the "default" of a required field, until the dict gives it

_DATETIME = SchemaValidator(core_schema.datetime_schema())


class _Spec:
    """A model type's fields as the trusted read checks them."""

    __slots__ = ("cls", "defaults", "kinds", "required")

    def __init__(self, cls: type[BaseModel], nested: dict[str, Callable[[Any], Any]]) -> None:
        self.cls = cls
        self.kinds: dict[str, Any] = {}
        self.defaults: dict[str, Any] = {}
        required = []
        for name, field in cls.model_fields.items():
            kind = nested.get(name) or _kind(field.annotation, field.metadata)
            if kind is not None:
                self.kinds[name] = kind
            if field.is_required():
                required.append(name)
                self.defaults[name] = _REQUIRED
            else:
                self.defaults[name] = field.get_default(call_default_factory=True)
        self.required = frozenset(required)


def _kind(annotation: Any, metadata: list[Any]) -> Any:
    """The kind of a field of this annotation, or None: its values are never trusted."""
    if get_origin(annotation) in (Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        if len(options) != 1:
            return None
        annotation = options[0]
    if annotation == Timestamp:
        return _DATE
    # Metadata, free-form JSON, discriminated unions: validated. A literal that reads null as
    # absent is trusted with its own values only, which it takes as they are.
    if get_origin(annotation) is typing.Annotated or any(
        not isinstance(item, _NullIsAbsent) for item in metadata
    ):
        return None
    if get_origin(annotation) is Literal:
        values = get_args(annotation)
        return frozenset(values) if all(type(v) is str for v in values) else None
    for kind, exact in _EXACT.items():
        if annotation is exact:
            return kind
    return None


def _build(spec: _Spec, data: Any) -> Any:
    """The model of `spec` from `data`, or None when a value is not one the trusted read takes."""
    if type(data) is not dict or not spec.required <= data.keys():
        return None
    values = spec.defaults.copy()
    kinds = spec.kinds
    for key, value in data.items():
        kind = kinds.get(key)
        if kind is None:
            return None  # an unknown field, or a field only validation reads
        if type(kind) is str:
            if kind is _DATE:
                value = _date(value)
                if value is None:
                    return None
            elif type(value) is not _EXACT[kind]:
                return None
        elif type(kind) is frozenset:
            if type(value) is not str or value not in kind:
                return None
        else:
            value = kind(value)
            if value is None:
                return None
        values[key] = value
    model = spec.cls.__new__(spec.cls)
    object.__setattr__(model, "__dict__", values)
    object.__setattr__(model, "__pydantic_fields_set__", set(data))
    object.__setattr__(model, "__pydantic_extra__", {})
    object.__setattr__(model, "__pydantic_private__", None)
    return model


def _date(value: Any) -> datetime | None:
    if type(value) is not str:
        return None
    try:
        parsed: datetime = _DATETIME.validate_python(value)
    except ValidationError:
        return None
    # A naive date would take UTC on validation (messages.Timestamp); a record never holds one.
    return parsed if parsed.tzinfo is not None else None


# ----------------------------------------------------------------------------- nested values

_TEXT_PART = _Spec(TextContent, {})
_TOOL_CALL = _Spec(ToolCall, {})
_TOOL_CALL_DELTA = _Spec(ToolCallDelta, {})
_TOOL_CALL_FIELDS = ("arguments", "name", "tool_call_id")


def _text_parts(value: Any) -> Any:
    """A list of text parts, each stating its type (as a record's always does)."""
    if type(value) is not list:
        return None
    built = []
    for part in value:
        if type(part) is not dict or part.get("type") != "text":
            return None
        model = _build(_TEXT_PART, part)
        if model is None:
            return None
        built.append(model)
    return built


def _content(value: Any) -> Any:
    """Content: a string, or text parts (images are validated)."""
    if type(value) is str:
        return value
    return _text_parts(value)


def _complete(value: dict[str, Any]) -> bool:
    return all(type(value.get(name)) is str for name in _TOOL_CALL_FIELDS)


def _any_tool_call(value: Any) -> Any:
    """A tool call: a ToolCall when it holds all three strings, else a ToolCallDelta."""
    if type(value) is not dict:
        return None
    return _build(_TOOL_CALL if _complete(value) else _TOOL_CALL_DELTA, value)


def _tool_calls(value: Any) -> Any:
    """A list of complete tool calls, or one delta."""
    if type(value) is dict:
        return None if _complete(value) else _build(_TOOL_CALL_DELTA, value)
    if type(value) is not list:
        return None
    built = []
    for call in value:
        model = _build(_TOOL_CALL, call)
        if model is None:
            return None
        built.append(model)
    return built


def _flat(spec: _Spec) -> Callable[[Any], Any]:
    return lambda value: _build(spec, value)


# Every message's incomplete_details; a tool call's; a summary's statistics.
_COMMON = {"incomplete_details": _flat(_Spec(IncompleteDetails, {}))}
_CALLS = {**_COMMON, "tool_call": _any_tool_call, "tool_calls": _tool_calls}
_SPECS = {
    spec.cls.model_fields["message_type"].default: spec
    for spec in (
        _Spec(SystemMessage, _COMMON),
        _Spec(UserMessage, {**_COMMON, "content": _content}),
        _Spec(ReasoningMessage, _COMMON),
        _Spec(HiddenReasoningMessage, _COMMON),
        _Spec(ToolCallMessage, _CALLS),
        _Spec(ToolReturnMessage, _COMMON),
        _Spec(AssistantMessage, {**_COMMON, "content": _content}),
        _Spec(ApprovalRequestMessage, _CALLS),
        _Spec(ApprovalResponseMessage, _COMMON),
        _Spec(SummaryMessage, {**_COMMON, "compaction_stats": _flat(_Spec(CompactionStats, {}))}),
    )
}


def trusted_message(body: dict[str, Any]) -> Any:
    """The message of a version-2 record's dict, built without the validator; None when the dict
    is not one the trusted read takes (validate it then)."""
    kind = body.get("message_type")
    spec = _SPECS.get(kind) if type(kind) is str else None
    return None if spec is None else _build(spec, body)
