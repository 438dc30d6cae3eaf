"""LangChain's chat message history at its edges, on the real servers: the same words said again
later in the conversation, messages given as any iterable, bad messages refused with a typed
error and nothing written, a message another writer stored that no LangChain message can be
made of (skipped and named, as kvstore's page reads skip a bad record), and compaction bounds."""

from __future__ import annotations

import asyncio
import logging
import math

import pytest
from langchain_core import messages as lc

from kvstore import AsyncMessageStore, MessageStore, StoreConfig, UserMessage, errors
from kvstore.integrations.langchain import KvstoreChatMessageHistory


@pytest.fixture
def store(backend, server_only, server, namespace):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        yield made


def contents(history: KvstoreChatMessageHistory) -> list[str]:
    return [m.content for m in history.messages]  # type: ignore[misc]


def test_the_same_words_said_again_later_are_stored(store):
    history = KvstoreChatMessageHistory(store, "t")
    for _ in range(2):
        history.add_user_message("yes")
        history.add_ai_message("ok")
    assert contents(history) == ["yes", "ok", "yes", "ok"]
    turn = [lc.HumanMessage("hi"), lc.AIMessage("hello")]
    history.add_messages(turn)
    history.add_messages(turn)  # sent again right away: a replay
    history.add_messages([lc.HumanMessage("what?")])
    history.add_messages(turn)  # the same turn later: stored
    assert contents(history) == ["yes", "ok", "yes", "ok", "hi", "hello", "what?", "hi", "hello"]


def test_the_same_words_said_again_later_are_stored_async(backend, server_only, server, namespace):
    async def main() -> list[str]:
        async with AsyncMessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as s:
            history = KvstoreChatMessageHistory(s, "t")
            for _ in range(2):
                await history.aadd_messages([lc.HumanMessage("yes")])
                await history.aadd_messages([lc.HumanMessage("yes")])  # a replay
                await history.aadd_messages([lc.AIMessage("ok")])
            return [m.content for m in await history.aget_messages()]  # type: ignore[misc]

    assert asyncio.run(main()) == ["yes", "ok", "yes", "ok"]


def test_messages_may_come_as_any_iterable(store):
    history = KvstoreChatMessageHistory(store, "t")
    history.add_messages(iter([lc.HumanMessage("from"), lc.AIMessage("an iterator")]))
    history.add_messages(m for m in [lc.HumanMessage("a generator")])
    assert contents(history) == ["from", "an iterator", "a generator"]


BAD = {
    "a string": ["hi"],
    "a dict": [{"type": "human", "data": {"content": "x"}}],
    "None": [None],
    "an object in additional_kwargs": [lc.HumanMessage("x", additional_kwargs={"o": object()})],
    "bytes in additional_kwargs": [lc.HumanMessage("x", additional_kwargs={"o": b"x"})],
    "a set in response_metadata": [lc.AIMessage("x", response_metadata={"s": {1}})],
    "too many kept fields": [lc.HumanMessage("x", additional_kwargs={"o": "y" * 10_000})],
    # Numbers JSON cannot carry, wherever a message keeps free-form JSON.
    "NaN in additional_kwargs": [lc.AIMessage("x", additional_kwargs={"n": math.nan})],
    "infinity deep in additional_kwargs": [
        lc.HumanMessage("x", additional_kwargs={"o": [{"i": -math.inf}]})
    ],
    "NaN in response_metadata": [lc.AIMessage("x", response_metadata={"score": math.nan})],
    "infinity in a tool call's args": [
        lc.AIMessage("", tool_calls=[{"name": "f", "args": {"x": math.inf}, "id": "c1"}])
    ],
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_message_is_a_typed_error_and_nothing_is_written(store, raw_client, namespace, kind):
    history = KvstoreChatMessageHistory(store, "bad")
    with pytest.raises(errors.InvalidMessage):
        history.add_messages([lc.HumanMessage("good"), *BAD[kind]])
    with pytest.raises(errors.InvalidMessage):
        history.add_message(BAD[kind][0])
    assert history.messages == []
    assert list(raw_client.scan_iter(match=f"{namespace}:*")) == []


def test_too_large_and_bad_ids_write_nothing(store, raw_client, namespace):
    with pytest.raises(errors.MessageTooLarge):
        KvstoreChatMessageHistory(store, "big").add_messages([lc.HumanMessage("x" * (17 << 20))])
    with pytest.raises(errors.InvalidThreadId):
        KvstoreChatMessageHistory(store, "not a {thread} id")
    with pytest.raises(errors.InvalidCursor):
        KvstoreChatMessageHistory(store, "t", max_tokens=0)
    assert list(raw_client.scan_iter(match=f"{namespace}:*")) == []


def _others(store: MessageStore, thread_id: str) -> list[int]:
    """Messages another writer stored that claim to come from LangChain but whose kept fields
    make no LangChain message; returns their sequences."""
    broken = [
        {"source": "langchain", "source_position": "1", "source_fields": "{not json"},
        {"source": "langchain", "source_position": "2", "source_fields": "[1, 2]"},
        {"source": "langchain", "source_position": "3", "source_fields": '{"type": 5, "data": 7}'},
        {
            "source": "langchain",
            "source_position": "4",
            "source_fields": '{"additional_kwargs": 5}',
        },
    ]
    result = store.thread(thread_id).append(
        [UserMessage(content="bad", metadata=metadata) for metadata in broken]
    )
    return [m.seq_id for m in result]  # type: ignore[misc]


def test_a_message_no_langchain_message_can_be_made_of_is_skipped_and_named(store, caplog):
    history = KvstoreChatMessageHistory(store, "t", max_messages=10)
    history.add_messages([lc.HumanMessage("before")])
    sequences = _others(store, "t")
    history.add_messages([lc.AIMessage("after")])
    caplog.set_level(logging.WARNING, logger="kvstore")
    assert contents(history) == ["before", "after"]
    assert contents(KvstoreChatMessageHistory(store, "t", max_tokens=10_000)) == ["before", "after"]
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert all(f"sequence {n}" in warned for n in sequences)


def test_compaction_keeps_any_number_and_refuses_a_negative_one(store):
    history = KvstoreChatMessageHistory(store, "c", max_tokens=1_000_000)
    for start in range(0, 1200, 400):  # at most 500 messages in one append
        history.add_messages([lc.HumanMessage(f"q{n}") for n in range(start, start + 400)])
    assert history.compact("q0 to q99", keep_last=1100) is True
    seen = history.messages
    assert "q0 to q99" in seen[0].content and len(seen) == 1101  # type: ignore[operator]
    with pytest.raises(ValueError, match="keep_last"):
        history.compact("x", keep_last=-1)


@pytest.mark.filterwarnings(
    "ignore:RunnableWithMessageHistory is deprecated:langchain_core._api.deprecation.LangChainDeprecationWarning"
)
def test_the_async_methods_run_on_a_sync_store_as_the_base_class_runs_them(store):
    """BaseChatMessageHistory's a-methods run the sync ones in an executor: an async chain
    (RunnableWithMessageHistory.ainvoke) works on a history made with a sync store."""
    from langchain_core.language_models import GenericFakeChatModel
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_core.runnables.history import RunnableWithMessageHistory

    model = GenericFakeChatModel(messages=iter(["Hello!", "Sunny."]))
    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | model,
        lambda session_id: KvstoreChatMessageHistory(store, session_id),
        input_messages_key="question",
        history_messages_key="history",
    )

    async def main() -> list[str]:
        for question in ("hi", "weather?"):
            await chain.ainvoke({"question": question}, {"configurable": {"session_id": "s"}})
        history = KvstoreChatMessageHistory(store, "s", max_tokens=10_000)
        await history.aadd_messages([lc.HumanMessage("bye")])
        assert await history.acompact("greetings", keep_last=1) is True
        seen = [m.content for m in await history.aget_messages()]
        await history.aclear()
        assert await history.aget_messages() == []
        return seen  # type: ignore[return-value]

    seen = asyncio.run(main())
    assert "greetings" in seen[0] and seen[1:] == ["bye"]
    assert contents(KvstoreChatMessageHistory(store, "s")) == []


def _with_calls() -> list[lc.BaseMessage]:
    """A conversation whose AI message with text and two tool calls is three kvstore messages."""
    calls = [{"name": "a", "args": {}, "id": "c1"}, {"name": "b", "args": {"x": 1}, "id": "c2"}]
    return [
        lc.HumanMessage("q"),
        lc.AIMessage("let me look", tool_calls=calls),
        lc.ToolMessage("r1", tool_call_id="c1"),
        lc.ToolMessage("r2", tool_call_id="c2"),
        lc.AIMessage("done"),
    ]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6])
def test_the_newest_page_counts_langchain_messages_and_never_cuts_one(store, count):
    conversation = _with_calls()
    KvstoreChatMessageHistory(store, "t").add_messages(conversation)
    assert store.thread("t").stats().stored_messages == 7
    assert (
        KvstoreChatMessageHistory(store, "t", max_messages=count).messages
        == (conversation[-count:])
    )


@pytest.mark.parametrize(("keep_last", "kept"), [(1, 1), (2, 4), (3, 4), (4, 4)])
def test_compaction_keeps_whole_langchain_messages(store, keep_last, kept):
    """keep_last counts LangChain messages; a tool answer kept keeps its call's whole message
    (kvstore's compaction never covers half of a pair)."""
    conversation = _with_calls()
    history = KvstoreChatMessageHistory(store, "c", max_tokens=100_000)
    history.add_messages(conversation)
    assert history.compact("earlier", keep_last=keep_last) is True
    seen = history.messages
    assert "earlier" in seen[0].content and seen[1:] == conversation[-kept:]  # type: ignore[operator]
    assert history.compact("earlier", keep_last=keep_last) is True  # the same range: a replay
    assert history.compact("all", keep_last=5) is False


def test_the_newest_page_past_many_deleted_messages_takes_few_round_trips(store, server, namespace):
    """Messages another adapter deleted (LlamaIndex's tombstones) are passed over by older pages
    that grow: 300 of them cost a handful of round trips, sync and async."""
    from kvstore.integrations._llamaindex_convert import tombstone

    thread = store.thread("t")
    thread.append(UserMessage(content="keep"))
    thread.append([tombstone() for _ in range(300)])
    requests: list = []
    store._on_request = requests.append
    assert contents(KvstoreChatMessageHistory(store, "t", max_messages=1)) == ["keep"]
    assert len(requests) <= 14, len(requests)

    async def main() -> list:
        async with AsyncMessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as s:
            s._on_request = requests.append
            found = await KvstoreChatMessageHistory(s, "t", max_messages=1).aget_messages()
            return [m.content for m in found]

    requests.clear()
    assert asyncio.run(main()) == ["keep"]
    assert len(requests) <= 14, len(requests)


def _long_running_call(thread) -> None:
    """A tool call open across a compaction: [1 user] [2 call] [3 ai] [4 S1 covering 1] [5 user]
    [6 ai] [7 return] [8 ai] [9 user]."""
    from kvstore import AssistantMessage, ToolCallMessage, ToolReturnMessage

    call = {"name": "book", "arguments": "{}", "tool_call_id": "c1"}
    thread.append([UserMessage(content="book"), ToolCallMessage(tool_call=call)])
    thread.append(AssistantMessage(content="searching"))
    thread.compact("S1", 1)
    thread.append([UserMessage(content="a hotel too"), AssistantMessage(content="noted")])
    thread.append(ToolReturnMessage(status="success", tool_call_id="c1", tool_return="ok"))
    thread.append([AssistantMessage(content="booked"), UserMessage(content="thanks")])


def test_a_compaction_the_pair_rule_cannot_store_is_refused(store, backend, server, namespace):
    """compact() whose boundary the pair rule would move onto the summary in force raises
    InvalidSummaryRange (sync and async): the summary is never dropped while it says True."""
    history = KvstoreChatMessageHistory(store, "c", max_tokens=100_000)
    _long_running_call(store.thread("c"))
    with pytest.raises(errors.InvalidSummaryRange, match="not stored"):
        history.compact("S2", keep_last=3)
    assert store.thread("c").stats().summary_last_sequence == 1

    async def run() -> None:
        async with AsyncMessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as s:
            with pytest.raises(errors.InvalidSummaryRange, match="not stored"):
                await KvstoreChatMessageHistory(s, "c").acompact("S2", keep_last=3)

    asyncio.run(run())
    assert store.thread("c").stats().stored_messages == 9
