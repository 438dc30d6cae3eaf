"""kvstore.integrations.llamaindex: KvstoreChatStore under LlamaIndex's own memory and chat
engine, and the chat-store contract, on the real servers, sync and async."""

from __future__ import annotations

import asyncio
import threading

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.storage.chat_store.redis import RedisChatStore
from pydantic import Field

from kvstore import AssistantMessage, AsyncMessageStore, MessageStore, StoreConfig, errors
from kvstore.importers import import_llamaindex
from kvstore.integrations.llamaindex import KvstoreChatStore
from tests.support.acl import app_user_url

pytestmark = pytest.mark.usefixtures("server_only")


@pytest.fixture
def store(backend, server, namespace):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        yield made


@pytest.fixture
def chat_store(store, server, namespace, mode):
    """call(name, *args): a chat store's method by its sync name, its a* version (on an async
    store) in async mode."""
    loop = asyncio.new_event_loop() if mode == "async" else None
    async_store = (
        AsyncMessageStore.from_url(server.url, StoreConfig(namespace=namespace)) if loop else None
    )
    made = KvstoreChatStore(store, async_store)
    yield _caller(made, loop)
    if loop is not None:
        loop.run_until_complete(async_store.close())
        loop.close()


_ASYNC_NAMES = {"add_message": "async_add_message"}


def _caller(chat_store, loop):
    def call(name, *args):
        if loop is None:
            return getattr(chat_store, name)(*args)
        method = getattr(chat_store, _ASYNC_NAMES.get(name, f"a{name}"))
        return loop.run_until_complete(method(*args))

    return call


def conversation() -> list[ChatMessage]:
    calls = [
        {"id": "call-1", "type": "function", "function": {"name": "weather", "arguments": "{}"}},
        {"id": "call-2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
    ]
    return [
        ChatMessage(role="system", content="You are a weather bot."),
        ChatMessage(
            role="user",
            blocks=[
                TextBlock(text="Weather here? 🌧 ünïcode"),
                ImageBlock(image=b"\x89PNG\r\n\x1a\n", image_mimetype="image/png"),
            ],
        ),
        ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": calls}),
        ChatMessage(role="tool", content="cloudy", additional_kwargs={"tool_call_id": "call-1"}),
        ChatMessage(
            role="tool", content="09:00", additional_kwargs={"tool_call_id": "call-2", "x": [1]}
        ),
        ChatMessage(role="assistant", content="Cloudy at nine."),
        ChatMessage(role="tool", content="no call id"),
    ]


def test_messages_round_trip_equal(chat_store):
    call = chat_store
    for message in conversation():
        call("add_message", "chat-1", message)
    assert call("get_messages", "chat-1") == conversation()
    call("set_messages", "chat-2", conversation()[::-1])
    assert call("get_messages", "chat-2") == conversation()[::-1]
    assert call("get_messages", "chat-1") == conversation()


def test_contract_deletes(chat_store):
    call = chat_store
    messages = [ChatMessage(role="user", content=f"m{n}") for n in range(5)]
    call("set_messages", "k", messages)
    assert call("delete_message", "k", 1) == messages[1]
    assert call("delete_message", "k", 10) is None
    assert call("delete_last_message", "k") == messages[4]
    assert call("get_messages", "k") == [messages[0], messages[2], messages[3]]
    assert call("delete_message", "k", 1) == messages[2]
    assert call("get_messages", "k") == [messages[0], messages[3]]
    call("delete_messages", "k")
    assert call("get_messages", "k") == []
    assert call("delete_last_message", "k") is None
    assert call("delete_message", "k", 0) is None
    assert call("delete_messages", "never") is None


def test_isolation_by_key_and_namespace(chat_store, store, server, namespace):
    call = chat_store
    call("add_message", "a", ChatMessage(role="user", content="for a"))
    call("add_message", "b", ChatMessage(role="user", content="for b"))
    assert [m.content for m in call("get_messages", "a")] == ["for a"]
    other = StoreConfig(namespace=f"{namespace}-other")
    with MessageStore.from_url(server.url, other) as elsewhere:
        assert KvstoreChatStore(elsewhere).get_messages("a") == []
        assert KvstoreChatStore(elsewhere).get_keys() == []
    assert call("get_keys") == ["a", "b"]


def test_bounded_reads_give_the_newest_page_or_the_context(store):
    messages = [ChatMessage(role="user", content=f"message {n}") for n in range(120)]
    KvstoreChatStore(store).set_messages("long", messages)
    assert KvstoreChatStore(store, max_messages=50).get_messages("long") == messages[-50:]
    KvstoreChatStore(store).delete_message("long", 100)  # a deleted message's place is filled
    assert KvstoreChatStore(store, max_messages=50).get_messages("long") == (
        messages[-51:-20] + messages[-19:]
    )
    thread = store.thread("long")
    thread.compact("They counted to 99.", thread.stats().next_sequence - 21)
    history = KvstoreChatStore(store, max_tokens=10_000).get_messages("long")
    assert history[0].role == "system" and history[0].content == "They counted to 99."
    assert history[1:] == messages[-19:]  # after the summary: message 100 was deleted
    with pytest.raises(errors.ConfigError):
        KvstoreChatStore(store, max_messages=0)


def test_concurrent_adds_all_land_once(store):
    chat = KvstoreChatStore(store)

    def add(worker: int) -> None:
        for n in range(25):
            chat.add_message("busy", ChatMessage(role="user", content=f"{worker}-{n}"))

    workers = [threading.Thread(target=add, args=(w,)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    got = [m.content for m in chat.get_messages("busy")]
    assert sorted(got) == sorted(f"{w}-{n}" for w in range(4) for n in range(25))
    for w in range(4):  # each worker's own order kept
        mine = [c for c in got if c.startswith(f"{w}-")]
        assert mine == [f"{w}-{n}" for n in range(25)]


def test_a_natively_stored_thread_reads_as_chat_messages(store):
    store.thread("native").append(AssistantMessage(content="from elsewhere"))
    (message,) = KvstoreChatStore(store).get_messages("native")
    assert (message.role, message.content) == ("assistant", "from elsewhere")


def test_bad_input_is_a_typed_error_and_writes_nothing(store):
    chat = KvstoreChatStore(store)
    with pytest.raises(errors.InvalidThreadId):
        chat.add_message("bad {key}", ChatMessage(role="user", content="x"))
    huge = {f"k{n}": "v" * 500 for n in range(40)}
    with pytest.raises(errors.InvalidMessage):
        chat.add_message("k", ChatMessage(role="user", content="x", additional_kwargs=huge))
    assert chat.get_messages("k") == []


class ScriptedLLM(CustomLLM):
    """Answers "answer <n>" to its n-th prompt, and keeps the prompts it was handed."""

    prompts: list[str] = Field(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs) -> CompletionResponse:
        self.prompts.append(prompt)
        return CompletionResponse(text=f"answer {len(self.prompts)}")

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs):
        raise NotImplementedError


def test_simple_chat_engine_drives_a_multi_turn_conversation(store):
    chat = KvstoreChatStore(store, max_messages=4)
    memory = ChatMemoryBuffer.from_defaults(chat_store=chat, chat_store_key="engine-1")
    llm = ScriptedLLM()
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    for n in range(5):
        assert str(engine.chat(f"question {n}")) == f"answer {n + 1}"
    # The model was handed the newest page (4 messages), never the whole thread.
    assert "question 0" in llm.prompts[1]
    assert "question 0" not in llm.prompts[2] and "answer 2" in llm.prompts[2]
    last = llm.prompts[4]
    assert "question 4" in last and "answer 4" in last
    assert "question 0" not in last and "question 1" not in last
    stored = KvstoreChatStore(store).get_messages("engine-1")
    assert [m.role.value for m in stored] == ["user", "assistant"] * 5
    assert [m.content for m in stored[-2:]] == ["question 4", "answer 5"]


def test_async_chat_engine_with_the_async_store(server, namespace, store):
    async def run() -> list[ChatMessage]:
        async with AsyncMessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as a:
            chat = KvstoreChatStore(store, a)
            memory = ChatMemoryBuffer.from_defaults(chat_store=chat, chat_store_key="engine-a")
            engine = SimpleChatEngine.from_defaults(llm=ScriptedLLM(), memory=memory)
            for n in range(3):
                assert str(await engine.achat(f"async question {n}")) == f"answer {n + 1}"
            return await chat.aget_messages("engine-a")

    stored = asyncio.run(run())
    assert [m.content for m in stored[::2]] == [f"async question {n}" for n in range(3)]
    assert [m.content for m in stored[1::2]] == [f"answer {n + 1}" for n in range(3)]


def test_a_chat_imported_from_redis_chat_store_reads_back_equal(
    store, server, raw_client, namespace
):
    peer = RedisChatStore(redis_url=server.url)
    key = f"{namespace}:chat:imported"
    messages = [m for m in conversation() if m.role.value != "assistant" or m.content]
    peer.set_messages(key, messages)
    peer._redis_client.close()
    (result,) = import_llamaindex(store, raw_client, pattern=key)
    assert result.error is None
    assert KvstoreChatStore(store).get_messages(key) == messages


def test_every_method_but_get_keys_runs_as_the_least_privileged_user(server, raw_client, namespace):
    with (
        app_user_url(server.url, raw_client, namespace) as url,
        MessageStore.from_url(url, StoreConfig(namespace=namespace)) as app,
    ):
        chat = KvstoreChatStore(app, max_messages=3)
        chat.set_messages("acl", conversation())
        chat.add_message("acl", ChatMessage(role="user", content="one more"))
        assert chat.delete_last_message("acl").content == "one more"
        assert chat.delete_message("acl", 0) == conversation()[0]
        assert chat.get_messages("acl") == conversation()[-3:]
        with pytest.raises(errors.PermissionDenied):
            chat.get_keys()
