"""The adapters' reads from stored dicts (kvstore/integrations/_dicts.py) against their typed
reads: the same items, messages and ChatMessages for every kind of message a thread may hold
(written by the adapter, by other kvstore code, compacted, retracted), a bad record skipped and
named as every page read does, and the newest page in one round trip once a handle knows it
(LangChain's and LlamaIndex's adapters keep their handles for that)."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest
from langchain_core import messages as lc
from langchain_core.messages import messages_from_dict
from llama_index.core.base.llms.types import ChatMessage

from kvstore import (
    EventMessage,
    ImageContent,
    ReasoningMessage,
    StoreConfig,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
)
from kvstore._engine import executor
from kvstore.importers.langchain import to_langchain
from kvstore.importers.openai_agents import message_item
from kvstore.integrations import _dicts
from kvstore.integrations._llamaindex_convert import to_chat
from kvstore.integrations.langchain import KvstoreChatMessageHistory, _newest
from kvstore.integrations.llamaindex import KvstoreChatStore
from kvstore.integrations.openai_agents import KvstoreSession, _hidden
from tests.conftest import make_async_store, make_sync_store
from tests.integration.test_bad_records import _invalid_v2, store_unchecked
from tests.integration.test_integration_openai_agents import EVERY_ITEM

FOREIGN = [  # what other kvstore code may store in a session's thread
    UserMessage(
        content=[
            TextContent(text="a chart ✓"),
            ImageContent(source={"type": "url", "url": "https://example.com/c.png"}),
        ],
        metadata={"k": "v"},
    ),
    ToolCallMessage(tool_call=ToolCall(name="w", arguments="{}", tool_call_id="c-9")),
    ToolReturnMessage(status="error", tool_call_id="c-9", tool_return="no 🌧"),
    ReasoningMessage(reasoning="why", source="reasoner_model"),
    EventMessage(event_type="compaction", event_data={"n": 1}),
    UserMessage(content="status kept", status="completed", unknown_field={"ü": [1, None]}),
]


def typed_items(messages: list[Any]) -> list[Any]:
    """The session's items as its typed read made them: message_item of each model."""
    items = (message_item(m) for m in messages if not _hidden(m))
    return [item for item in items if item is not None]


async def _fill(store, session: KvstoreSession) -> None:
    await session.add_items(copy.deepcopy(EVERY_ITEM[:6]))
    await session.thread.append(FOREIGN)
    await session.add_items(copy.deepcopy(EVERY_ITEM[6:]))
    await session.compact("so far", keep_last=4)
    await session.add_items([{"role": "user", "content": "popped"}])
    await session.pop_item()
    await session.add_items([{"role": "user", "content": "the last ✓"}])


def test_the_session_reads_the_items_its_typed_read_makes(backend, server_only, namespace):
    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace, chunk_size=8))
        session = KvstoreSession("s", store)
        await _fill(store, session)
        stored = [m async for m in session.thread.iter()]
        expected = typed_items(stored)
        assert len(expected) > len(EVERY_ITEM) and expected[-1]["content"] == "the last ✓"
        assert await session.get_items() == expected
        for limit in (1, 2, 7, 20, 100):
            assert await session.get_items(limit) == expected[-limit:]
        dicts = [m async for m in _dicts.aiterate(session.thread)]
        assert [_dicts.as_model(m) for m in dicts] == stored
        assert sum(type(m) is dict for m in dicts) >= len(EVERY_ITEM)  # the fast path is taken
        await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["invalid message", "not msgpack"])
def test_a_bad_record_is_skipped_and_named_by_the_session(
    backend, server_only, namespace, monkeypatch, caplog, kind
):
    config = StoreConfig(namespace=namespace, chunk_size=4)
    sync = make_sync_store(backend, config)
    bad = b"\xc1\xc1 not a record" if kind == "not msgpack" else _invalid_v2("m-bad", "o-bad", "t")

    async def main() -> None:
        store = make_async_store(backend, config)
        session = KvstoreSession("s", store)
        await session.add_items([{"role": "user", "content": f"u{i}"} for i in range(3)])
        (sequence,) = store_unchecked(sync.thread("s"), monkeypatch, [bad], ["m-bad"], ["o"], "t")
        await session.add_items([{"role": "user", "content": f"v{i}"} for i in range(6)])
        caplog.set_level(logging.WARNING, logger="kvstore")
        page = await session.thread.list(limit=50)
        assert page.unreadable == [sequence]
        expected = typed_items(page.messages)
        assert await session.get_items() == expected and len(expected) == 9
        assert await session.get_items(7) == expected[-7:]
        read = await _dicts.apage(session.thread, limit=50)
        assert read.unreadable == [sequence] and not read.has_more
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warned and all(f"sequence {sequence}" in w for w in warned)
        await store.close()

    asyncio.run(main())
    sync.close()


def test_get_items_after_an_add_is_one_round_trip(backend, server_only, namespace):
    """The Runner's turn: get_items(50), then add_items (which reads the tail), then again."""

    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        session = KvstoreSession("s", store)
        for turn in range(40):  # 80 items: the open chunk holds 16 of them (chunks of 64)
            await session.add_items(
                [{"role": "user", "content": f"u{turn}"}, {"role": "assistant", "content": "a"}]
            )
        requests: list[Any] = []
        await session.get_items(50)
        for turn in range(3):
            await session.add_items([{"role": "user", "content": f"w{turn}"}])
            executor.record(store, requests.append)
            items = await session.get_items(50)
            executor.record(store, None)
            assert len(requests) == 1 and items[-1]["content"] == f"w{turn}"
            requests.clear()
        await store.close()

    asyncio.run(main())


def test_langchain_and_llamaindex_read_what_their_typed_reads_make(backend, server_only, namespace):
    config = StoreConfig(namespace=namespace, chunk_size=8)
    store = make_sync_store(backend, config)
    history = KvstoreChatMessageHistory(store, "lc", max_messages=1000)
    history.add_messages([lc.HumanMessage(f"h{n} ✓") for n in range(5)])
    store.thread("lc").append(FOREIGN)
    history.add_messages([lc.AIMessage("a", tool_calls=[{"name": "w", "args": {}, "id": "c"}])])
    history.add_messages([lc.AIMessage(f"a{n}") for n in range(12)])
    for limit in (1, 5, 20, 1000):
        history.max_messages = limit
        typed = messages_from_dict(to_langchain(_newest(store.thread("lc"), limit)))
        assert history.messages == typed
    chat = KvstoreChatStore(store)
    for n in range(12):
        chat.add_message("li", ChatMessage(role="user" if n % 2 else "assistant", content=f"c{n}"))
    store.thread("li").append(FOREIGN)
    chat.delete_message("li", 3)
    typed_chat = [
        ChatMessage.model_validate(r) for r in map(to_chat, store.thread("li").iter()) if r
    ]
    assert chat.get_messages("li") == typed_chat
    assert KvstoreChatStore(store, max_messages=7).get_messages("li") == typed_chat[-7:]

    async def main() -> None:
        async_store = make_async_store(backend, config)
        history = KvstoreChatMessageHistory(async_store, "lc", max_messages=20)
        assert await history.aget_messages() == messages_from_dict(
            to_langchain(_newest(store.thread("lc"), 20))
        )
        chat = KvstoreChatStore(store, async_store, max_messages=7)
        assert await chat.aget_messages("li") == typed_chat[-7:]
        assert await KvstoreChatStore(store, async_store).aget_messages("li") == typed_chat
        await async_store.close()

    asyncio.run(main())
    store.close()


def test_langchain_and_llamaindex_keep_their_thread_handle(backend, server_only, namespace):
    """Their newest page reads ahead the closed chunk it needed last: one round trip."""
    store = make_sync_store(backend, StoreConfig(namespace=namespace, chunk_size=8))
    history = KvstoreChatMessageHistory(store, "lc", max_messages=10)
    history.add_messages([lc.HumanMessage(f"h{n}") for n in range(20)])
    chat = KvstoreChatStore(store, max_messages=10)
    for n in range(20):
        chat.add_message("li", ChatMessage(role="user", content=f"c{n}"))
    for read in (lambda: history.messages, lambda: chat.get_messages("li")):
        first = read()
        requests: list[Any] = []
        executor.record(store, requests.append)
        assert read() == first and len(requests) == 1
        executor.record(store, None)
    store.close()


def _context_thread(store, monkeypatch=None) -> Any:
    """A thread whose context holds every kind: its leading system message kept past retention,
    a summary that splits a tool-call pair, FOREIGN messages (a call and its answer among them),
    a retracted item, and (given `monkeypatch`) a bad record."""
    thread = store.thread("ctx")
    thread.append(SystemMessage(content="rules ✓"))
    thread.append([UserMessage(content=f"u{n} " + "w" * n) for n in range(30)])
    thread.append(ToolCallMessage(tool_call=ToolCall(name="w", arguments="{}", tool_call_id="c-1")))
    last = thread.stats().next_sequence - 1
    thread.append(ToolReturnMessage(status="success", tool_call_id="c-1", tool_return="sunny"))
    thread.compact("so far ✓", last_sequence=last)  # the call before the boundary, its answer after
    thread.append(FOREIGN)
    if monkeypatch is not None:
        bad = _invalid_v2("m-bad", "o-bad", "")
        store_unchecked(thread, monkeypatch, [bad], ["m-bad"], ["o-bad"], "")
    thread.append([UserMessage(content=f"v{n}") for n in range(10)])
    return thread


@pytest.mark.parametrize("bad_record", [False, True])
def test_the_context_read_from_dicts_is_the_typed_context(
    backend, server_only, namespace, monkeypatch, bad_record
):
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4, retained_message_limit=8)
    store = make_sync_store(backend, config)
    thread = _context_thread(store, monkeypatch if bad_record else None)
    assert thread.stats().deleted_before_sequence is not None  # retention passed the start
    dicts_seen = 0
    # Every cut: some keep a tool return without its call, which the context leaves out.
    for budget in (None, *range(1, thread.stats().tokens + 40, 2)):
        typed = thread.context(budget)
        read = _dicts.context(thread, budget)
        assert [_dicts.as_model(m) for m in read] == typed, budget
        dicts_seen += sum(type(m) is dict for m in read)
    assert dicts_seen > 0  # the fast path is taken
    full = thread.context()
    assert full[0].content == "rules ✓" and full[1].summary == "so far ✓"
    assert [type(m).__name__ for m in full[2:4]] == ["ToolCallMessage", "ToolReturnMessage"]

    async def main() -> None:
        async_store = make_async_store(backend, config)
        async_thread = async_store.thread("ctx")
        for budget in (None, 60):
            read = await _dicts.acontext(async_thread, budget)
            assert [_dicts.as_model(m) for m in read] == thread.context(budget)
        await async_store.close()

    asyncio.run(main())
    store.close()


def test_each_adapters_context_is_its_typed_conversion_of_context(backend, server_only, namespace):
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4)
    store = make_sync_store(backend, config)
    thread = _context_thread(store)
    history = KvstoreChatMessageHistory(store, "ctx", max_tokens=60)
    assert history.messages == messages_from_dict(to_langchain(thread.context(60)))
    chat = KvstoreChatStore(store, max_tokens=60)
    typed_chat = [ChatMessage.model_validate(r) for r in map(to_chat, thread.context(60)) if r]
    assert chat.get_messages("ctx") == typed_chat

    async def main() -> None:
        async_store = make_async_store(backend, config)
        history = KvstoreChatMessageHistory(async_store, "ctx", max_tokens=60)
        assert await history.aget_messages() == messages_from_dict(to_langchain(thread.context(60)))
        assert (
            await KvstoreChatStore(store, async_store, max_tokens=60).aget_messages("ctx")
            == typed_chat
        )
        session = KvstoreSession("ctx", async_store)
        typed = [message_item(m) for m in thread.context(60)]
        assert await session.context_items(60) == [i for i in typed if i is not None]
        await async_store.close()

    asyncio.run(main())
    store.close()
