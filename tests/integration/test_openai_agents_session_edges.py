"""The Agents SDK session's edges on the real servers: items whose ids are not identities (the
SDK's placeholder of Chat Completions models), items popped and added again (the SDK's rewind
and restore), limits that count items only, session settings as a dict, bad items refused with
a typed error and nothing written, and a thread another writer shares."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.models.fake_id import FAKE_RESPONSES_ID
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from kvstore import EventMessage, ReasoningMessage, StoreConfig, UserMessage, errors
from kvstore.integrations.openai_agents import KvstoreSession
from tests.conftest import make_async_store
from tests.integration.test_integration_openai_agents import ScriptedModel

set_tracing_disabled(True)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def said(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def placeholder_reply(text: str) -> ResponseOutputMessage:
    """An assistant message as the SDK's Chat Completions model makes it: the placeholder id."""
    return ResponseOutputMessage(
        id=FAKE_RESPONSES_ID,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def texts(items: list[Any]) -> list[str]:
    return [
        i["content"] if isinstance(i["content"], str) else i["content"][0]["text"] for i in items
    ]


def test_a_chat_completions_model_s_placeholder_ids_store_every_turn(
    backend, server_only, namespace
):
    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("cc", store)
        model = ScriptedModel([[placeholder_reply(f"answer {n}")] for n in range(3)])
        agent = Agent(name="a", instructions="be brief", model=model)
        for n in range(3):
            result = await Runner.run(agent, f"question {n}", session=session)
            assert result.final_output == f"answer {n}"
        expected = [text for n in range(3) for text in (f"question {n}", f"answer {n}")]
        assert texts(await session.get_items()) == expected
        # The third call saw both earlier turns.
        assert texts(model.seen[2]) == [*expected[:4], "question 2"]
        await store.close()

    run(main())


def test_items_popped_and_added_again_are_stored(backend, server_only, namespace):
    """What the SDK's rewind does: pop the tail, then add the same items again."""

    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("p", store)
        with_id = {"type": "message", "role": "user", "id": "msg_1", "content": "with an id"}
        items = [said("a"), said("b"), with_id]
        await session.add_items(copy.deepcopy(items))
        assert await session.pop_item() == with_id
        assert await session.pop_item() == said("b")
        await session.add_items(copy.deepcopy(items[1:]))
        assert await session.get_items() == items
        assert await session.pop_item() == with_id
        await session.add_items([copy.deepcopy(with_id)])
        await session.add_items([copy.deepcopy(with_id)])  # sent again: a replay
        assert await session.get_items() == items
        await store.close()

    run(main())


def test_limit_pop_and_compact_count_items_only(backend, server_only, namespace):
    """Messages another writer stored that are no item (an event, a reasoning message without
    one) are not counted by get_items(limit), popped, or kept by compact(keep_last)."""

    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("n", store)
        await session.add_items([said(f"u{n}") for n in range(4)])
        await session.thread.append(
            [EventMessage(event_type="compaction", event_data={}), ReasoningMessage(reasoning="r")]
        )
        assert await session.get_items(2) == [said("u2"), said("u3")]
        assert await session.pop_item() == said("u3")
        assert await session.get_items() == [said(f"u{n}") for n in range(3)]
        await session.compact("u0 and u1", keep_last=1)
        context = await session.context_items()
        assert context[-1] == said("u2") and "u0 and u1" in str(context[0])
        assert len(context) == 2
        await store.close()

    run(main())


def test_session_settings_given_as_a_dict(backend, server_only, namespace):
    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("d", store, session_settings={"limit": 2})  # type: ignore[arg-type]
        await session.add_items([said(str(n)) for n in range(5)])
        assert await session.get_items() == [said("3"), said("4")]
        await store.close()

    run(main())


def test_a_message_of_another_writer_without_an_otid_keeps_the_chain(
    backend, server_only, namespace
):
    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("w", store)
        await session.add_items([said("yes")])
        await session.thread.append(UserMessage(content="from elsewhere"))
        await session.add_items([said("yes")])
        assert texts(await session.get_items()) == ["yes", "from elsewhere", "yes"]
        await store.close()

    run(main())


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_ITEMS = {
    "a string": "hi",
    "None": None,
    "a set inside": {"role": "user", "content": "x", "tags": {1, 2}},
    "bytes inside": {"role": "user", "content": b"x"},
    "an object inside": {"role": "user", "content": "x", "o": object()},
    "NaN": {"role": "user", "content": "x", "score": float("nan")},
    "keys of two types": {"role": "user", "content": "x", 1: "one"},
    "nested too deep": {"role": "user", "content": "x", "deep": _nested(100)},
    "a lone surrogate": {"role": "user", "content": "\ud800"},
    "a message without content": {"type": "message", "role": "user"},
    "too large": {"role": "user", "content": "x" * (17 << 20)},
}


@pytest.mark.parametrize("kind", sorted(BAD_ITEMS))
def test_a_bad_item_is_a_typed_error_and_nothing_is_written(
    backend, server_only, namespace, raw_client, kind
):
    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("bad", store)
        with pytest.raises((errors.InvalidMessage, errors.MessageTooLarge)):
            await session.add_items([said("good"), BAD_ITEMS[kind]])
        assert await session.get_items() == []
        await store.close()

    run(main())
    assert list(raw_client.scan_iter(match=f"{namespace}:*")) == []


def test_items_that_only_look_odd_come_back_equal(backend, server_only, namespace):
    odd = [
        {"type": "message", "content": "no role"},
        {"role": "user", "content": None},
        {"role": "user", "content": "", "id": FAKE_RESPONSES_ID},
        {"role": "user", "content": "x", "openai_item": {"nested": "name"}, "seq_id": 5},
        {"role": "assistant", "content": "\x00 \u2028 🚀"},
    ]

    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("odd", store)
        await session.add_items(copy.deepcopy(odd))
        assert await session.get_items() == odd
        assert await session.get_items(3) == odd[-3:]
        await store.close()

    run(main())


def test_limits_and_keep_last_out_of_range(backend, server_only, namespace):
    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("r", store)
        await session.add_items([said(str(n)) for n in range(3)])
        assert await session.get_items(-1) == [] and await session.get_items(0) == []
        assert await session.get_items(5000) == [said(str(n)) for n in range(3)]
        with pytest.raises(ValueError, match="keep_last"):
            await session.compact("s", keep_last=-1)
        await session.compact("nothing to summarize", keep_last=10)
        assert (await session.thread.stats()).stored_messages == 3
        await store.close()

    run(main())


def test_a_sync_store_is_refused_when_the_session_is_made(backend, server_only, server, namespace):
    from kvstore import MessageStore

    with (
        MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as sync,
        pytest.raises(TypeError, match="AsyncMessageStore"),
    ):
        KvstoreSession("s", sync)  # type: ignore[arg-type]


# Batches added one after another to a new session, and the texts it then holds: only the
# whole batch just before is a replay, never its first or last items alone.
BATCHES = {
    "the end of the batch before": (
        [["What is 2+2?", "4"], ["ok", "ok", "fine"], ["ok", "fine"], ["fine"]],
        ["What is 2+2?", "4", "ok", "ok", "fine", "ok", "fine", "fine"],
    ),
    "its last item, all alike": ([["yes", "yes"], ["yes"]], ["yes"] * 3),
    "the start of the batch before": ([["a", "b", "c"], ["a", "b"]], ["a", "b", "c", "a", "b"]),
    "its first items, all alike": ([["yes"] * 3, ["yes"] * 2], ["yes"] * 5),
    "the same batch again (a retried step)": (
        [["first"], ["a", "b", "a"], ["a", "b", "a"]],
        ["first", "a", "b", "a"],
    ),
    "the same batch of alike items again": ([["yes"] * 2, ["yes"] * 2], ["yes"] * 2),
    # One item, as the batch of one before it: taken for a replay (the documented limit).
    "one item again": ([["zero"], ["one"], ["one"]], ["zero", "one"]),
}


@pytest.mark.parametrize("case", BATCHES)
def test_only_the_whole_batch_before_is_a_replay(backend, server_only, namespace, case):
    batches, expected = BATCHES[case]

    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        try:
            session = KvstoreSession("batches", store)
            for batch in batches:
                await session.add_items([said(text) for text in batch])
            assert texts(await session.get_items()) == expected
        finally:
            await store.close()

    run(main())


def test_reads_past_many_popped_items_take_few_round_trips(backend, server_only, namespace):
    """Items pop_item retracted are passed over by pages that grow: after 300 pops the next pop
    and get_items(1) take a handful of round trips, not one per retracted item."""

    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("pops", store)
        await session.add_items([said(str(i)) for i in range(400)])
        for _ in range(300):
            await session.pop_item()
        requests: list[Any] = []
        store._on_request = requests.append
        assert texts(await session.get_items(1)) == ["99"]
        assert len(requests) <= 14, len(requests)
        requests.clear()
        assert texts([await session.pop_item()]) == ["99"]
        assert len(requests) <= 15, len(requests)
        assert texts(await session.get_items(3)) == ["96", "97", "98"]
        await store.close()

    run(main())


def test_a_compaction_the_pair_rule_cannot_store_is_refused(backend, server_only, namespace):
    """compact() whose boundary the pair rule would move onto the summary in force (a tool call
    answered after it) raises InvalidSummaryRange: the summary is never dropped silently."""
    from kvstore import AssistantMessage, ToolCallMessage, ToolReturnMessage

    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("p", store)
        call = {"name": "book", "arguments": "{}", "tool_call_id": "c1"}
        thread = session.thread
        await thread.append([UserMessage(content="book"), ToolCallMessage(tool_call=call)])
        await thread.append(AssistantMessage(content="searching"))
        await thread.compact("S1", 1)  # 4; the call (2) is still open
        await thread.append([UserMessage(content="a hotel"), AssistantMessage(content="noted")])
        await thread.append(
            ToolReturnMessage(status="success", tool_call_id="c1", tool_return="ok")
        )
        await thread.append([AssistantMessage(content="booked"), UserMessage(content="thanks")])
        with pytest.raises(errors.InvalidSummaryRange, match="answered at 7"):
            await session.compact("S2", keep_last=3)
        assert (await thread.stats()).summary_last_sequence == 1
        await store.close()

    run(main())
