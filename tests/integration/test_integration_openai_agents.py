"""The OpenAI Agents SDK's session on kvstore, on the real servers: the SDK's own Runner with a
scripted model (a tool call and its output included), every Responses item type back equal, and
the session contract (limit, pop on empty, unicode, concurrent adds, isolation, clear)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.memory.session_settings import SessionSettings
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from kvstore import StoreConfig
from kvstore.integrations.openai_agents import KvstoreSession
from tests.conftest import make_async_store
from tests.support.acl import app_user_url

# The scripted model needs no tracing; the SDK would otherwise try to export its traces.
set_tracing_disabled(True)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def session_in(backend: str, namespace: str, session_id: str = "s-1", **kwargs: Any):
    store = make_async_store(backend, StoreConfig(namespace=namespace))
    return store, KvstoreSession(session_id, store, **kwargs)


def _reply(text: str, n: int) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=f"msg_{n}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class ScriptedModel(Model):
    """Replies from a script, recording the input each call saw."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script = list(script)
        self.seen: list[list[Any]] = []

    async def get_response(self, system_instructions, input, *args, **kwargs) -> ModelResponse:
        self.seen.append(copy.deepcopy(input))
        return ModelResponse(output=self.script.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):  # pragma: no cover - not used by Runner.run
        raise NotImplementedError


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"4 °C in {city}"


EVERY_ITEM: list[Any] = [
    {"role": "user", "content": "hi ✓ 你好"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "parts"}]},
    {"role": "system", "content": "be brief"},
    {"role": "developer", "content": "dev note"},
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_a",
        "status": "completed",
        "content": [{"type": "output_text", "text": "hello", "annotations": []}],
    },
    {"role": "assistant", "content": "plain assistant"},
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "weather",
        "arguments": '{"city": "Oslo"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "4 °C"},
    {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": [{"type": "input_text", "text": "list output"}],
    },
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "thinking"}],
        "encrypted_content": "opaque",
    },
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
    {"type": "item_reference", "id": "ref_1"},
    {"type": "some_future_item", "payload": {"nested": [1, 2.5, None, True]}},
]


def test_runner_drives_a_multi_turn_conversation(backend, server_only, namespace):
    async def main() -> None:
        store, session = session_in(backend, namespace, "runner")
        call = ResponseFunctionToolCall(
            id="fc_9",
            type="function_call",
            call_id="call_9",
            name="weather",
            arguments='{"city": "Oslo"}',
            status="completed",
        )
        model = ScriptedModel([[call], [_reply("Cloudy, 4 °C.", 1)], [_reply("You said Oslo.", 2)]])
        agent = Agent(name="a", instructions="be brief", model=model, tools=[weather])
        first = await Runner.run(agent, "weather in Oslo?", session=session)
        second = await Runner.run(agent, "what city?", session=session)
        assert (first.final_output, second.final_output) == ("Cloudy, 4 °C.", "You said Oslo.")
        # The third model call saw the whole first turn from the session, then the new input.
        third = model.seen[2]
        kinds = [item.get("type", "message") for item in third]
        assert kinds == [
            "message",
            "function_call",
            "function_call_output",
            "message",
            "message",
        ]
        assert third[0]["content"] == "weather in Oslo?"
        assert third[2]["output"] == "4 °C in Oslo" and third[2]["call_id"] == "call_9"
        assert third[-1]["content"] == "what city?"
        stored = await session.get_items()
        assert len(stored) == 6 and stored[-1]["id"] == "msg_2"
        assert (await store.thread("runner").stats()).stored_messages == 6
        await store.close()

    run(main())


def test_every_item_type_comes_back_equal(backend, server_only, namespace):
    async def main() -> None:
        store, session = session_in(backend, namespace)
        await session.add_items(copy.deepcopy(EVERY_ITEM))
        assert await session.get_items() == EVERY_ITEM
        assert await session.get_items(limit=3) == EVERY_ITEM[-3:]
        for item in EVERY_ITEM:
            other = KvstoreSession("one-" + str(EVERY_ITEM.index(item)), store)
            await other.add_items([item])
            assert await other.get_items() == [item]
        await store.close()

    run(main())


def test_a_retried_add_stores_nothing_twice(backend, server_only, namespace):
    async def main() -> None:
        store, session = session_in(backend, namespace)
        batch = [{"role": "user", "content": "same"}, {"role": "assistant", "content": "ok"}]
        await session.add_items(batch)
        await session.add_items(batch)  # the same call sent again
        assert await session.get_items() == batch
        await session.add_items(batch)  # the thread's newest items already are this batch
        assert len(await session.get_items()) == 2
        await session.add_items([{"role": "user", "content": "next"}])
        await session.add_items(batch)  # a later turn saying the same thing is stored
        assert len(await session.get_items()) == 5
        await store.close()

    run(main())


def test_limit_pop_unicode_and_clear(backend, server_only, namespace):
    async def main() -> None:
        store, session = session_in(backend, namespace)
        assert await session.pop_item() is None
        assert await session.get_items(limit=5) == []
        items = [{"role": "user", "content": f"m{i} — ünïcødé 🚀"} for i in range(120)]
        await session.add_items(items)
        assert await session.get_items(limit=1) == items[-1:]
        assert await session.get_items(limit=50) == items[-50:]
        assert await session.get_items(limit=500) == items
        assert await session.get_items(limit=0) == []
        assert await session.pop_item() == items[-1]
        assert await session.pop_item() == items[-2]
        assert await session.get_items(limit=3) == items[-5:-2]
        assert len(await session.get_items()) == 118
        await session.clear_session()
        assert await session.get_items() == [] and await session.pop_item() is None
        await session.add_items(items[:1])
        assert await session.get_items() == items[:1]
        await store.close()

    run(main())


def test_session_settings_limit(backend, server_only, namespace):
    async def main() -> None:
        store, session = session_in(backend, namespace, session_settings=SessionSettings(limit=2))
        items = [{"role": "user", "content": str(i)} for i in range(5)]
        await session.add_items(items)
        assert await session.get_items() == items[-2:]
        await store.close()

    run(main())


def test_concurrent_adds_from_several_tasks(backend, server_only, namespace):
    async def main() -> None:
        stores = [make_async_store(backend, StoreConfig(namespace=namespace)) for _ in range(4)]
        sessions = [KvstoreSession("shared", s) for s in stores]

        async def writer(w: int) -> None:
            for i in range(25):
                await sessions[w].add_items(
                    [
                        {"role": "user", "content": f"w{w}-{i}"},
                        {"role": "assistant", "content": "k"},
                    ]
                )

        await asyncio.gather(*(writer(w) for w in range(4)))
        items = await sessions[0].get_items()
        assert len(items) == 200
        users = [i["content"] for i in items if i["role"] == "user"]
        assert sorted(users) == sorted(f"w{w}-{i}" for w in range(4) for i in range(25))
        # each add is atomic: a user item is always followed by its own reply
        assert all(items[k + 1]["content"] == "k" for k in range(0, 200, 2))
        for store in stores:
            await store.close()

    run(main())


def test_isolation_by_session_id_and_namespace(backend, server_only, namespace):
    async def main() -> None:
        store, one = session_in(backend, namespace, "a")
        two = KvstoreSession("b", store)
        other_store, three = session_in(backend, namespace + "x", "a")
        await one.add_items([{"role": "user", "content": "one"}])
        await two.add_items([{"role": "user", "content": "two"}])
        await three.add_items([{"role": "user", "content": "three"}])
        assert [i["content"] for i in await one.get_items()] == ["one"]
        assert [i["content"] for i in await two.get_items()] == ["two"]
        assert [i["content"] for i in await three.get_items()] == ["three"]
        await two.clear_session()
        assert await one.get_items() != [] and await two.get_items() == []
        await store.close()
        await other_store.close()

    run(main())


def test_compaction_is_the_history_the_model_gets(backend, server_only, namespace):
    async def main() -> None:
        store, session = session_in(backend, namespace, history="context")
        items = [{"role": "user", "content": f"q{i}"} for i in range(10)]
        await session.add_items(items)
        await session.compact("earlier: q0..q7", keep_last=2)
        history = await session.get_items()
        assert history[-2:] == items[-2:] and len(history) == 3
        assert "earlier: q0..q7" in str(history[0])
        assert len(await session.get_items(limit=100)) == 10  # a page still reads every item
        await store.close()

    run(main())


def test_from_url_closes_its_store(backend, server_only, server, namespace):
    async def main() -> None:
        session = KvstoreSession.from_url("u", server.url, StoreConfig(namespace=namespace))
        await session.add_items([{"role": "user", "content": "x"}])
        assert await session.get_items() == [{"role": "user", "content": "x"}]
        await session.close()

    run(main())


def test_history_must_be_known(backend, server_only, namespace):
    store = make_async_store(backend, StoreConfig(namespace=namespace))
    with pytest.raises(ValueError, match="history"):
        KvstoreSession("s", store, history="everything")
    run(store.close())


def test_every_method_runs_as_the_least_privileged_user(server_only, server, raw_client, namespace):
    async def main(url: str) -> None:
        session = KvstoreSession.from_url("acl", url, StoreConfig(namespace=namespace))
        try:
            await session.add_items(copy.deepcopy(EVERY_ITEM))
            await session.add_items(copy.deepcopy(EVERY_ITEM))  # a replay
            assert await session.get_items() == EVERY_ITEM
            assert await session.get_items(limit=2) == EVERY_ITEM[-2:]
            assert await session.pop_item() == EVERY_ITEM[-1]
            await session.compact("so far", keep_last=2)
            assert (await session.context_items())[-2:] == EVERY_ITEM[-3:-1]
            await session.clear_session()
            assert await session.get_items() == []
        finally:
            await session.close()

    with app_user_url(server.url, raw_client, namespace) as url:
        run(main(url))
