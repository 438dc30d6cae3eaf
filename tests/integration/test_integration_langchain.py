"""The LangChain adapter on the real servers: LangChain's own RunnableWithMessageHistory driving
a conversation through it, and the history contract (langchain-tests has no standard suite for
chat message histories, so the cases are written here)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from langchain_core import messages as lc
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from kvstore import AsyncMessageStore, MessageStore, StoreConfig, errors
from kvstore.integrations.langchain import KvstoreChatMessageHistory
from tests.support.acl import app_user_url


@pytest.fixture
def store(backend, server_only, server, namespace):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        yield made


def conversation() -> list[lc.BaseMessage]:
    return [
        lc.SystemMessage("You are a weather bot."),
        lc.HumanMessage("Weather in Zürich? 🌦", id="h-1"),
        lc.AIMessage(
            "",
            tool_calls=[{"name": "weather", "args": {"city": "Zürich"}, "id": "call-1"}],
            usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
        ),
        lc.ToolMessage("cloudy, 4 °C", tool_call_id="call-1", name="weather"),
        lc.HumanMessage(
            content=[
                {"type": "text", "text": "and this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            ]
        ),
        lc.AIMessage("A cloud.", id="a-2"),
    ]


def test_messages_round_trip_equal(store):
    history = KvstoreChatMessageHistory(store, "t")
    history.add_messages(conversation())
    assert history.messages == conversation()


def test_same_batch_again_is_a_replay(store):
    history = KvstoreChatMessageHistory(store, "t")
    history.add_messages(conversation())
    history.add_messages(conversation())
    history.add_messages([lc.AIMessage("A cloud.", id="a-2")])
    assert history.messages == conversation()
    history.add_messages([lc.HumanMessage("again")])
    assert len(history.messages) == len(conversation()) + 1


def test_messages_are_the_newest_page(store):
    history = KvstoreChatMessageHistory(store, "t", max_messages=3)
    for n in range(10):
        history.add_message(lc.HumanMessage(f"m{n}"))
    assert [m.content for m in history.messages] == ["m7", "m8", "m9"]


def test_max_tokens_reads_the_context(store):
    # Counted one token per 4 bytes of a record: about 1,000 tokens each, so two fit.
    history = KvstoreChatMessageHistory(store, "t", max_tokens=2500)
    history.add_messages([lc.HumanMessage(f"{n}" * 4000) for n in range(5)])
    assert [m.content[0] for m in history.messages] == ["3", "4"]


def test_bad_max_messages_is_refused(store):
    with pytest.raises(errors.InvalidCursor):
        KvstoreChatMessageHistory(store, "t", max_messages=0)


def test_isolation_by_id_and_namespace_and_clear(store, server):
    a = KvstoreChatMessageHistory(store, "a")
    b = KvstoreChatMessageHistory(store, "b")
    a.add_messages([lc.HumanMessage("for a")])
    b.add_messages([lc.HumanMessage("for b")])
    with MessageStore.from_url(server.url, StoreConfig(namespace="other-ns")) as other:
        assert KvstoreChatMessageHistory(other, "a").messages == []
    a.clear()
    assert a.messages == []
    assert [m.content for m in b.messages] == ["for b"]


def test_concurrent_adds_all_land(store):
    history = KvstoreChatMessageHistory(store, "t", max_messages=1000)

    def add(worker: int) -> None:
        for n in range(10):
            history.add_messages([lc.HumanMessage(f"{worker}-{n}"), lc.AIMessage(f"r{worker}-{n}")])

    workers = [threading.Thread(target=add, args=(w,)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    got = history.messages
    assert len(got) == 80
    for first, second in zip(got[::2], got[1::2], strict=True):
        assert second.content == f"r{first.content}"  # a batch is never split


# The framework marks RunnableWithMessageHistory deprecated (for LangGraph) but still ships it,
# and it is the runner a chat message history serves: only that warning is let through.
_RUNNER_DEPRECATED = pytest.mark.filterwarnings(
    "ignore:RunnableWithMessageHistory is deprecated:langchain_core._api.deprecation.LangChainDeprecationWarning"
)


def _chain(history_for):
    model = GenericFakeChatModel(messages=iter(["Hello!", "Sunny.", "Bye."]))
    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{question}")]
    )
    return RunnableWithMessageHistory(
        prompt | model,
        history_for,
        input_messages_key="question",
        history_messages_key="history",
    )


@_RUNNER_DEPRECATED
def test_runnable_with_message_history_sync(store):
    chain = _chain(lambda session_id: KvstoreChatMessageHistory(store, session_id))
    config = {"configurable": {"session_id": "s1"}}
    for question in ("hi", "weather?", "bye"):
        chain.invoke({"question": question}, config=config)
    got = KvstoreChatMessageHistory(store, "s1").messages
    assert [(m.type, m.content) for m in got] == [
        ("human", "hi"),
        ("ai", "Hello!"),
        ("human", "weather?"),
        ("ai", "Sunny."),
        ("human", "bye"),
        ("ai", "Bye."),
    ]


@_RUNNER_DEPRECATED
def test_runnable_with_message_history_async(backend, server_only, server, namespace):
    async def run() -> list[lc.BaseMessage]:
        async with AsyncMessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as s:
            chain = _chain(lambda session_id: KvstoreChatMessageHistory(s, session_id))
            config = {"configurable": {"session_id": "s1"}}
            for question in ("hi", "weather?", "bye"):
                await chain.ainvoke({"question": question}, config=config)
            history = KvstoreChatMessageHistory(s, "s1")
            got = await history.aget_messages()
            await history.aclear()
            assert await history.aget_messages() == []
            return got

    got = asyncio.run(run())
    assert [m.content for m in got] == ["hi", "Hello!", "weather?", "Sunny.", "bye", "Bye."]


def test_async_round_trip_and_sync_store_refuses_async(backend, server_only, server, namespace):
    async def run() -> list[lc.BaseMessage]:
        async with AsyncMessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as s:
            history = KvstoreChatMessageHistory(s, "t")
            await history.aadd_messages(conversation())
            with pytest.raises(TypeError):
                history.add_messages(conversation())
            return await history.aget_messages()

    assert asyncio.run(run()) == conversation()


def test_compaction_is_the_history_a_budgeted_reader_gets(store):
    history = KvstoreChatMessageHistory(store, "c", max_tokens=100_000)
    asked = [lc.HumanMessage(f"q{n}") for n in range(6)]
    history.add_messages(asked)
    assert history.compact("q0 to q3 were asked", keep_last=2) is True
    assert history.compact("again", keep_last=50) is False  # nothing older than the kept
    model_sees = history.messages
    assert isinstance(model_sees[0], lc.SystemMessage) and "q0 to q3" in model_sees[0].content
    assert model_sees[1:] == asked[-2:]
    assert history.compact("q0 to q3 were asked", keep_last=2) is True  # the same, a replay
    assert store.thread("c").stats().stored_messages == 7
    newest = KvstoreChatMessageHistory(store, "c", max_messages=3).messages
    assert [m.content for m in newest][-2:] == ["q4", "q5"]


def test_async_compaction(backend, server_only, server, namespace):
    async def run() -> list[lc.BaseMessage]:
        async with AsyncMessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as s:
            history = KvstoreChatMessageHistory(s, "c", max_tokens=100_000)
            await history.aadd_messages([lc.HumanMessage(f"q{n}") for n in range(4)])
            assert await history.acompact("before q3", keep_last=1) is True
            return await history.aget_messages()

    seen = asyncio.run(run())
    assert [type(m).__name__ for m in seen] == ["SystemMessage", "HumanMessage"]
    assert seen[1].content == "q3"


def test_every_method_runs_as_the_least_privileged_user(server_only, server, raw_client, namespace):
    with (
        app_user_url(server.url, raw_client, namespace) as url,
        MessageStore.from_url(url, StoreConfig(namespace=namespace)) as app,
    ):
        history = KvstoreChatMessageHistory(app, "acl", max_messages=4)
        history.add_messages(conversation())
        history.add_messages(conversation())  # a replay
        assert history.messages == conversation()[-4:]
        assert history.compact("so far", keep_last=1)
        assert (
            KvstoreChatMessageHistory(app, "acl", max_tokens=10_000).messages[-1]
            == conversation()[-1]
        )
        history.clear()
        assert history.messages == []
