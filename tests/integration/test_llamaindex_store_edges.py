"""LlamaIndex's chat store at its edges, on the real servers, sync and async: a bad message
refused with a typed error and nothing written (set_messages keeping the history it would have
replaced), a message another writer stored that no ChatMessage can be made of (skipped and
named, positions counted as get_messages shows them), and positions that are not ints."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock
from pydantic import BaseModel

from kvstore import AsyncMessageStore, MessageStore, StoreConfig, UserMessage, errors
from kvstore.convert import to_chat_completions, to_responses_input
from kvstore.integrations.langchain import KvstoreChatMessageHistory
from kvstore.integrations.llamaindex import KvstoreChatStore
from kvstore.integrations.openai_agents import KvstoreSession
from tests.integration.test_integration_llamaindex import _caller

pytestmark = pytest.mark.usefixtures("server_only")


@pytest.fixture
def store(backend, server, namespace):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        yield made


@pytest.fixture
def call(store, server, namespace, mode):
    """call(name, *args): a chat store's method by its sync name; in async mode its a* version,
    on an async store."""
    loop = asyncio.new_event_loop() if mode == "async" else None
    config = StoreConfig(namespace=namespace)
    async_store = AsyncMessageStore.from_url(server.url, config) if loop else None
    yield _caller(KvstoreChatStore(store, async_store), loop)
    if loop is not None:
        loop.run_until_complete(async_store.close())  # type: ignore[union-attr]
        loop.close()


def said(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


BAD = {
    "a string": "hi",
    "a dict": {"role": "user", "content": "x"},
    "None": None,
    "an object in additional_kwargs": ChatMessage(
        role="user", content="x", additional_kwargs={"o": object()}
    ),
    "too many kept fields": ChatMessage(
        role="user", content="x", additional_kwargs={f"k{n}": "v" * 500 for n in range(40)}
    ),
    "too large": said("x" * (17 << 20)),
}
# Values JSON cannot carry exactly (they would read back as None, a base64 string, a list …).
NOT_JSON = {
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "bytes": b"x",
    "a set": {1, 2},
    "a tuple": (1, 2),
    "a datetime": datetime.datetime(2024, 1, 1),
    "a nan in a list": [1, float("nan")],
    "bytes in a dict": {"a": {"b": b"\xff"}},
    "an int key": {1: "one"},
    "a pydantic model holding bytes": ImageBlock(image=b"\x89PNG"),  # dumps bytes
    "too deep": [
        [
            [
                [
                    [
                        [
                            [
                                [
                                    [
                                        [
                                            [
                                                [
                                                    [
                                                        [
                                                            [
                                                                [
                                                                    [
                                                                        [
                                                                            [
                                                                                [
                                                                                    [
                                                                                        [
                                                                                            [
                                                                                                [
                                                                                                    [
                                                                                                        [
                                                                                                            [
                                                                                                                [
                                                                                                                    [
                                                                                                                        [
                                                                                                                            [
                                                                                                                                [
                                                                                                                                    [
                                                                                                                                        [
                                                                                                                                            [
                                                                                                                                                [
                                                                                                                                                    [
                                                                                                                                                        [
                                                                                                                                                            [
                                                                                                                                                                [
                                                                                                                                                                    [
                                                                                                                                                                        [
                                                                                                                                                                            [
                                                                                                                                                                                [
                                                                                                                                                                                    [
                                                                                                                                                                                        [
                                                                                                                                                                                            [
                                                                                                                                                                                                [
                                                                                                                                                                                                    [
                                                                                                                                                                                                        [
                                                                                                                                                                                                            [
                                                                                                                                                                                                                [
                                                                                                                                                                                                                    [
                                                                                                                                                                                                                        [
                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                                            []
                                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                ]
                                                                                                                                                                                                            ]
                                                                                                                                                                                                        ]
                                                                                                                                                                                                    ]
                                                                                                                                                                                                ]
                                                                                                                                                                                            ]
                                                                                                                                                                                        ]
                                                                                                                                                                                    ]
                                                                                                                                                                                ]
                                                                                                                                                                            ]
                                                                                                                                                                        ]
                                                                                                                                                                    ]
                                                                                                                                                                ]
                                                                                                                                                            ]
                                                                                                                                                        ]
                                                                                                                                                    ]
                                                                                                                                                ]
                                                                                                                                            ]
                                                                                                                                        ]
                                                                                                                                    ]
                                                                                                                                ]
                                                                                                                            ]
                                                                                                                        ]
                                                                                                                    ]
                                                                                                                ]
                                                                                                            ]
                                                                                                        ]
                                                                                                    ]
                                                                                                ]
                                                                                            ]
                                                                                        ]
                                                                                    ]
                                                                                ]
                                                                            ]
                                                                        ]
                                                                    ]
                                                                ]
                                                            ]
                                                        ]
                                                    ]
                                                ]
                                            ]
                                        ]
                                    ]
                                ]
                            ]
                        ]
                    ]
                ]
            ]
        ]
    ],
}
for label, value in NOT_JSON.items():
    BAD[f"{label} in additional_kwargs"] = ChatMessage(
        role="user", content="x", additional_kwargs={"v": value}
    )
BAD["nan in a tool call's kwargs"] = ChatMessage(
    role="assistant",
    content="",
    additional_kwargs={
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
        "score": float("nan"),
    },
)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_message_is_a_typed_error_and_nothing_is_written(call, raw_client, namespace, kind):
    with pytest.raises((errors.InvalidMessage, errors.MessageTooLarge)):
        call("add_message", "k", BAD[kind])
    assert list(raw_client.scan_iter(match=f"{namespace}:*")) == []
    kept = [said(f"m{n}") for n in range(3)]
    call("set_messages", "k", kept)
    for at in (0, 1, 150):  # in the first append of set_messages or a later one
        replacement = [said(f"new {n}") for n in range(200)]
        replacement[at] = BAD[kind]
        with pytest.raises((errors.InvalidMessage, errors.MessageTooLarge)):
            call("set_messages", "k", replacement)
        assert call("get_messages", "k") == kept


def _broken(store: MessageStore, key: str) -> list[int]:
    """Messages another writer stored whose kept LlamaIndex fields make no ChatMessage."""
    broken = [
        {"source": "llamaindex", "source_fields": "{not json"},
        {"source": "llamaindex", "source_fields": "[1]"},
        {"source": "llamaindex", "source_fields": '{"additional_kwargs": [1]}'},
        {"source": "llamaindex", "source_fields": '{"blocks": [{"index": 0}]}'},
        {"source": "llamaindex", "source_fields": '{"all_blocks": [{"block_type": "zzz"}]}'},
        {"source": "llamaindex", "source_fields": '{"texts": [5]}'},  # "bad" is 3 characters
        {"source": "llamaindex", "source_fields": '{"texts": "3"}'},
    ]
    result = store.thread(key).append([UserMessage(content="bad", metadata=m) for m in broken])
    return [m.seq_id for m in result]  # type: ignore[misc]


def test_a_message_no_chat_message_can_be_made_of_is_skipped_and_named(call, store, caplog):
    call("set_messages", "k", [said("m0"), said("m1")])
    sequences = _broken(store, "k")
    call("add_message", "k", said("m2"))
    caplog.set_level(logging.WARNING, logger="kvstore")
    assert call("get_messages", "k") == [said("m0"), said("m1"), said("m2")]
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert all(f"sequence {n}" in warned for n in sequences)
    # Positions are those get_messages shows: the message at 2 is m2.
    assert call("delete_message", "k", 2) == said("m2")
    assert call("delete_last_message", "k") == said("m1")
    assert call("get_messages", "k") == [said("m0")]


def test_bounded_reads_skip_it_too(store):
    KvstoreChatStore(store).set_messages("k", [said("m0")])
    _broken(store, "k")
    KvstoreChatStore(store).add_message("k", said("m1"))
    assert KvstoreChatStore(store, max_messages=2).get_messages("k") == [said("m0"), said("m1")]
    assert KvstoreChatStore(store, max_tokens=10_000).get_messages("k") == [
        said("m0"),
        said("m1"),
    ]


def test_a_position_must_be_an_int(call):
    call("set_messages", "k", [said("m0"), said("m1")])
    for idx in (1.0, "1", None):
        with pytest.raises(TypeError):
            call("delete_message", "k", idx)
    assert call("delete_message", "k", True) == said("m1")  # a bool is an int, as in a list
    assert call("get_messages", "k") == [said("m0")]


def test_get_keys_passes_over_keys_no_thread_is_made_of(store, raw_client, namespace, caplog):
    chat = KvstoreChatStore(store)
    chat.add_message("kept", said("x"))
    raw_client.hset(f"{namespace}:{{not an id}}:meta", "x", "1")
    raw_client.hset(f"{namespace}:{{a}}:b}}:meta", "x", "1")
    raw_client.set(f"{namespace}:{{wrongtype}}:meta", "not a hash")
    caplog.set_level(logging.WARNING, logger="kvstore")
    assert chat.get_keys() == ["kept"]
    assert "wrongtype" in " ".join(r.getMessage() for r in caplog.records)


def test_stores_and_bounds_of_the_wrong_kind_are_refused_when_it_is_made(store, server, namespace):
    async_store = AsyncMessageStore.from_url(server.url, StoreConfig(namespace=namespace))
    with pytest.raises(TypeError, match="MessageStore"):
        KvstoreChatStore(async_store)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AsyncMessageStore"):
        KvstoreChatStore(store, store)  # type: ignore[arg-type]
    for bound in ({"max_messages": True}, {"max_tokens": True}, {"max_messages": 2.5}):
        with pytest.raises(errors.ConfigError):
            KvstoreChatStore(store, **bound)  # type: ignore[arg-type]
    asyncio.run(async_store.close())


def test_tool_calls_with_long_arguments_round_trip(call):
    """An agent's tool call with long arguments (a tool writing a file) is held by the stored
    tool call itself: only what has no kvstore field counts against metadata's 7 KB."""
    big = "x = 1\n" * 5_000  # 30 KB of arguments
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "write", "arguments": big}},
        {"id": "c2", "type": "function", "function": {"name": "read", "arguments": "{}"}},
    ]
    messages = [
        ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": calls[:1]}),
        ChatMessage(role="assistant", content="both", additional_kwargs={"tool_calls": calls}),
        ChatMessage(
            role="assistant", content=None, additional_kwargs={"tool_calls": calls, "other": 1}
        ),
        ChatMessage(role="tool", content=big, additional_kwargs={"tool_call_id": "c1"}),
    ]
    for message in messages:
        call("add_message", "big", message)
    assert call("get_messages", "big") == messages
    call("set_messages", "big2", messages)
    assert call("get_messages", "big2") == messages
    other = {"id": "c3", "type": "function", "function": {"name": "w", "arguments": big}, "x": 1}
    with pytest.raises(errors.InvalidMessage):  # a shape kvstore has no field for: kept, 7 KB
        call(
            "add_message",
            "big",
            ChatMessage(role="assistant", additional_kwargs={"tool_calls": [other]}),
        )


class _Usage(BaseModel):
    tokens: int
    detail: dict[str, float]


def test_json_values_in_additional_kwargs_read_back_equal(call):
    kwargs = {"n": [1, -2.5, 1e300, None, True, "ü"], "d": {"e": {}, "f": []}, "big": 2**70}
    message = ChatMessage(role="user", content="x", additional_kwargs=kwargs)
    call("add_message", "k", message)
    call("set_messages", "k2", [message])
    assert call("get_messages", "k") == call("get_messages", "k2") == [message]
    assert call("get_messages", "k")[0].additional_kwargs == kwargs
    # A pydantic model reads back as LlamaIndex serializes it: its model_dump().
    usage = _Usage(tokens=3, detail={"cached": 0.5})
    call("add_message", "k3", ChatMessage(role="user", additional_kwargs={"usage": usage}))
    assert call("get_messages", "k3")[0].additional_kwargs == {"usage": usage.model_dump()}


def _long_steps() -> list[ChatMessage]:
    """Steps whose text is over metadata's 7 KB but whose other fields are small."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]
    two = [{"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}, *calls]
    long = "t" * 8_000
    return [
        ChatMessage(
            role="system", blocks=[TextBlock(text="s" * 4_000), TextBlock(text="s\n" * 2_000)]
        ),
        ChatMessage(role="system", blocks=[]),
        ChatMessage(role="system", blocks=[TextBlock(text=""), TextBlock(text="")]),
        ChatMessage(role="assistant", content=long, additional_kwargs={"tool_calls": calls}),
        ChatMessage(
            role="assistant",
            blocks=[TextBlock(text=long), TextBlock(text="\n"), TextBlock(text="tail")],
            additional_kwargs={"tool_calls": two, "other": 1},
        ),
        ChatMessage(
            role="assistant",
            blocks=[
                TextBlock(text=long),
                ImageBlock(url="https://example.com/a.png"),  # no kvstore field: kept, small
                TextBlock(text="after"),
            ],
            additional_kwargs={"tool_calls": calls},
        ),
        ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": calls}),
        ChatMessage(
            role="tool",
            blocks=[TextBlock(text="r" * 5_000), TextBlock(text="r" * 5_000)],
            additional_kwargs={"tool_call_id": "c1"},
        ),
        ChatMessage(role="tool", blocks=[], additional_kwargs={"tool_call_id": "c2"}),
        ChatMessage(
            role="tool",
            blocks=[ImageBlock(url="https://example.com/b.png"), TextBlock(text="r" * 9_000)],
            additional_kwargs={"tool_call_id": "c1"},
        ),
    ]


def test_long_text_of_steps_kept_in_blocks_is_stored_natively_and_reads_back_equal(call, store):
    """Only what has no kvstore field counts against metadata's 7 KB: the text of a tool-calling
    step, or of a system or tool message of several blocks, is in the message's own fields."""
    messages = _long_steps()
    for message in messages:
        call("add_message", "long", message)
    assert call("get_messages", "long") == messages
    call("set_messages", "long2", messages)
    assert call("get_messages", "long2") == messages
    for stored in store.thread("long").iter():
        kept = {k: v for k, v in (stored.metadata or {}).items() if k.startswith("source_fields")}
        assert len(json.dumps(kept)) < 1_000
    assert KvstoreChatStore(store, max_messages=3).get_messages("long") == messages[-3:]
    assert call("delete_message", "long", 3) == messages[3]
    assert call("get_messages", "long") == messages[:3] + messages[4:]


def test_a_store_refusing_unknown_fields_keeps_a_tool_calling_steps_text(server, namespace):
    """Such a store has no field for a tool call step's text: it is kept in metadata then."""
    config = StoreConfig(namespace=namespace, unknown_fields="refuse")
    calls = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]
    with MessageStore.from_url(server.url, config) as refusing:
        chat = KvstoreChatStore(refusing)
        short = ChatMessage(
            role="assistant", content="let me look", additional_kwargs={"tool_calls": calls}
        )
        chat.add_message("k", short)
        chat.set_messages("k2", [short])
        assert chat.get_messages("k") == chat.get_messages("k2") == [short]
        with pytest.raises(errors.InvalidMessage):
            chat.add_message(
                "k",
                ChatMessage(
                    role="assistant", content="t" * 8_000, additional_kwargs={"tool_calls": calls}
                ),
            )
        assert chat.get_messages("k") == [short]


def test_a_deleted_message_is_left_out_by_every_reader_of_the_thread(call, store, server):
    """delete_message leaves a tombstone in the message's place (its sequence is never reused):
    the thread's own context, kvstore's converters and the other adapters leave it out too, and
    this store leaves out an item the Agents session retracted (pop_item)."""
    gone = ChatMessage(role="assistant", content="gone")
    call("set_messages", "k", [said("u1"), gone, said("u2")])
    call("delete_message", "k", 1)
    call("add_message", "k", ChatMessage(role="assistant", content="a2"))
    call("delete_last_message", "k")
    context = store.thread("k").context()
    said_in_context = [m for m in context if m.message_type != "hidden_reasoning_message"]
    assert [m.content for m in said_in_context] == ["u1", "u2"]
    assert [m["content"] for m in to_chat_completions(context)] == ["u1", "u2"]
    assert [item["content"] for item in to_responses_input(context)] == ["u1", "u2"]
    assert [m.content for m in KvstoreChatMessageHistory(store, "k").messages] == ["u1", "u2"]

    async def agents_pop() -> None:
        agents_store = AsyncMessageStore.from_url(server.url, store.config)
        try:
            session = KvstoreSession("k", agents_store)
            await session.add_items([{"role": "user", "content": "u3"}])
            assert await session.pop_item() == {"role": "user", "content": "u3"}
        finally:
            await agents_store.close()

    asyncio.run(agents_pop())
    assert call("get_messages", "k") == [said("u1"), said("u2")]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_bounded_read_past_many_deleted_messages_takes_few_round_trips(
    store, server, namespace, asynchronous
):
    """Deleted messages in the newest pages are passed over by older pages that grow: 300 of
    them cost a handful of round trips, not one page of max_messages each."""
    from kvstore.integrations._llamaindex_convert import tombstone

    thread = store.thread("k")
    thread.append(UserMessage(content="keep"))
    thread.append([tombstone() for _ in range(300)])
    requests: list = []
    if not asynchronous:
        store._on_request = requests.append
        assert [m.content for m in KvstoreChatStore(store, max_messages=1).get_messages("k")] == [
            "keep"
        ]
    else:

        async def main() -> list[str | None]:
            async with AsyncMessageStore.from_url(
                server.url, StoreConfig(namespace=namespace)
            ) as s:
                s._on_request = requests.append
                chat = KvstoreChatStore(store, s, max_messages=1)
                return [m.content for m in await chat.aget_messages("k")]

        assert asyncio.run(main()) == ["keep"]
    assert len(requests) <= 14, len(requests)
