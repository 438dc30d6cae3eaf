"""Each adapter's conversion of stored dicts against its typed conversion, on generated threads:
the messages each framework's adapter stores (grouped as they were given), messages other kvstore
code stores, deletions and retractions, in any order, read back as the dict read returns them
(record_dicts.decode_dicts) and as models (record.decode_records): the same Agents SDK items,
LangChain records and LlamaIndex ChatMessages."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core import messages as lc
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock

from kvstore import (
    AssistantMessage,
    EventMessage,
    HiddenReasoningMessage,
    ImageContent,
    ReasoningMessage,
    SummaryMessage,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
)
from kvstore._engine.record import decode_records, encode_record
from kvstore._engine.record_dicts import decode_dicts
from kvstore.importers.langchain import to_langchain
from kvstore.importers.openai_agents import POPPED_FIELD, dict_item, item_message, message_item
from kvstore.integrations import _llamaindex_convert as li
from kvstore.integrations._langchain_convert import (
    _plain_record,
    converted,
    langchain_records,
    stored,
)
from kvstore.integrations.llamaindex import _chat, _dump
from kvstore.integrations.openai_agents import _hidden, _items
from tests.integration.test_integration_openai_agents import EVERY_ITEM

CALL = ToolCall(name="w", arguments='{"a": 1}', tool_call_id="c-1")
FOREIGN = [  # what other kvstore code stores, each a group of its own
    [UserMessage(content="plain ✓ 你好")],
    [UserMessage(content="named", name="ann", metadata={"k": "v"})],
    [AssistantMessage(content="no origin")],
    [AssistantMessage(content=[TextContent(text="parts")])],
    [AssistantMessage(content="then a call"), ToolCallMessage(tool_call=CALL)],
    [
        AssistantMessage(content="a call after reasoning"),
        ReasoningMessage(reasoning="hm"),
        ToolCallMessage(tool_call=CALL, tool_calls=[CALL, CALL]),
    ],
    [ToolReturnMessage(status="success", tool_call_id="c-1", tool_return="4 °C")],
    [SystemMessage(content="be brief")],
    [SummaryMessage(summary="so far")],
    [HiddenReasoningMessage(state="redacted")],
    [EventMessage(event_type="compaction", event_data={"n": 1})],
    [
        UserMessage(
            content=[ImageContent(source={"url": "https://e.x/a.png"}), TextContent(text="x")]
        )
    ],
    [UserMessage(content="status", status="completed", extra_field=[1, "ü"])],
]


def _langchain_groups() -> list[list[Any]]:
    said = [
        lc.SystemMessage("You are a weather bot."),
        lc.HumanMessage("Weather in Zürich? 🌦", id="h-1"),
        lc.HumanMessage("named", name="bob"),
        lc.AIMessage("", tool_calls=[{"name": "weather", "args": {"c": "Z"}, "id": "call-1"}]),
        lc.AIMessage("text and a call", tool_calls=[{"name": "w", "args": {}, "id": "call-2"}]),
        lc.AIMessage("usage", usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}),
        lc.ToolMessage("cloudy, 4 °C", tool_call_id="call-1", name="weather"),
        lc.HumanMessage(content=[{"type": "text", "text": "and?"}, {"type": "image_url", "image_url": {"url": "https://e.x/a.png"}}]),
        lc.AIMessage("A cloud.", id="a-2"),
        lc.ChatMessage("a role", role="critic"),
    ]  # fmt: skip
    return [stored(converted([message], "t"), "t", None) for message in said]


def _llamaindex_groups() -> list[list[Any]]:
    calls = [{"id": "c-1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]
    said = [
        ChatMessage(role="system", content="You are a weather bot."),
        ChatMessage(role="user", content="hi ✓"),
        ChatMessage(role="user", blocks=[TextBlock(text="look"), ImageBlock(url="https://e.x/a.png")]),
        ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": calls}),
        ChatMessage(role="tool", content="cloudy", additional_kwargs={"tool_call_id": "c-1"}),
        ChatMessage(role="assistant", content="named", additional_kwargs={"name": "bot"}),
        ChatMessage(role="developer", content="another role"),
    ]  # fmt: skip
    groups = [[li.to_kvstore(_dump(message), "k")] for message in said]
    return [*groups, [li.tombstone()]]


def _agents_groups() -> list[list[Any]]:
    groups = [[item_message(copy.deepcopy(item), f"o-{n}")] for n, item in enumerate(EVERY_ITEM)]
    popped = item_message({"role": "user", "content": "popped"})
    setattr(popped, POPPED_FIELD, True)
    return [*groups, [popped]]


def both_reads(groups: list[list[Any]]) -> tuple[list[Any], list[Any]]:
    """The messages of `groups` stored in order, read back as dicts and as models."""
    entries = [
        (sequence, encode_record(message))
        for sequence, message in enumerate((m for group in groups for m in group), 1)
    ]
    return decode_dicts(entries), decode_records(entries)


def threads(own: list[list[Any]]) -> st.SearchStrategy[list[list[Any]]]:
    return st.lists(st.sampled_from([*own, *FOREIGN]), max_size=14)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(threads(_langchain_groups()))
def test_langchain_records_from_dicts_are_the_typed_ones(groups):
    dicts, models = both_reads(groups)
    assert langchain_records(dicts) == to_langchain(models)


@SETTINGS
@given(threads(_llamaindex_groups()))
def test_llamaindex_chat_messages_from_dicts_are_the_typed_ones(groups):
    dicts, models = both_reads(groups)
    expected = [ChatMessage.model_validate(r) for r in map(li.to_chat, models) if r is not None]
    assert _chat(dicts) == expected


@SETTINGS
@given(threads(_agents_groups()))
def test_agents_items_from_dicts_are_the_typed_ones(groups):
    dicts, models = both_reads(groups)
    typed = [message_item(m) for m in models if not _hidden(m)]
    assert _items([m for m in dicts if not _hidden(m)]) == [i for i in typed if i is not None]


def test_each_adapter_converts_its_plain_messages_from_their_dicts():
    """The fast conversions are taken for what each adapter stores most."""
    dicts, _ = both_reads(_agents_groups())
    assert all(type(m) is dict and dict_item(m)[0] for m in dicts)
    dicts, _ = both_reads(_llamaindex_groups())
    assert all(type(m) is dict for m in dicts)
    assert [li.chat_dict(m)[0] for m in dicts[:2]] == [True, True]
    dicts, _ = both_reads(_langchain_groups())
    assert all(type(m) is dict for m in dicts)
    assert _plain_record(dicts[0]) == {
        "type": "system",
        "data": {"content": "You are a weather bot.", "type": "system"},
    }
    assert _plain_record(dicts[2]) == {
        "type": "human",
        "data": {"content": "named", "type": "human", "name": "bob"},
    }
