"""Unit tests of kvstore.messages: every list-API shape, bad input, timestamps, inline media."""

from __future__ import annotations

import base64
import copy
import json
import string
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore._engine.record import decode_records, encode_record
from kvstore.errors import InlineMediaTooLarge, InvalidMessage, RoleBasedMessage
from kvstore.messages import (
    MAX_JSON_DEPTH,
    MAX_JSON_INT_BITS,
    MESSAGE_ADAPTER,
    ApprovalRequestMessage,
    ApprovalResponseMessage,
    ApprovalReturn,
    AssistantMessage,
    Attachment,
    AttachmentTool,
    Base64Image,
    CompactionStats,
    EventMessage,
    HiddenReasoningMessage,
    ImageContent,
    IncompleteDetails,
    LettaImage,
    ReasoningMessage,
    SummaryMessage,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolCallDelta,
    ToolCallMessage,
    ToolReturn,
    ToolReturnMessage,
    URLImage,
    UserMessage,
    base64_decoded_size,
    check_inline_parts,
    inline_media_bytes,
    inline_parts,
    parse_message,
    strip_inline_media,
    unknown_fields,
)

MiB = 1024 * 1024
COMMON = {
    "id": "message-6f1c2a9e-0000-4000-8000-000000000001",
    "date": "2024-05-01T12:00:00Z",
    "name": "alice",
    "otid": "otid-1",
    "run_id": "run-1",
    "step_id": "step-1",
    "sender_id": "user-1",
    "is_err": False,
}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(200))).decode()

# One JSON example per list-API shape, written as the API returns it (every `type` present).
EXAMPLES: dict[str, dict] = {
    "system": {**COMMON, "message_type": "system_message", "content": "You are helpful."},
    "user_string": {**COMMON, "message_type": "user_message", "content": "hello"},
    "user_parts": {
        **COMMON,
        "message_type": "user_message",
        "content": [
            {"type": "text", "text": "look at these", "signature": "sig-1"},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            {
                "type": "image",
                "source": {
                    "type": "base64",
                    "data": PNG,
                    "media_type": "image/png",
                    "detail": "high",
                },
            },
            {
                "type": "image",
                "source": {
                    "type": "letta",
                    "file_id": "file-1",
                    "data": PNG,
                    "detail": "low",
                    "media_type": "image/png",
                },
            },
            {"type": "image", "source": {"type": "letta", "file_id": "file-2"}},
        ],
    },
    "user_thread_fields": {
        **COMMON,
        "message_type": "user_message",
        "content": "with every thread-message field",
        "status": "incomplete",
        "incomplete_details": {"reason": "max_tokens"},
        "completed_at": "2024-05-01T12:00:05Z",
        "incomplete_at": "2024-05-01T12:00:06.250000Z",
        "attachments": [
            {"file_id": "file-9", "tools": [{"type": "code_interpreter"}, {"type": "file_search"}]},
            {
                "data_source": {"uri": "azureml://x", "type": "uri_asset"},
                "tools": [{"type": "file_search"}],
            },
        ],
        "assistant_id": "asst-1",
        "metadata": {"tenant": "acme", "ticket": "T-1"},
        "seq_id": 12,
    },
    "reasoning": {
        **COMMON,
        "message_type": "reasoning_message",
        "reasoning": "The user wants a summary.",
        "source": "non_reasoner_model",
        "signature": "rs-1",
    },
    "hidden_reasoning": {
        **COMMON,
        "message_type": "hidden_reasoning_message",
        "state": "redacted",
        "hidden_reasoning": "opaque",
    },
    "tool_call": {
        **COMMON,
        "message_type": "tool_call_message",
        "tool_call": {"arguments": '{"q": "x"}', "name": "search", "tool_call_id": "call-1"},
        "tool_calls": [
            {"arguments": '{"q": "x"}', "name": "search", "tool_call_id": "call-1"},
            {"arguments": "{}", "name": "clock", "tool_call_id": "call-2"},
        ],
    },
    "tool_call_delta": {
        **COMMON,
        "message_type": "tool_call_message",
        "tool_call": {"arguments": '{"q": '},
        "tool_calls": {"name": "search", "tool_call_id": "call-1"},
    },
    "tool_return": {
        **COMMON,
        "message_type": "tool_return_message",
        "status": "success",
        "tool_call_id": "call-1",
        "tool_return": "3 results",
        "stdout": ["searching", "done"],
        "stderr": [],
        "tool_returns": [
            {
                "type": "tool",
                "status": "success",
                "tool_call_id": "call-1",
                "tool_return": "3 results",
            },
            {
                "type": "tool",
                "status": "error",
                "tool_call_id": "call-2",
                "tool_return": [
                    {"type": "text", "text": "screenshot"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "data": PNG, "media_type": "image/png"},
                    },
                ],
                "stdout": ["x"],
                "stderr": ["boom"],
            },
        ],
    },
    "assistant_string": {**COMMON, "message_type": "assistant_message", "content": "Hi!"},
    "assistant_parts": {
        **COMMON,
        "message_type": "assistant_message",
        "content": [
            {"type": "text", "text": "Hi"},
            {"type": "text", "text": "there", "signature": "s"},
        ],
    },
    "approval_request": {
        **COMMON,
        "message_type": "approval_request_message",
        "tool_call": {"arguments": "{}", "name": "delete_file", "tool_call_id": "call-3"},
        "tool_calls": [{"arguments": "{}", "name": "delete_file", "tool_call_id": "call-3"}],
    },
    "approval_response": {
        **COMMON,
        "message_type": "approval_response_message",
        "approval_request_id": "message-approval",
        "approvals": [
            {"type": "approval", "approve": True, "tool_call_id": "call-3", "reason": "looks safe"},
            {
                "type": "tool",
                "status": "success",
                "tool_call_id": "call-4",
                "tool_return": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "data": PNG, "media_type": "image/png"},
                    }
                ],
            },
        ],
        "approve": True,
        "reason": "ok",
    },
    "summary": {
        **COMMON,
        "message_type": "summary_message",
        "summary": "We talked about search.",
        "compaction_stats": {
            "context_window": 128000,
            "messages_count_after": 3,
            "messages_count_before": 120,
            "trigger": "context_window_exceeded",
            "context_tokens_after": 900,
            "context_tokens_before": 120000,
        },
    },
    "event": {
        **COMMON,
        "message_type": "event_message",
        "event_type": "compaction",
        "event_data": {
            "trigger": "post_step_context_check",
            "removed": [1, 2.5, None, True],
            "nested": {"a": {}},
        },
    },
}

ALL_TYPES = {
    "system_message",
    "user_message",
    "reasoning_message",
    "hidden_reasoning_message",
    "tool_call_message",
    "tool_return_message",
    "assistant_message",
    "approval_request_message",
    "approval_response_message",
    "summary_message",
    "event_message",
}


def test_examples_cover_every_message_type() -> None:
    assert {example["message_type"] for example in EXAMPLES.values()} == ALL_TYPES


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_parses_and_dumps_back_unchanged(name: str) -> None:
    example = EXAMPLES[name]
    message = parse_message(example)
    assert message.to_dict() == example
    assert json.loads(message.to_json()) == example
    assert parse_message(json.dumps(example)) == message
    assert parse_message(json.dumps(example).encode()) == message


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_round_trips_through_a_record(name: str) -> None:
    message = parse_message(EXAMPLES[name])
    [decoded] = decode_records([(41, encode_record(message, turn_id="turn-1"))])
    assert decoded.seq_id == 41
    assert decoded.to_dict() == {**EXAMPLES[name], "seq_id": 41}


def test_message_type_defaults_to_the_class() -> None:
    assert UserMessage(content="hi").to_dict() == {"message_type": "user_message", "content": "hi"}
    assert ReasoningMessage(reasoning="r").source is None  # absent stays absent: nothing invented
    assert EventMessage(event_type="compaction", event_data={}).message_type == "event_message"


def test_parts_and_sources_without_type_are_inferred_by_shape() -> None:
    message = parse_message(
        {
            "message_type": "user_message",
            "content": [
                {"text": "a"},
                {"source": {"url": "https://example.com/x.png"}},
                {"source": {"data": PNG, "media_type": "image/png"}},
                {"source": {"file_id": "file-1"}},
            ],
        }
    )
    parts = message.content
    assert isinstance(parts, list)
    assert isinstance(parts[0], TextContent)
    assert [type(part.source) for part in parts[1:]] == [URLImage, Base64Image, LettaImage]
    assert message.to_dict()["content"][1] == {
        "type": "image",
        "source": {"type": "url", "url": "https://example.com/x.png"},
    }


def test_approval_items_without_type_are_inferred_by_shape() -> None:
    message = parse_message(
        {
            "message_type": "approval_response_message",
            "approvals": [
                {"approve": False, "tool_call_id": "c1"},
                {"status": "error", "tool_call_id": "c2", "tool_return": "denied"},
            ],
        }
    )
    assert [type(item) for item in message.approvals] == [ApprovalReturn, ToolReturn]


def test_complete_tool_call_is_a_tool_call_and_partial_one_a_delta() -> None:
    complete = parse_message(EXAMPLES["tool_call"])
    partial = parse_message(EXAMPLES["tool_call_delta"])
    assert type(complete.tool_call) is ToolCall
    assert type(partial.tool_call) is ToolCallDelta
    assert type(partial.tool_calls) is ToolCallDelta
    with_null = {
        "message_type": "tool_call_message",
        "tool_call": {"name": "x", "arguments": None, "tool_call_id": "c"},
    }
    assert type(parse_message(with_null).tool_call) is ToolCallDelta


def test_complete_delta_reads_back_as_the_same_tool_call() -> None:
    message = ToolCallMessage(tool_call=ToolCallDelta(arguments="{}", name="f", tool_call_id="c"))
    again = parse_message(message.to_dict())
    assert type(again.tool_call) is ToolCall
    assert again.to_dict() == message.to_dict()


def test_tool_return_status_keeps_its_list_api_meaning() -> None:
    base = {"message_type": "tool_return_message", "tool_call_id": "c", "tool_return": "r"}
    assert parse_message({**base, "status": "error"}).status == "error"
    with pytest.raises(InvalidMessage, match=r"status: Input should be 'success' or 'error'"):
        parse_message({**base, "status": "completed"})
    with pytest.raises(InvalidMessage, match=r"status: Input should be 'in_progress'"):
        parse_message({"message_type": "user_message", "content": "x", "status": "success"})


# --- bad input ----------------------------------------------------------------------------------


def test_unknown_message_type_is_named() -> None:
    with pytest.raises(InvalidMessage, match=r"message_type: Input tag 'chat_message'") as caught:
        parse_message({"message_type": "chat_message", "content": "x"})
    assert caught.value.errors[0]["type"] == "union_tag_invalid"


@pytest.mark.parametrize("given", [{"content": "x"}, {"message_type": None, "content": "x"}])
def test_missing_message_type_is_named(given: dict) -> None:
    with pytest.raises(
        InvalidMessage, match=r"message_type: missing or null; .*one of 'system_message', "
    ) as caught:
        parse_message(given)
    assert type(caught.value) is InvalidMessage


def test_validation_error_is_wrapped_with_its_field_path() -> None:
    bad = {
        "message_type": "user_message",
        "content": [{"type": "text", "text": "a"}, {"type": "text"}],
    }
    with pytest.raises(
        InvalidMessage, match=r"invalid user_message: content\[1\]\.text: Field required"
    ) as caught:
        parse_message(bad)
    assert type(caught.value.__cause__).__name__ == "ValidationError"
    assert caught.value.errors[0]["type"] == "missing"


def test_a_misspelt_required_field_is_still_refused() -> None:
    # The unknown `contnet` is kept; the required `content` is missing.
    with pytest.raises(InvalidMessage, match=r"content: Field required"):
        parse_message({"message_type": "user_message", "contnet": "y"})


def test_assistant_content_takes_text_parts_only() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://x"}}
    with pytest.raises(InvalidMessage, match=r"content\[0\]"):
        parse_message({"message_type": "assistant_message", "content": [image]})


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({f"k{i}": "v" for i in range(17)}, r"metadata holds 17 pairs; at most 16 are allowed"),
        ({"k" * 65: "v"}, r"is 65 characters; keys are at most 64"),
        ({"key": "v" * 513}, r"metadata value of 'key' is 513 characters; values are at most 512"),
        ({"key": 5}, r"metadata\.key: Input should be a valid string"),
    ],
)
def test_metadata_limits(metadata: dict, expected: str) -> None:
    with pytest.raises(InvalidMessage, match=expected):
        parse_message({"message_type": "user_message", "content": "x", "metadata": metadata})


def test_metadata_at_its_limits_is_fine() -> None:
    metadata = {f"{i:064d}": "v" * 512 for i in range(16)}
    assert (
        parse_message(
            {"message_type": "user_message", "content": "x", "metadata": metadata}
        ).metadata
        == metadata
    )


def test_assignment_is_validated() -> None:
    message = UserMessage(content="x")
    with pytest.raises(ValueError, match="status"):
        message.status = "done"  # type: ignore[assignment]


@pytest.mark.parametrize(
    "payload",
    [
        '{"message_type": "user_message", "content": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "[" * 100_000 + "]" * 100_000,
        b'{"message_type": "event_message", "event_type": "compaction", "event_data": {"a": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}}",
    ],
)
def test_absurdly_deep_json_is_an_invalid_message(payload: str | bytes) -> None:
    with pytest.raises(InvalidMessage, match="recursion limit"):
        parse_message(payload)


def test_malformed_json_is_an_invalid_message() -> None:
    with pytest.raises(InvalidMessage, match="not valid JSON"):
        parse_message('{"message_type": "user_message", "content": ')


def test_deep_event_data_given_as_python_is_an_invalid_message() -> None:
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(InvalidMessage, match=r"event_data: .*nests deeper than 64 levels"):
        parse_message(
            {
                "message_type": "event_message",
                "event_type": "compaction",
                "event_data": {"a": nested},
            }
        )


@pytest.mark.parametrize("where", ["attachment", "tool"])
def test_attachment_keys_given_as_is_nest_at_most_max_json_depth(where: str) -> None:
    def message(value: object) -> dict:
        attachment: dict = {"file_id": "f", "x": value}
        if where == "tool":
            attachment = {"file_id": "f", "tools": [{"type": "file_search", "x": value}]}
        return {"message_type": "user_message", "content": "x", "attachments": [attachment]}

    def nested(depth: int) -> object:
        value: object = "leaf"
        for _ in range(depth):
            value = {"k": value}
        return value

    parsed = parse_message(message(nested(MAX_JSON_DEPTH)))
    assert parse_message(parsed.to_dict()) == parsed
    path = r"attachments\[0\]" if where == "attachment" else r"attachments\[0\]\.tools\[0\]"
    for depth in (MAX_JSON_DEPTH + 1, 255, 100_000):
        with pytest.raises(
            InvalidMessage, match=rf"{path}\.x: .*nests deeper than {MAX_JSON_DEPTH}"
        ):
            parse_message(message(nested(depth)))
    for value in ({1, 2}, b"bytes", float("nan"), datetime(2024, 1, 1), 2**4096, {1: "int key"}):
        with pytest.raises(InvalidMessage, match=path):
            parse_message(message(value))


@pytest.mark.parametrize("value", [{1, 2}, b"bytes", float("nan"), datetime(2024, 1, 1)])
def test_event_data_holds_only_json_values(value: object) -> None:
    with pytest.raises(InvalidMessage, match=r"event_data: "):
        parse_message(
            {
                "message_type": "event_message",
                "event_type": "compaction",
                "event_data": {"a": value},
            }
        )


def test_non_dict_input_is_an_invalid_message() -> None:
    with pytest.raises(InvalidMessage):
        parse_message(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "given",
    [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c", "content": "4 °C"},
        {"role": 5},
        '{"role": "system", "content": "be brief"}',
    ],
)
def test_a_role_based_chat_message_names_the_converter(given: object) -> None:
    with pytest.raises(RoleBasedMessage) as caught:
        parse_message(given)  # type: ignore[arg-type]
    text = str(caught.value)
    assert text.startswith("this looks like an OpenAI chat message (role ")
    assert "kvstore.convert.from_chat_completions(...)" in text
    assert isinstance(caught.value, InvalidMessage) and caught.value.http_status == 422
    assert caught.value.errors[0]["type"] == "union_tag_not_found"


def test_a_role_next_to_a_message_type_is_an_unknown_field() -> None:
    message = parse_message({"message_type": "user_message", "role": "user", "content": "hi"})
    assert unknown_fields(message) == {"role": "UserMessage has no such field"}
    with pytest.raises(InvalidMessage) as caught:
        parse_message({"message_type": "user_message", "role": "user"})
    assert type(caught.value) is InvalidMessage  # a kvstore message missing its content


# --- null is absent -------------------------------------------------------------------------------


def test_null_for_every_optional_literal_reads_as_absent() -> None:
    given = {
        "message_type": "approval_response_message",
        "approvals": [
            {"type": None, "approve": True, "tool_call_id": "c1"},
            {
                "type": None,
                "status": "success",
                "tool_call_id": "c2",
                "tool_return": [
                    {"type": None, "text": "t"},
                    {"type": None, "source": {"type": None, "url": "u"}},
                    {
                        "type": None,
                        "source": {"type": None, "data": PNG, "media_type": "image/png"},
                    },
                    {"type": None, "source": {"type": None, "file_id": "f"}},
                ],
            },
        ],
    }
    assert parse_message(given).to_dict() == {
        "message_type": "approval_response_message",
        "approvals": [
            {"type": "approval", "approve": True, "tool_call_id": "c1"},
            {
                "type": "tool",
                "status": "success",
                "tool_call_id": "c2",
                "tool_return": [
                    {"type": "text", "text": "t"},
                    {"type": "image", "source": {"type": "url", "url": "u"}},
                    {
                        "type": "image",
                        "source": {"type": "base64", "data": PNG, "media_type": "image/png"},
                    },
                    {"type": "image", "source": {"type": "letta", "file_id": "f"}},
                ],
            },
        ],
    }
    reasoning = parse_message(
        {"message_type": "reasoning_message", "reasoning": "r", "source": None}
    )
    assert reasoning.source is None and reasoning.to_dict() == {
        "message_type": "reasoning_message",
        "reasoning": "r",
    }
    returned = parse_message(
        {
            "message_type": "tool_return_message",
            "status": "success",
            "tool_call_id": "c",
            "tool_return": "r",
            "tool_returns": [
                {"type": None, "status": "error", "tool_call_id": "c", "tool_return": "x"}
            ],
        }
    )
    assert returned.tool_returns[0].type == "tool"


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (TextContent, {"text": "t"}),
        (ImageContent, {"source": {"url": "u"}}),
        (URLImage, {"url": "u"}),
        (Base64Image, {"data": "QQ==", "media_type": "image/png"}),
        (LettaImage, {"file_id": "f"}),
        (ToolReturn, {"status": "success", "tool_call_id": "c", "tool_return": "r"}),
        (ApprovalReturn, {"approve": True, "tool_call_id": "c"}),
    ],
)
def test_a_literal_type_takes_null_or_its_one_value_only(cls: type, fields: dict) -> None:
    own = cls.model_fields["type"].default
    assert cls.model_validate({**fields, "type": None}).type == own
    assert cls.model_validate({**fields, "type": own}).type == own
    for wrong in ("other", 5, ""):
        with pytest.raises(ValueError, match=rf"Input should be '{own}'"):
            cls.model_validate({**fields, "type": wrong})
    schema = cls.model_json_schema()["properties"]["type"]
    assert schema["anyOf"] == [{"const": own, "type": "string"}, {"type": "null"}]


def test_a_wrong_part_type_is_still_refused_by_name() -> None:
    with pytest.raises(InvalidMessage, match=r"content\[0\]: a content part needs type 'text'"):
        parse_message({"message_type": "user_message", "content": [{"type": "txt", "text": "a"}]})


# --- unknown fields -------------------------------------------------------------------------------

WITH_UNKNOWN_FIELDS = {
    "message_type": "tool_return_message",
    "status": "success",
    "tool_call_id": "c",
    "tool_return": "r",
    "tool_returns": [
        {
            "type": "tool",
            "status": "success",
            "tool_call_id": "c",
            "tool_return": [
                {"type": "text", "text": "t", "colour": "red"},
                {
                    "type": "image",
                    "source": {"type": "url", "url": "u", "shade": [1, {"a": None}]},
                    "alt": "a chart",
                },
            ],
            "duration_ms": 12,
        },
    ],
    "incomplete_details": {"reason": "max_tokens", "tokens": 4096},
    "attachments": [
        {"file_id": "f", "data_source": {"uri": "x"}, "tools": [{"type": "t", "k": 1}]}
    ],
    "trace": {"spans": [{"id": 1, "big": 2**80}]},
}


def test_unknown_fields_at_every_level_are_kept_in_place() -> None:
    message = parse_message(WITH_UNKNOWN_FIELDS)
    assert message.to_dict() == WITH_UNKNOWN_FIELDS
    assert json.loads(message.to_json()) == WITH_UNKNOWN_FIELDS
    assert parse_message(message.to_json()) == message
    assert message.tool_returns[0].tool_return[0].model_extra == {"colour": "red"}
    assert unknown_fields(message) == {
        "trace": "ToolReturnMessage has no such field",
        "tool_returns[0].duration_ms": "ToolReturn has no such field",
        "tool_returns[0].tool_return[0].colour": "TextContent has no such field",
        "tool_returns[0].tool_return[1].alt": "ImageContent has no such field",
        "tool_returns[0].tool_return[1].source.shade": "URLImage has no such field",
        "incomplete_details.tokens": "IncompleteDetails has no such field",
    }
    [decoded] = decode_records([(3, encode_record(message))])
    assert decoded.to_dict() == {**WITH_UNKNOWN_FIELDS, "seq_id": 3}


def test_unknown_fields_hint_at_the_field_they_may_misspell() -> None:
    message = parse_message(
        {
            "message_type": "user_message",
            "content": [{"txt": "a", "text": "b"}],
            "otdi": "o",
            "metdata": {},
        }
    )
    assert unknown_fields(message) == {
        "otdi": "did you mean 'otid'?",
        "metdata": "did you mean 'metadata'?",
        "content[0].txt": "did you mean 'text'?",
    }
    assert unknown_fields(UserMessage(content="x")) == {}


def test_an_unknown_field_given_as_null_is_absent() -> None:
    message = parse_message({"message_type": "user_message", "content": "x", "colour": None})
    assert message.to_dict() == {"message_type": "user_message", "content": "x"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (float("nan"), "holds a NaN or infinite"),
        ({1, 2}, "holds a set"),
        (datetime(2024, 1, 1), "holds a datetime"),
        (2**MAX_JSON_INT_BITS, "holds an integer of 4097 bits; at most 4096 are kept"),
        ({1: "x"}, "keys must be strings"),
    ],
    ids=["nan", "set", "datetime", "2**4096", "int key"],
)
def test_unknown_fields_hold_json_values_only(value: object, expected: str) -> None:
    given = {"message_type": "user_message", "content": [{"text": "a", "colour": value}]}
    with pytest.raises(
        InvalidMessage, match=rf"content\[0\]\.colour: Value error, the field {expected}"
    ):
        parse_message(given)


def test_unknown_fields_nest_at_most_max_json_depth() -> None:
    def nested(depth: int) -> object:
        value: object = "leaf"
        for _ in range(depth):
            value = [value]
        return value

    parse_message({"message_type": "user_message", "content": "x", "deep": nested(MAX_JSON_DEPTH)})
    with pytest.raises(InvalidMessage, match=rf"deep: .*nests deeper than {MAX_JSON_DEPTH}"):
        parse_message(
            {"message_type": "user_message", "content": "x", "deep": nested(MAX_JSON_DEPTH + 1)}
        )


def test_an_unknown_field_set_on_a_built_message_is_kept() -> None:
    message = UserMessage(content="x", colour="red")
    message.mood = "calm"
    assert message.to_dict() == {
        "message_type": "user_message",
        "content": "x",
        "colour": "red",
        "mood": "calm",
    }


# --- timestamps ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "2023-11-14T22:13:20Z",
        "2023-11-14T22:13:20+00:00",
        "2023-11-14T22:13:20",
        1_700_000_000,
        1_700_000_000.0,
        datetime(2023, 11, 14, 22, 13, 20),
        datetime(2023, 11, 14, 23, 13, 20, tzinfo=timezone(timedelta(hours=1))),
    ],
)
def test_timestamps_accept_iso_and_unix_seconds(value: object) -> None:
    message = UserMessage(content="x", date=value, completed_at=value, incomplete_at=value)
    expected = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    for field in (message.date, message.completed_at, message.incomplete_at):
        assert field == expected
        assert field.tzinfo is not None


def test_timestamps_dump_as_iso_8601() -> None:
    dumped = UserMessage(
        content="x", date=1_700_000_000.5, completed_at="2023-11-14T22:13:20"
    ).to_dict()
    assert dumped["date"] == "2023-11-14T22:13:20.500000Z"
    assert dumped["completed_at"] == "2023-11-14T22:13:20Z"
    assert datetime.fromisoformat(dumped["date"]) == datetime(
        2023, 11, 14, 22, 13, 20, 500000, tzinfo=UTC
    )


def test_bad_timestamp_is_named() -> None:
    with pytest.raises(InvalidMessage, match=r"completed_at: Input should be a valid datetime"):
        parse_message({"message_type": "user_message", "content": "x", "completed_at": "yesterday"})


# --- inline media -------------------------------------------------------------------------------


def _b64(size: int) -> str:
    return base64.b64encode(b"\0" * size).decode()


def _image(size: int, media_type: str = "image/png") -> dict:
    return {
        "type": "image",
        "source": {"type": "base64", "data": _b64(size), "media_type": media_type},
    }


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 1000, 3 * MiB + 1])
def test_decoded_size_is_computed_from_the_base64_length(size: int) -> None:
    encoded = _b64(size)
    assert base64_decoded_size(encoded) == size
    assert base64_decoded_size(encoded.rstrip("=")) == size  # unpadded base64 too


def test_inline_parts_are_found_everywhere_with_their_paths() -> None:
    user = parse_message(EXAMPLES["user_parts"])
    png_size = len(base64.b64decode(PNG))
    assert inline_parts(user) == [("content[2]", png_size), ("content[3]", png_size)]
    assert inline_parts(parse_message(EXAMPLES["tool_return"])) == [
        ("tool_returns[1].tool_return[1]", png_size)
    ]
    assert inline_parts(parse_message(EXAMPLES["approval_response"])) == [
        ("approvals[1].tool_return[0]", png_size)
    ]
    assert inline_media_bytes(user) == 2 * png_size
    assert inline_parts(parse_message(EXAMPLES["assistant_parts"])) == []
    assert inline_media_bytes(UserMessage(content="no media")) == 0


def test_check_inline_parts_rejects_a_part_over_the_limit() -> None:
    message = parse_message(
        {
            "message_type": "user_message",
            "content": [{"type": "text", "text": "x"}, _image(MiB), _image(6 * MiB)],
        }
    )
    with pytest.raises(
        InlineMediaTooLarge, match=r"content\[2\] is 6291456 bytes decoded.* at most 5242880 bytes"
    ) as caught:
        check_inline_parts(message, max_part_bytes=5 * MiB)
    assert isinstance(caught.value, InvalidMessage)
    check_inline_parts(message, max_part_bytes=6 * MiB)  # exactly at the limit is fine


def test_strip_inline_media_replaces_own_parts_first_to_last() -> None:
    original = parse_message(
        {
            "message_type": "user_message",
            "content": [
                _image(3 * MiB),
                {"type": "text", "text": "keep me"},
                _image(2 * MiB, "image/jpeg"),
                _image(MiB),
            ],
        }
    )
    before = copy.deepcopy(original.to_dict())

    stripped = strip_inline_media(original, bytes_to_free=4 * MiB)

    assert original.to_dict() == before  # the caller's message is untouched
    assert [type(part).__name__ for part in stripped.content] == [
        "TextContent",
        "TextContent",
        "TextContent",
        "ImageContent",
    ]
    assert (
        stripped.content[0].text
        == "[image removed: image/png, 3145728 bytes, thread inline media limit]"
    )
    assert stripped.content[1].text == "keep me"
    assert (
        stripped.content[2].text
        == "[image removed: image/jpeg, 2097152 bytes, thread inline media limit]"
    )
    assert inline_media_bytes(stripped) == MiB


def test_strip_inline_media_covers_tool_returns_and_letta_images() -> None:
    stripped = strip_inline_media(parse_message(EXAMPLES["tool_return"]), bytes_to_free=1)
    assert inline_parts(stripped) == []
    assert stripped.tool_returns[1].tool_return[1].text.startswith("[image removed: image/png")
    letta = parse_message(
        {
            "message_type": "user_message",
            "content": [
                {"type": "image", "source": {"type": "letta", "file_id": "f-1", "data": _b64(30)}}
            ],
        }
    )
    note = strip_inline_media(letta, 1).content[0].text
    assert (
        note == "[image removed: unknown media type, 30 bytes, file f-1, thread inline media limit]"
    )


def test_strip_inline_media_with_nothing_to_free_returns_the_message() -> None:
    message = parse_message(EXAMPLES["user_parts"])
    assert strip_inline_media(message, 0) is message
    assert strip_inline_media(UserMessage(content="x"), 100).to_dict() == {
        "message_type": "user_message",
        "content": "x",
    }


def test_strip_inline_media_removes_everything_when_the_budget_is_unreachable() -> None:
    message = parse_message({"message_type": "user_message", "content": [_image(10), _image(20)]})
    assert inline_parts(strip_inline_media(message, 10**9)) == []


# --- property: every message type round-trips ---------------------------------------------------

text = st.text(max_size=40)
optional_text = st.none() | text
ids = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=20)
timestamps = st.none() | st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(9999, 1, 1),
    timezones=st.just(UTC)
    | st.builds(lambda m: timezone(timedelta(minutes=m)), st.integers(-14 * 60, 14 * 60)),
)
metadata = st.none() | st.dictionaries(st.text(max_size=64), st.text(max_size=512), max_size=16)
b64_data = st.binary(max_size=64).map(lambda raw: base64.b64encode(raw).decode())
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(1 - 2**MAX_JSON_INT_BITS, 2**MAX_JSON_INT_BITS - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=12,
)

# Unknown fields, as a newer API sends them (a null one is absent, so none is null here).
unknown = st.dictionaries(
    st.sampled_from(["x_note", "trace", "colour"]),
    json_values.filter(lambda v: v is not None),
    max_size=2,
)


def _with_unknown(cls: type, **fields: st.SearchStrategy) -> st.SearchStrategy:
    return st.builds(lambda extra, **given: cls(**given, **extra), unknown, **fields)


text_parts = _with_unknown(TextContent, text=text, signature=optional_text)
image_sources = (
    st.builds(URLImage, url=text)
    | st.builds(Base64Image, data=b64_data, media_type=text, detail=optional_text)
    | st.builds(
        LettaImage,
        file_id=ids,
        data=st.none() | b64_data,
        detail=optional_text,
        media_type=optional_text,
    )
)
parts = text_parts | st.builds(ImageContent, source=image_sources)
content = text | st.lists(parts, max_size=4)
tool_call = st.builds(ToolCall, arguments=text, name=text, tool_call_id=ids)
# A delta with every field set reads back as a ToolCall (tested on its own below), so the
# generated deltas miss at least one field.
tool_call_delta = st.builds(
    ToolCallDelta, arguments=optional_text, name=optional_text, tool_call_id=optional_text
).filter(lambda delta: None in (delta.arguments, delta.name, delta.tool_call_id))
output_lines = st.none() | st.lists(text, max_size=3)
tool_return = st.builds(
    ToolReturn,
    status=st.sampled_from(["success", "error"]),
    tool_call_id=ids,
    tool_return=content,
    stdout=output_lines,
    stderr=output_lines,
)
thread_status = st.none() | st.sampled_from(["in_progress", "incomplete", "completed"])
common_fields = {
    "id": st.none() | ids,
    "date": timestamps,
    "name": optional_text,
    "otid": st.none() | ids,
    "run_id": optional_text,
    "step_id": optional_text,
    "sender_id": optional_text,
    "seq_id": st.none() | st.integers(1, 2**53),
    "is_err": st.none() | st.booleans(),
    "incomplete_details": st.none() | st.builds(IncompleteDetails, reason=text),
    "completed_at": timestamps,
    "incomplete_at": timestamps,
    "attachments": st.none()
    | st.lists(
        st.builds(
            Attachment,
            file_id=st.none() | ids,
            tools=st.none() | st.lists(st.builds(AttachmentTool, type=text), max_size=2),
        ),
        max_size=2,
    ),
    "assistant_id": optional_text,
    "metadata": metadata,
}


def _message(cls: type, **fields: st.SearchStrategy) -> st.SearchStrategy:
    return _with_unknown(cls, **{**common_fields, "status": thread_status, **fields})


messages = st.one_of(
    _message(SystemMessage, content=text),
    _message(UserMessage, content=content),
    _message(
        ReasoningMessage,
        reasoning=text,
        source=st.sampled_from(["reasoner_model", "non_reasoner_model"]),
        signature=optional_text,
    ),
    _message(
        HiddenReasoningMessage,
        state=st.sampled_from(["redacted", "omitted"]),
        hidden_reasoning=optional_text,
    ),
    _message(
        ToolCallMessage,
        tool_call=tool_call | tool_call_delta,
        tool_calls=st.none() | st.lists(tool_call, max_size=3) | tool_call_delta,
    ),
    _message(
        ToolReturnMessage,
        status=st.sampled_from(["success", "error"]),
        tool_call_id=ids,
        tool_return=text,
        stdout=output_lines,
        stderr=output_lines,
        tool_returns=st.none() | st.lists(tool_return, max_size=3),
    ),
    _message(AssistantMessage, content=text | st.lists(text_parts, max_size=3)),
    _message(
        ApprovalRequestMessage,
        tool_call=tool_call | tool_call_delta,
        tool_calls=st.none() | st.lists(tool_call, max_size=3),
    ),
    _message(
        ApprovalResponseMessage,
        approval_request_id=st.none() | ids,
        approvals=st.none()
        | st.lists(
            st.builds(ApprovalReturn, approve=st.booleans(), tool_call_id=ids, reason=optional_text)
            | tool_return,
            max_size=3,
        ),
        approve=st.none() | st.booleans(),
        reason=optional_text,
    ),
    _message(
        SummaryMessage,
        summary=text,
        compaction_stats=st.none()
        | st.builds(
            CompactionStats,
            context_window=st.integers(0, 2**31),
            messages_count_after=st.integers(0, 10**6),
            messages_count_before=st.integers(0, 10**6),
            trigger=text,
            context_tokens_after=st.none() | st.integers(0, 2**31),
            context_tokens_before=st.none() | st.integers(0, 2**31),
        ),
    ),
    _message(
        EventMessage,
        event_type=st.just("compaction"),
        event_data=st.dictionaries(text, json_values, max_size=4),
    ),
)


@settings(max_examples=300, deadline=None)
@given(message=messages, sequence=st.integers(1, 2**53), turn_id=st.none() | ids)
def test_every_message_round_trips_through_dict_json_and_record(
    message, sequence: int, turn_id: str | None
) -> None:
    as_dict = message.to_dict()
    assert parse_message(as_dict) == message
    assert parse_message(message.to_json()) == message
    assert parse_message(as_dict).to_dict() == as_dict
    assert MESSAGE_ADAPTER.validate_json(message.to_json()) == message

    [decoded] = decode_records([(sequence, encode_record(message, turn_id))])
    assert decoded == message.model_copy(update={"seq_id": sequence})
    assert decoded.to_dict() == {**as_dict, "seq_id": sequence}
