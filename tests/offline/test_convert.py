"""kvstore messages to and from the OpenAI APIs' shapes, checked with the OpenAI SDK's own types:
what to_chat_completions / to_responses_input make validates as ChatCompletionMessageParam /
ResponseInputItemParam with nothing dropped, and role-based messages come in as kvstore messages
that a thread stores and gives back."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam
from pydantic import TypeAdapter

from kvstore import (
    ApprovalRequestMessage,
    ApprovalResponseMessage,
    AssistantMessage,
    EventMessage,
    HiddenReasoningMessage,
    MessageStore,
    ReasoningMessage,
    StoreConfig,
    SummaryMessage,
    SystemMessage,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
    errors,
)
from kvstore.convert import (
    DENIED_TEXT,
    SUMMARY_PREFIX,
    from_chat_completions,
    to_chat_completions,
    to_responses_input,
)
from kvstore.importers import append_missing

CHAT = TypeAdapter(list[ChatCompletionMessageParam])
RESPONSES = TypeAdapter(list[ResponseInputItemParam])
PNG = "iVBORw0KGgo="


def plain(value):
    """A validated value with the SDK's Iterable fields (lazy validators) made lists."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return value
    return [plain(item) for item in value]


def checked_chat(items):
    """The items, validated by the SDK's TypedDicts; equal after validation, so no key was
    unknown to them (a TypedDict drops what it does not declare)."""
    assert plain(CHAT.validate_python(items)) == items
    return items


def checked_responses(items):
    assert plain(RESPONSES.validate_python(items)) == items
    return items


def call(n: int, name: str = "weather") -> ToolCall:
    return ToolCall(name=name, arguments=f'{{"n": {n}}}', tool_call_id=f"call-{n}")


def conversation():
    return [
        SummaryMessage(summary="The user asked about Oslo."),
        SystemMessage(content="Be brief.", name="ops"),
        UserMessage(
            content=[
                {"type": "text", "text": "This chart, and"},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/c.png"}},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "data": PNG,
                        "media_type": "image/png",
                        "detail": "low",
                    },
                },
                {"type": "image", "source": {"type": "letta", "file_id": "file-9"}},
            ],
            name="ann",
        ),
        ReasoningMessage(reasoning="Two lookups.", step_id="s1"),
        AssistantMessage(content="Looking both up.", step_id="s1"),
        HiddenReasoningMessage(state="redacted", step_id="s1"),
        ToolCallMessage(tool_call=call(1), step_id="s1"),
        ToolCallMessage(tool_call=call(2), step_id="s1"),
        ToolReturnMessage(status="success", tool_call_id="call-1", tool_return="4 °C"),
        ToolReturnMessage(status="error", tool_call_id="call-2", tool_return="timeout"),
        ToolCallMessage(tool_call=call(3), tool_calls=[call(3), call(4)], step_id="s2"),
        ToolReturnMessage(
            status="success",
            tool_call_id="call-3",
            tool_return="x",
            tool_returns=[
                {"status": "success", "tool_call_id": "call-3", "tool_return": "three"},
                {
                    "status": "success",
                    "tool_call_id": "call-4",
                    "tool_return": [
                        {"type": "text", "text": "four"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "data": PNG, "media_type": "image/png"},
                        },
                    ],
                },
            ],
        ),
        EventMessage(event_type="compaction", event_data={"n": 1}),
        ApprovalRequestMessage(id="message-req", tool_call=call(5, "pay")),
        ApprovalResponseMessage(
            approval_request_id="message-req", approve=False, reason="too much"
        ),
        ApprovalRequestMessage(
            id="message-req-2",
            tool_call=call(6, "pay"),
            tool_calls=[call(6, "pay"), call(7, "pay")],
        ),
        ApprovalResponseMessage(
            approvals=[
                {"approve": True, "tool_call_id": "call-6"},
                {"approve": False, "tool_call_id": "call-7"},
            ]
        ),
        ToolReturnMessage(status="success", tool_call_id="call-6", tool_return="paid"),
        AssistantMessage(
            content=[{"type": "text", "text": "Done."}, {"type": "text", "text": " Bye."}]
        ),
        ToolCallMessage(tool_call={"name": "half"}),  # still streaming: no model input
    ]


def test_to_chat_completions_validates_with_the_sdk_and_groups_steps():
    chat = checked_chat(to_chat_completions(conversation()))
    assert [m["role"] for m in chat] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert chat[0]["content"] == SUMMARY_PREFIX + "The user asked about Oslo."
    assert chat[1] == {"role": "system", "content": "Be brief.", "name": "ops"}
    assert chat[2]["content"] == [
        {"type": "text", "text": "This chart, and"},
        {"type": "image_url", "image_url": {"url": "https://example.com/c.png"}},
        {
            "type": "image_url",
            "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "low"},
        },
        {"type": "text", "text": "[image: file file-9]"},
    ]
    # one assistant step: its text and both calls, reasoning left out
    assert chat[3] == {
        "role": "assistant",
        "content": "Looking both up.",
        "tool_calls": [
            {
                "id": "call-1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"n": 1}'},
            },
            {
                "id": "call-2",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"n": 2}'},
            },
        ],
    }
    assert chat[4] == {"role": "tool", "tool_call_id": "call-1", "content": "4 °C"}
    assert [c["id"] for c in chat[6]["tool_calls"]] == ["call-3", "call-4"] and chat[6][
        "content"
    ] is None
    assert chat[8] == {
        "role": "tool",
        "tool_call_id": "call-4",
        "content": [
            {"type": "text", "text": "four"},
            {"type": "text", "text": "[image: image/png]"},
        ],
    }
    assert chat[10] == {
        "role": "tool",
        "tool_call_id": "call-5",
        "content": f"{DENIED_TEXT} Reason: too much",
    }
    assert [c["id"] for c in chat[11]["tool_calls"]] == ["call-6", "call-7"]
    assert chat[12] == {"role": "tool", "tool_call_id": "call-7", "content": DENIED_TEXT}
    assert chat[13] == {"role": "tool", "tool_call_id": "call-6", "content": "paid"}
    assert chat[14]["content"] == [
        {"type": "text", "text": "Done."},
        {"type": "text", "text": " Bye."},
    ]
    # every tool call is answered, as the API requires
    asked = [c["id"] for m in chat if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    assert sorted(asked) == sorted(m["tool_call_id"] for m in chat if m["role"] == "tool")


def test_steps_split_where_the_step_ids_differ():
    chat = checked_chat(
        to_chat_completions(
            [
                ToolCallMessage(tool_call=call(1), step_id="a"),
                ToolCallMessage(tool_call=call(2), step_id="b"),
                AssistantMessage(content="text"),
                AssistantMessage(content="more"),
            ],
            system_role="developer",
        )
    )
    assert [len(m.get("tool_calls", [])) for m in chat] == [1, 1, 0, 0]
    assert [m["content"] for m in chat[2:]] == ["text", "more"]
    assert (
        to_chat_completions([SystemMessage(content="x")], system_role="developer")[0]["role"]
        == "developer"
    )


def test_to_responses_input_validates_with_the_sdk():
    items = checked_responses(to_responses_input(conversation()))
    kinds = [(i["type"], i.get("role")) for i in items]
    assert kinds[:3] == [("message", "system"), ("message", "system"), ("message", "user")]
    assert items[2]["content"] == [
        {"type": "input_text", "text": "This chart, and"},
        {"type": "input_image", "detail": "auto", "image_url": "https://example.com/c.png"},
        {"type": "input_image", "detail": "low", "image_url": f"data:image/png;base64,{PNG}"},
        {"type": "input_image", "detail": "auto", "file_id": "file-9"},
    ]
    assert items[3] == {"type": "message", "role": "assistant", "content": "Looking both up."}
    calls = [i for i in items if i["type"] == "function_call"]
    assert [c["call_id"] for c in calls] == [
        "call-1",
        "call-2",
        "call-3",
        "call-4",
        "call-5",
        "call-6",
        "call-7",
    ]
    outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    assert outputs["call-4"][1] == {
        "type": "input_image",
        "detail": "auto",
        "image_url": f"data:image/png;base64,{PNG}",
    }
    assert outputs["call-5"] == f"{DENIED_TEXT} Reason: too much" and outputs["call-6"] == "paid"
    assert items[-1] == {"type": "message", "role": "assistant", "content": "Done.\n Bye."}
    assert not any(i["type"] == "reasoning" for i in items)


def test_from_chat_completions_stores_what_a_client_sends():
    request = [
        {"role": "developer", "content": "Be brief."},
        {"role": "system", "content": [{"type": "text", "text": "Use metric units."}]},
        {"role": "user", "content": "hi", "name": "ann"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {
                    "type": "image_url",
                    "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "high"},
                },
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": "{}"},
                },
                {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4 °C"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "noon"}]},
        ChatCompletionMessage(role="assistant", content="Cloudy."),  # the SDK's own response model
    ]
    checked_chat([r for r in request if isinstance(r, dict)])
    messages = from_chat_completions(request, id_prefix="conv-1")
    assert [m.message_type for m in messages] == [
        "system_message",
        "system_message",
        "user_message",
        "user_message",
        "assistant_message",
        "tool_call_message",
        "tool_call_message",
        "tool_return_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert messages[2].name == "ann" and messages[3].content[1].source.media_type == "image/png"
    assert (
        messages[3].content[1].source.detail == "high"
        and messages[3].content[2].source.url == "https://example.com/a.png"
    )
    assert len({m.step_id for m in messages[4:7]}) == 1 and messages[7].tool_return == "4 °C"
    assert messages[8].tool_return == "noon"
    # the same input makes the same ids; without a prefix, append makes them
    assert [m.id for m in from_chat_completions(request, id_prefix="conv-1")] == [
        m.id for m in messages
    ]
    assert len({m.id for m in messages}) == len(messages)
    assert all(m.id is None for m in from_chat_completions(request))

    store = MessageStore.in_memory(StoreConfig(namespace="convert"))
    thread = store.thread("conv-1")
    assert append_missing(thread, messages[:4]) == (4, 0)
    # the client sends the whole conversation again, one message longer: only that one is new
    longer = from_chat_completions(
        [*request, {"role": "user", "content": "thanks"}], id_prefix="conv-1"
    )
    assert append_missing(thread, longer) == (7, 4)
    assert append_missing(thread, longer) == (0, 11)
    stored = list(thread.iter())
    assert [m.id for m in stored] == [m.id for m in longer]
    # and back out: what the model is sent is what came in (developer as system)
    back = checked_chat(to_chat_completions(stored))
    assert back[0] == {"role": "system", "content": "Be brief."}
    assert back[4]["content"] == "Looking." and [c["id"] for c in back[4]["tool_calls"]] == [
        "c1",
        "c2",
    ]
    assert back[6]["content"] == "noon" and back[-1] == {"role": "user", "content": "thanks"}


@pytest.mark.parametrize(
    "bad, field",
    [
        (
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}
                ],
            },
            "messages[1]: content[0]",
        ),
        ({"role": "function", "name": "f", "content": "x"}, "messages[1]: role 'function'"),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]},
            "messages[1]",
        ),
        ({"role": "user"}, "messages[1]"),
        ("hi", "messages[1]"),
    ],
)
def test_from_chat_completions_names_what_it_cannot_take(bad, field):
    with pytest.raises(errors.InvalidMessage, match=field.replace("[", r"\[").replace("]", r"\]")):
        from_chat_completions([{"role": "user", "content": "ok"}, bad])
