"""The trusted read (kvstore._engine.trusted) against full validation: whatever it builds is what
validation builds, field for field (types, fields set, unknown fields, timezones, nested models),
and it builds nothing validation would refuse."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from kvstore._engine.record import _record_body, decode_records, encode_record
from kvstore._engine.trusted import trusted_message
from kvstore.messages import (
    MESSAGE_ADAPTER,
    AssistantMessage,
    EventMessage,
    ImageContent,
    SummaryMessage,
    TextContent,
    ToolCall,
    ToolCallDelta,
    ToolCallMessage,
    URLImage,
    UserMessage,
)

from .test_messages import json_values, messages


def assert_same(trusted: Any, validated: Any, path: str = "message") -> None:
    """Equal, and alike in every way a caller can see: types, order, fields set, extras."""
    assert type(trusted) is type(validated), path
    if isinstance(trusted, BaseModel):
        assert trusted.__pydantic_fields_set__ == validated.__pydantic_fields_set__, path
        assert trusted.__pydantic_extra__ == validated.__pydantic_extra__, path
        assert trusted.__pydantic_private__ == validated.__pydantic_private__, path
        assert list(trusted.__dict__) == list(validated.__dict__), path
        for name, value in trusted.__dict__.items():
            assert_same(value, validated.__dict__[name], f"{path}.{name}")
    elif isinstance(trusted, list):
        assert len(trusted) == len(validated), path
        for index, (a, b) in enumerate(zip(trusted, validated, strict=True)):
            assert_same(a, b, f"{path}[{index}]")
    elif isinstance(trusted, dict):
        assert list(trusted) == list(validated), path
        for key, value in trusted.items():
            assert_same(value, validated[key], f"{path}.{key}")
    elif isinstance(trusted, datetime):
        assert trusted == validated, path
        assert type(trusted.tzinfo) is type(validated.tzinfo), path
        assert trusted.utcoffset() == validated.utcoffset(), path
        assert trusted.isoformat() == validated.isoformat(), path
    else:
        assert trusted == validated, path


def _body(message: Any, sequence: int = 7) -> dict[str, Any]:
    return _record_body(sequence, encode_record(message))


def _check(body: dict[str, Any]) -> Any:
    """The trusted read of `body` beside validation of it: equal when it builds one, and None
    when validation refuses the body."""
    trusted = trusted_message(copy.deepcopy(body))
    try:
        validated = MESSAGE_ADAPTER.validate_python(copy.deepcopy(body))
    except ValidationError:
        assert trusted is None
        return None
    if trusted is not None:
        assert_same(trusted, validated)
        assert trusted == validated
        assert trusted.to_dict() == validated.to_dict()
        assert trusted.to_json() == validated.to_json()
        assert repr(trusted) == repr(validated)
    return trusted


@settings(max_examples=400, deadline=None)
@given(message=messages, sequence=st.integers(1, 2**53))
def test_the_trusted_read_equals_validation_on_every_message_type(message, sequence) -> None:
    body = _body(message, sequence)
    _check(body)
    # The same without what only validation reads at the top (so the trusted read builds more).
    fields = type(message).model_fields
    _check({k: v for k, v in body.items() if k in fields and k not in ("metadata", "attachments")})
    [decoded] = decode_records([(sequence, encode_record(message))])
    assert_same(decoded, MESSAGE_ADAPTER.validate_python(body))


# A change to one field of a valid record's dict: another JSON value, a value of another type,
# a new field, a field dropped.
mutations = st.tuples(
    st.sampled_from(["replace", "add", "drop", "nested"]),
    st.integers(0, 40),
    json_values
    | st.sampled_from(
        [
            "2024-05-01T12:00:00",  # naive: validation makes it UTC
            "2024-05-01",
            "2024-05-01T12:00:00+05:30",
            "not a date",
            1714564800,
            1.5,
            True,
            2**64,
            -(2**70),
            "user_message",
            "text",
            "success",
            {"type": "text", "text": "x"},
            {"type": "image", "source": {"url": "u"}},
            [{"type": "text", "text": "x", "colour": 1}],
            {"arguments": "{}", "name": "n", "tool_call_id": "c"},
            {"name": "n"},
            [{"arguments": "{}", "name": "n"}],
        ]
    ),
)


def _mutate(body: dict[str, Any], how: str, at: int, value: Any) -> None:
    keys = list(body)
    key = keys[at % len(keys)]
    if how == "replace":
        body[key] = value
    elif how == "add":
        body[f"x{at}"] = value
    elif how == "drop":
        del body[key]
    else:  # inside a nested dict or list, where there is one
        inner = body[key]
        if isinstance(inner, list) and inner:
            inner = inner[at % len(inner)]
        if isinstance(inner, dict) and inner:
            inner[list(inner)[at % len(inner)]] = value
        else:
            body[key] = value


@settings(max_examples=600, deadline=None)
@given(message=messages, mutation=mutations)
def test_the_trusted_read_takes_nothing_validation_refuses(message, mutation) -> None:
    body = _body(message)
    _mutate(body, *mutation)
    _check(body)


def test_common_messages_take_the_trusted_read() -> None:
    common = [
        UserMessage(id="m-1", date="2024-05-01T12:00:00Z", otid="o-1", content="héllo 🌍"),
        AssistantMessage(content=[TextContent(text="a"), TextContent(text="b", signature="s")]),
        ToolCallMessage(
            tool_call=ToolCall(arguments="{}", name="f", tool_call_id="c-1"),
            tool_calls=[ToolCall(arguments="{}", name="f", tool_call_id="c-1")],
        ),
        ToolCallMessage(tool_call=ToolCallDelta(name="f")),
        SummaryMessage(
            summary="s",
            date="2024-05-01T12:00:00.123456+02:00",
            compaction_stats={
                "context_window": 2**40,
                "messages_count_after": 1,
                "messages_count_before": 9,
                "trigger": "t",
            },
        ),
    ]
    for message in common:
        assert _check(_body(message)) is not None, message


def test_what_only_validation_reads_is_validated() -> None:
    validated = [
        UserMessage(content="x", metadata={"k": "v"}),
        UserMessage(content=[ImageContent(source=URLImage(url="https://e.x/a.png"))]),
        EventMessage(event_type="compaction", event_data={"n": 2**100}),
        UserMessage.model_validate({"message_type": "user_message", "content": "x", "extra": 1}),
    ]
    for message in validated:
        assert trusted_message(_body(message)) is None, message
    # None for a field, a naive date, an int for a bool: validated (and then read the same).
    for change in ({"name": None}, {"date": "2024-05-01T12:00:00"}, {"is_err": 1}):
        body = {**_body(AssistantMessage(content="x", name="n")), **change}
        assert trusted_message(body) is None
        [decoded] = decode_records([(7, msgpack.packb([2, {**body, "seq_id": 7}]))])
        assert decoded == MESSAGE_ADAPTER.validate_python({**body, "seq_id": 7})
