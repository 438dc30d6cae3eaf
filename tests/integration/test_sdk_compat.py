"""What the official SDKs build stores as is and reads back as built, on the real servers.

The Letta SDK (`letta-client`) builds every list-API message type; each is dumped with each of
its serializers, appended, read back (a page and `get`), and compared with the SDK's object field
by field (`seq_id` aside). The OpenAI SDK's own thread `Message` validates `to_thread_message()`.
Both SDKs come with the `test` extra.
"""

from __future__ import annotations

import io
import json
import typing
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from letta_client.types import ToolReturnMessage as LettaToolReturnMessage
from letta_client.types import agents as letta
from letta_client.types.agents import LettaAssistantMessageContentUnion as LettaAssistantText
from letta_client.types.agents.image_content import (
    SourceBase64Image,
    SourceLettaImage,
    SourceURLImage,
)
from letta_client.types.agents.summary_message import CompactionStats as LettaCompactionStats
from openai.types.beta.threads import Message as OpenAIThreadMessage
from openai.types.chat import ChatCompletionUserMessageParam
from pydantic import BaseModel, TypeAdapter

from kvstore import MessageStore, StoreConfig, errors
from kvstore.cli import backup
from kvstore.messages import INCOMPLETE_REASONS, MAX_JSON_INT_BITS, parse_message

pytestmark = pytest.mark.usefixtures("server_only")  # on the real servers: Valkey and Redis

LETTA_MESSAGE: TypeAdapter[Any] = TypeAdapter(letta.Message)
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
BIG = 2**70


def _common(n: int, **more: Any) -> dict[str, Any]:
    return {
        "id": f"message-sdk-{n}",
        "date": datetime(2024, 5, 1, 12, 0, n, 250_000, tzinfo=UTC),
        **more,
    }


def letta_messages(unknown: bool) -> list[BaseModel]:
    """One message of each of the eleven types the Letta SDK builds, several of them twice (with
    and without the optional `type` of parts, sources and approval items). With `unknown`, each
    level also holds a field the SDK does not declare, as a newer server would send it."""
    x = (lambda **fields: fields) if unknown else (lambda **fields: {})
    text = letta.TextContent(text="look", signature="sig-1", **x(colour="red"))
    typed_text = letta.TextContent(text="typed", type="text")
    url = letta.ImageContent(source=SourceURLImage(url="https://example.com/a.png", **x(shade=2)))
    b64 = letta.ImageContent(
        source=SourceBase64Image(data=PNG, media_type="image/png", detail="high", type="base64"),
        type="image",
        **x(alt="a pixel"),
    )
    file = letta.ImageContent(source=SourceLettaImage(file_id="file-1", media_type="image/png"))
    call = letta.ToolCall(
        arguments='{"city": "Oslo"}', name="weather", tool_call_id="call-1", **x(index=0)
    )
    delta = letta.ToolCallDelta(name="weather", **x(index=1))
    tool_return = letta.ToolReturn(
        status="error",
        tool_call_id="call-2",
        tool_return=[text, url],
        stdout=["a"],
        stderr=["b"],
        **x(duration_ms=12),
    )
    return [
        letta.SystemMessage(
            **_common(1), content="You are helpful.", message_type="system_message", **x(priority=1)
        ),
        letta.UserMessage(
            **_common(2),
            content="hi",
            message_type="user_message",
            otid="o-2",
            name="alice",
            run_id="run-1",
            step_id="step-1",
            sender_id="u-1",
            is_err=False,
            **x(mood={"calm": True, "n": BIG}),
        ),
        letta.UserMessage(
            **_common(3), content=[text, typed_text, url, b64, file], message_type="user_message"
        ),
        letta.ReasoningMessage(
            **_common(4),
            reasoning="a forecast question",
            message_type="reasoning_message",
            **x(effort="high"),
        ),
        letta.ReasoningMessage(
            **_common(5),
            reasoning="r",
            source="non_reasoner_model",
            signature="rs",
            message_type="reasoning_message",
        ),
        letta.HiddenReasoningMessage(
            **_common(6),
            state="redacted",
            hidden_reasoning="opaque",
            message_type="hidden_reasoning_message",
        ),
        letta.ToolCallMessage(
            **_common(7), tool_call=call, tool_calls=[call], message_type="tool_call_message"
        ),
        letta.ToolCallMessage(
            **_common(8), tool_call=delta, tool_calls=delta, message_type="tool_call_message"
        ),
        LettaToolReturnMessage(
            **_common(9),
            status="success",
            tool_call_id="call-1",
            tool_return="cloudy",
            stdout=["ok"],
            tool_returns=[
                tool_return,
                letta.ToolReturn(
                    status="success", tool_call_id="call-3", tool_return="x", type="tool"
                ),
            ],
            message_type="tool_return_message",
        ),
        letta.AssistantMessage(
            **_common(10), content="Cloudy, 4 °C.", message_type="assistant_message"
        ),
        letta.AssistantMessage(
            **_common(11),
            message_type="assistant_message",
            content=[
                LettaAssistantText(text="Cloudy", signature="s", **x(colour="grey")),
                LettaAssistantText(text="and 4 °C", type="text"),
            ],
        ),
        letta.ApprovalRequestMessage(
            **_common(12),
            tool_call=call,
            tool_calls=[call],
            message_type="approval_request_message",
        ),
        letta.ApprovalResponseMessage(
            **_common(13),
            approval_request_id="message-sdk-12",
            approve=False,
            reason="no",
            approvals=[
                letta.ApprovalReturn(
                    approve=False, tool_call_id="call-1", reason="no", **x(reviewer="bob")
                ),
                letta.ApprovalReturn(approve=True, tool_call_id="call-4", type="approval"),
                tool_return,
            ],
            message_type="approval_response_message",
        ),
        letta.SummaryMessage(
            **_common(14),
            summary="They talked about Oslo.",
            compaction_stats=LettaCompactionStats(
                context_window=128_000,
                messages_count_after=3,
                messages_count_before=90,
                trigger="context_window_exceeded",
                context_tokens_before=120_000,
                **x(model="m-1"),
            ),
            message_type="summary_message",
        ),
        letta.EventMessage(
            **_common(15),
            event_type="compaction",
            message_type="event_message",
            event_data={
                "removed": [1, 2.5, None, True],
                "big": BIG,
                "small": -(2**100),
                "nested": {"a": {}},
            },
        ),
    ]


SERIALIZERS: dict[str, Callable[[BaseModel], Any]] = {
    "model_dump": lambda m: m.model_dump(),
    "model_dump exclude_none": lambda m: m.model_dump(exclude_none=True),
    "model_dump json": lambda m: m.model_dump(mode="json"),
    "model_dump json exclude_none": lambda m: m.model_dump(mode="json", exclude_none=True),
    "model_dump_json": lambda m: m.model_dump_json(),
    "model_dump_json exclude_none": lambda m: m.model_dump_json(exclude_none=True),
    "to_dict": lambda m: m.to_dict(),
    "to_dict json": lambda m: m.to_dict(mode="json"),
    "to_dict all fields": lambda m: m.to_dict(exclude_unset=False),
    "to_json": lambda m: m.to_json(),
    "to_json all fields": lambda m: m.to_json(exclude_unset=False, indent=None),
}


def test_every_type_the_sdk_builds_is_covered() -> None:
    members = typing.get_args(typing.get_args(letta.Message)[0])  # the union's eleven classes
    assert len(members) == 11
    assert {type(m) for m in letta_messages(unknown=True)} == set(members)
    assert {m.message_type for m in letta_messages(unknown=False)} == set(
        typing.get_args(letta.MessageType)
    )


def assert_same_fields(built: Any, stored: Any, path: str = "") -> None:
    """`stored` (kvstore's list-API JSON) holds exactly what the SDK object `built` holds.

    A `null` field of the SDK is absent from `stored`, except an optional `type` literal: kvstore
    writes the one value the SDK declares for it (the shape allows no other).
    """
    if isinstance(built, BaseModel):
        assert isinstance(stored, dict), path
        fields = {
            **{name: getattr(built, name) for name in type(built).model_fields},
            **(built.model_extra or {}),
        }
        expected_keys = set()
        for name, value in fields.items():
            where = f"{path}.{name}" if path else name
            if name == "seq_id":
                continue
            if value is None and name == "type":
                (literal,) = typing.get_args(type(built).model_fields["type"].annotation)[:1]
                assert stored.get("type") == typing.get_args(literal)[0], where
                expected_keys.add(name)
            elif value is None:
                assert name not in stored, where
            else:
                assert name in stored, where
                assert_same_fields(value, stored[name], where)
                expected_keys.add(name)
        assert set(stored) - {"seq_id"} == expected_keys, path
    elif isinstance(built, list):
        assert isinstance(stored, list) and len(stored) == len(built), path
        for index, (a, b) in enumerate(zip(built, stored, strict=True)):
            assert_same_fields(a, b, f"{path}[{index}]")
    elif isinstance(built, datetime):
        assert datetime.fromisoformat(stored) == built, path
        assert stored == TypeAdapter(datetime).dump_python(built, mode="json"), path
    else:
        assert stored == built and type(stored) is type(built), path


@pytest.mark.parametrize("unknown", [False, True], ids=["declared fields", "unknown fields too"])
@pytest.mark.parametrize("serializer", SERIALIZERS)
def test_letta_sdk_messages_store_and_read_back_field_by_field(make_thread, serializer, unknown):
    built = letta_messages(unknown)
    thread = make_thread()
    stored = thread.append([SERIALIZERS[serializer](m) for m in built])
    page = thread.list(limit=100).messages
    assert [m.seq_id for m in page] == list(range(1, len(built) + 1))
    for original, returned, read in zip(built, stored, page, strict=True):
        assert read == returned
        assert read == thread.get(original.id)
        assert_same_fields(original, read.to_dict())
        assert_same_fields(original, json.loads(read.to_json()))
        # And the SDK reads kvstore's output back as the same type, with the same fields.
        again = LETTA_MESSAGE.validate_python(read.to_dict())
        assert type(again) is type(original)
        assert_same_fields(original, again.model_dump(mode="json", exclude_none=True))


def test_letta_sdk_null_literals_are_absent_and_no_reasoning_source_is_invented(make_thread):
    reasoning = letta.ReasoningMessage(
        **_common(1), reasoning="r", message_type="reasoning_message"
    )
    user = letta.UserMessage(
        **_common(2),
        message_type="user_message",
        content=[letta.TextContent(text="a"), letta.ImageContent(source=SourceURLImage(url="u"))],
    )
    dumped = [reasoning.model_dump(mode="json"), user.model_dump(mode="json")]
    assert dumped[0]["source"] is None and dumped[1]["content"][0]["type"] is None
    thread = make_thread()
    thread.append(dumped)
    read_reasoning, read_user = thread.list().messages
    assert read_reasoning.source is None and "source" not in read_reasoning.to_dict()
    assert read_user.to_dict()["content"] == [
        {"type": "text", "text": "a"},
        {"type": "image", "source": {"type": "url", "url": "u"}},
    ]


def keyspace(raw_client, namespace: str) -> dict[bytes, bytes]:
    return {key: raw_client.dump(key) for key in raw_client.scan_iter(match=f"{namespace}:*")}


def test_a_letta_message_built_without_message_type_is_refused_by_name(
    make_thread, raw_client, namespace
):
    thread = make_thread()
    thread.append(letta_messages(unknown=False)[0].model_dump())
    before = keyspace(raw_client, namespace)
    untyped = letta.UserMessage(**_common(20), content="hi")  # message_type=None
    for serializer in ("model_dump", "model_dump_json", "to_dict"):
        with pytest.raises(errors.InvalidMessage, match=r"message_type: missing or null; it names"):
            thread.append(SERIALIZERS[serializer](untyped))
    assert keyspace(raw_client, namespace) == before


def test_letta_sdk_messages_survive_export_and_import(server, namespace):
    built = letta_messages(unknown=True)
    source = MessageStore.from_url(server.url, StoreConfig(namespace=namespace))
    target = MessageStore.from_url(server.url, StoreConfig(namespace=namespace + "r"))
    try:
        source.thread("letta").append([m.model_dump(mode="json") for m in built])
        text = io.StringIO()
        backup.export(source, "letta", text, progress_out=io.StringIO())
        assert "1180591620717411303424" in text.getvalue()  # 2**70, exactly, in the JSON lines
        backup.import_lines(
            target, "letta", io.StringIO(text.getvalue()), progress_out=io.StringIO()
        )
        for original, read in zip(
            built, target.thread("letta").list(limit=100).messages, strict=True
        ):
            assert_same_fields(original, read.to_dict())
    finally:
        source.close()
        target.close()


# --- unknown fields ---------------------------------------------------------------------------


def test_strict_store_refuses_unknown_fields_by_path_and_writes_nothing(
    make_thread, raw_client, namespace
):
    thread = make_thread(unknown_fields="refuse")
    thread.append(letta_messages(unknown=False)[0].model_dump())
    before = keyspace(raw_client, namespace)
    built = {m.id: m for m in letta_messages(unknown=True)}
    cases = {
        "message-sdk-2": ["mood (UserMessage has no such field)"],
        "message-sdk-3": [
            "content[0].colour (TextContent has no such field)",
            "content[2].source.shade (URLImage has no such field)",
            "content[3].alt (ImageContent has no such field)",
        ],
        "message-sdk-7": [
            "tool_call.index (ToolCall has no such field)",
            "tool_calls[0].index (ToolCall has no such field)",
        ],
        "message-sdk-8": [
            "tool_call.index (ToolCallDelta has no such field)",
            "tool_calls.index (ToolCallDelta has no such field)",
        ],
        "message-sdk-9": [
            "tool_returns[0].duration_ms (ToolReturn has no such field)",
            "tool_returns[0].tool_return[0].colour (TextContent has no such field)",
            "tool_returns[0].tool_return[1].source.shade (URLImage has no such field)",
        ],
        "message-sdk-13": [
            "approvals[0].reviewer (ApprovalReturn has no such field)",
            "approvals[2].duration_ms (ToolReturn has no such field)",
            "approvals[2].tool_return[0].colour (TextContent has no such field)",
            "approvals[2].tool_return[1].source.shade (URLImage has no such field)",
        ],
        "message-sdk-14": ["compaction_stats.model (CompactionStats has no such field)"],
    }
    for message_id, expected in cases.items():
        message = built[message_id].model_dump(mode="json")
        with pytest.raises(errors.UnknownField) as caught:
            thread.append([letta_messages(unknown=False)[1].model_dump(), message])
        assert isinstance(caught.value, errors.InvalidMessage)
        assert caught.value.http_status == 422
        assert "; ".join(expected) in str(caught.value)
        assert caught.value.fields == [item.split(" (")[0] for item in expected]
        assert str(caught.value).startswith("message 1 (")
    assert keyspace(raw_client, namespace) == before


def test_strict_store_names_a_misspelling_and_takes_the_sdks_nulls(
    make_thread, raw_client, namespace
):
    thread = make_thread(unknown_fields="refuse")
    thread.append([m.model_dump() for m in letta_messages(unknown=False)])  # nulls are not unknown
    before = keyspace(raw_client, namespace)
    with pytest.raises(errors.UnknownField, match=r"otdi \(did you mean 'otid'\?\)"):
        thread.append({"message_type": "user_message", "content": "x", "otdi": "o-9"})
    assert keyspace(raw_client, namespace) == before
    # The same message in a keeping store is stored with its misspelt field, as given.
    kept = make_thread("keeping")
    (stored,) = kept.append({"message_type": "user_message", "content": "x", "otdi": "o-9"})
    assert kept.get(stored.id).to_dict()["otdi"] == "o-9"
    assert stored.otid is None


def test_an_attachments_own_keys_are_not_unknown(make_thread):
    thread = make_thread(unknown_fields="refuse")
    attachment = {
        "data_source": {"uri": "azureml://x", "type": "uri_asset"},
        "tools": [{"type": "file_search", "vector_store": "vs-1"}],
    }
    (stored,) = thread.append(
        {"message_type": "user_message", "content": "x", "attachments": [attachment]}
    )
    assert thread.get(stored.id).to_dict()["attachments"] == [attachment]


def test_unknown_fields_count_toward_the_message_size_limit(make_thread, raw_client, namespace):
    limit = 4096
    thread = make_thread(max_message_bytes=limit)
    base = {"message_type": "user_message", "content": "x" * 3000}
    thread.append(base)
    before = keyspace(raw_client, namespace)
    with pytest.raises(
        errors.MessageTooLarge, match=r"encodes to \d+ bytes; max_message_bytes is 4096"
    ):
        thread.append(
            {**base, "content": [{"type": "text", "text": "x" * 3000, "note": "y" * 1500}]}
        )
    with pytest.raises(errors.MessageTooLarge):
        thread.append({**base, "colour": {"deep": ["y" * 1500]}})
    assert keyspace(raw_client, namespace) == before
    assert thread.stats().stored_bytes < limit


# --- integers beyond 64 bits ------------------------------------------------------------------


def test_integers_beyond_64_bits_round_trip_exactly(make_thread):
    values = {
        "u64": 2**64 - 1,
        "i64": -(2**63),
        "past": 2**64,
        "below": -(2**63) - 1,
        "big": 2**MAX_JSON_INT_BITS - 1,
        "small": 1 - 2**MAX_JSON_INT_BITS,
        "list": [BIG, -BIG],
    }
    thread = make_thread()
    (stored,) = thread.append(
        {
            "message_type": "event_message",
            "event_type": "compaction",
            "event_data": values,
            "extra_count": -(2**100),
        }
    )
    read = thread.get(stored.id)
    assert read.event_data == values
    assert read.to_dict()["extra_count"] == -(2**100)
    assert parse_message(read.to_json()) == read  # and through JSON text


def test_an_integer_past_the_bound_is_refused_saying_why(make_thread, raw_client, namespace):
    thread = make_thread()
    thread.append({"message_type": "user_message", "content": "x"})
    before = keyspace(raw_client, namespace)
    too_big = 2**MAX_JSON_INT_BITS
    for message in (
        {"message_type": "event_message", "event_type": "compaction", "event_data": {"n": too_big}},
        {"message_type": "user_message", "content": "x", "n": [too_big]},
    ):
        with pytest.raises(errors.InvalidMessage, match=r"an integer of 4097 bits; at most 4096"):
            thread.append(message)
    assert keyspace(raw_client, namespace) == before


# --- OpenAI -----------------------------------------------------------------------------------


def test_an_openai_chat_message_is_refused_pointing_at_the_converter(
    make_thread, raw_client, namespace
):
    thread = make_thread()
    thread.append({"message_type": "user_message", "content": "x"})
    before = keyspace(raw_client, namespace)
    chat: ChatCompletionUserMessageParam = {"role": "user", "content": "hi"}
    for given in (
        chat,
        [{"message_type": "user_message", "content": "ok"}, chat],
        {"role": "assistant", "content": None, "tool_calls": []},
    ):
        with pytest.raises(errors.RoleBasedMessage) as caught:
            thread.append(given)
        text = str(caught.value)
        assert "looks like an OpenAI chat message" in text
        assert "kvstore.convert.from_chat_completions(" in text
        assert isinstance(caught.value, errors.InvalidMessage) and caught.value.http_status == 422
    assert keyspace(raw_client, namespace) == before
    with pytest.raises(errors.RoleBasedMessage, match=r"role 'user'"):
        parse_message(json.dumps(chat))


def thread_fields(**more: Any) -> dict[str, Any]:
    return {
        "status": "incomplete",
        "incomplete_details": {"reason": "max_tokens"},
        "completed_at": "2024-05-01T12:00:05.900Z",
        "incomplete_at": 1_714_564_806,
        "attachments": [
            {"file_id": "file-9", "tools": [{"type": "code_interpreter"}, {"type": "file_search"}]}
        ],
        "assistant_id": "asst-1",
        "run_id": "run-1",
        "metadata": {"tenant": "acme"},
        **more,
    }


def test_thread_messages_validate_as_openais_own_model(make_thread):
    thread = make_thread()
    user, _assistant, bare = thread.append(
        [
            {
                "message_type": "user_message",
                **thread_fields(),
                "content": [
                    {"type": "text", "text": "this chart"},
                    {
                        "type": "image",
                        "source": {"type": "url", "url": "https://x/c.png", "detail": "low"},
                    },
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "data": PNG,
                            "media_type": "image/png",
                            "detail": "ultra",
                        },
                    },
                    {
                        "type": "image",
                        "source": {"type": "letta", "file_id": "file-1", "detail": "high"},
                    },
                ],
            },
            {
                "message_type": "assistant_message",
                **thread_fields(status="completed", incomplete_details=None),
                "content": "Cloudy.",
                "date": "2024-05-01T12:00:00.750+02:00",
            },
            {"message_type": "user_message", "content": "plain"},
        ]
    )
    read_user, read_assistant, read_bare = thread.list().messages

    shape = read_user.to_thread_message("thread-42")
    model = OpenAIThreadMessage.model_validate(shape)
    assert model.object == "thread.message" and model.role == "user"
    assert model.thread_id == "thread-42" and model.id == user.id
    assert model.created_at == int(user.date.timestamp())
    assert model.completed_at == 1_714_564_805  # 12:00:05.900 UTC, sub-seconds cut
    assert model.incomplete_at == 1_714_564_806
    assert model.status == "incomplete" and model.incomplete_details.reason == "max_tokens"
    assert model.assistant_id == "asst-1" and model.run_id == "run-1"
    assert model.metadata == {"tenant": "acme"}
    assert [tool.type for tool in model.attachments[0].tools] == ["code_interpreter", "file_search"]
    text, url, b64, file = model.content
    assert text.type == "text" and text.text.value == "this chart" and text.text.annotations == []
    assert url.type == "image_url" and url.image_url.url == "https://x/c.png"
    assert url.image_url.detail == "low"
    assert b64.image_url.url == f"data:image/png;base64,{PNG}" and b64.image_url.detail is None
    assert file.type == "image_file" and file.image_file.file_id == "file-1"
    assert file.image_file.detail == "high"
    assert json.loads(json.dumps(shape)) == shape  # plain JSON values

    model = OpenAIThreadMessage.model_validate(read_assistant.to_thread_message("thread-42"))
    assert model.role == "assistant" and model.content[0].text.value == "Cloudy."
    assert model.created_at == int(datetime(2024, 5, 1, 10, 0, tzinfo=UTC).timestamp())
    model = OpenAIThreadMessage.model_validate(read_bare.to_thread_message("t"))
    assert model.status == "completed" and model.completed_at is None
    assert model.created_at == int(bare.date.timestamp())

    # The list API's shape stays the default: ISO 8601 strings.
    assert read_user.to_dict()["completed_at"] == "2024-05-01T12:00:05.900000Z"
    assert read_user.to_dict()["incomplete_at"] == "2024-05-01T12:00:06Z"


def test_the_thread_shape_refuses_what_openai_cannot_carry(make_thread):
    thread = make_thread()
    odd, reasoning = thread.append(
        [
            {
                "message_type": "user_message",
                "content": "x",
                "status": "incomplete",
                "incomplete_details": {"reason": "user_left"},
            },
            {"message_type": "reasoning_message", "reasoning": "r"},
        ]
    )
    # Any reason is stored (an API may add one); OpenAI's thread shape allows five.
    assert thread.get(odd.id).incomplete_details.reason == "user_left"
    with pytest.raises(
        errors.InvalidMessage, match=r"reason 'user_left' has no OpenAI .*max_tokens"
    ):
        odd.to_thread_message("t")
    with pytest.raises(errors.InvalidMessage, match=r"a reasoning_message has no OpenAI thread"):
        reasoning.to_thread_message("t")
    for reason in INCOMPLETE_REASONS:
        message = parse_message({**odd.to_dict(), "incomplete_details": {"reason": reason}})
        shape = OpenAIThreadMessage.model_validate(message.to_thread_message("t"))
        assert shape.incomplete_details.reason == reason
    tool = parse_message(
        {
            **odd.to_dict(),
            "incomplete_details": None,
            "attachments": [{"file_id": "f", "tools": [{"type": "web_search"}]}],
        }
    )
    with pytest.raises(errors.InvalidMessage, match=r"attachment tool 'web_search' has no OpenAI"):
        tool.to_thread_message("t")
    unsent = parse_message({"message_type": "user_message", "content": "x"})
    with pytest.raises(errors.InvalidMessage, match=r"has no id: a thread message needs both"):
        unsent.to_thread_message("t")


def test_openai_unix_seconds_are_taken_as_given(make_thread):
    # OpenAI's thread messages carry unix seconds: they are valid kvstore timestamps as they are.
    thread = make_thread()
    (stored,) = thread.append(
        {
            "message_type": "user_message",
            "content": "x",
            "completed_at": 1_714_564_805,
            "incomplete_at": 1_714_564_806.5,
        }
    )
    read = thread.get(stored.id)
    assert read.completed_at == datetime(2024, 5, 1, 12, 0, 5, tzinfo=UTC)
    assert read.incomplete_at == datetime(2024, 5, 1, 12, 0, 6, 500_000, tzinfo=UTC)
    assert read.incomplete_at.utcoffset() == timedelta(0)
    assert (
        read.model_copy(
            update={
                "completed_at": datetime(2024, 5, 1, 14, 0, 5, tzinfo=timezone(timedelta(hours=2)))
            }
        ).to_thread_message("t")["completed_at"]
        == 1_714_564_805
    )
