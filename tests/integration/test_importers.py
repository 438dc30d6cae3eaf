"""Importers from LangChain's RedisChatMessageHistory and LlamaIndex's RedisChatStore, on real
servers, with conversations written by those packages' own classes: every message is compared,
a second run stores nothing, an interrupted run resumes, the source keys are left as they were,
and `kvstore export --format langchain` gives LangChain back the messages it wrote."""

from __future__ import annotations

import asyncio
import io
import json
import math
import warnings

import pytest
import redis
import redis.asyncio

from kvstore import AsyncMessageStore, MessageStore, StoreConfig, ToolCallMessage, errors
from kvstore.cli.main import main as cli
from kvstore.importers import (
    SOURCE_FIELDS_MAX,
    append_missing,
    import_langchain,
    import_langchain_async,
    import_llamaindex,
    import_llamaindex_async,
    langchain_left_out,
    to_langchain,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community announces its sunset
    from langchain_community.chat_message_histories import RedisChatMessageHistory
from langchain_core import messages as lc
from llama_index.core.base.llms.types import ImageBlock, TextBlock, ThinkingBlock, ToolCallBlock
from llama_index.core.llms import ChatMessage
from llama_index.storage.chat_store.redis import RedisChatStore


@pytest.fixture
def store(backend, server_only, server, namespace):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        yield made


def langchain_conversation(n: int = 0) -> list[lc.BaseMessage]:
    return [
        lc.SystemMessage("You are a weather bot."),
        lc.HumanMessage(f"Weather in Oslo? ({n})", id=f"h-{n}"),
        lc.AIMessage(
            "Let me look.",
            tool_calls=[
                {"name": "weather", "args": {"city": "Oslo"}, "id": f"call-{n}-1"},
                {"name": "time", "args": {"tz": "Europe/Oslo"}, "id": f"call-{n}-2"},
            ],
            response_metadata={"model_name": "gpt-4o", "finish_reason": "tool_calls"},
            usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
        ),
        lc.ToolMessage(
            "cloudy, 4 °C", tool_call_id=f"call-{n}-1", name="weather", artifact={"raw": [1, 2]}
        ),
        lc.ToolMessage("timeout", tool_call_id=f"call-{n}-2", status="error"),
        lc.AIMessage(
            "", tool_calls=[{"name": "weather", "args": {"city": "Bergen"}, "id": f"call-{n}-3"}]
        ),
        lc.ToolMessage("rain", tool_call_id=f"call-{n}-3"),
        lc.AIMessage("Cloudy and 4 °C; Bergen has rain.", additional_kwargs={"refusal": None}),
        lc.HumanMessage(
            content=[
                {"type": "text", "text": "And this chart?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://example.com/c.png", "detail": "low"},
                },
            ]
        ),
        lc.HumanMessage(
            content=[
                {"type": "text", "text": "and audio"},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            ]
        ),
        lc.ChatMessage(role="critic", content="Too terse."),
        lc.FunctionMessage(name="legacy", content="42"),
        lc.AIMessageChunk(content="streamed"),
        lc.AIMessage("bye", name="bot", id="run-1"),
    ]


def write_langchain(url: str, prefix: str, sessions: dict[str, list[lc.BaseMessage]]) -> None:
    for session, messages in sessions.items():
        history = RedisChatMessageHistory(session, url=url, key_prefix=prefix)
        for message in messages:  # one LPUSH each, as a chat application writes them
            history.add_message(message)


def source_dump(client, pattern: str) -> dict[bytes, bytes]:
    return {key: client.dump(key) for key in client.scan_iter(match=pattern)}


def test_langchain_import_compares_message_by_message(store, server, raw_client, namespace):
    prefix = f"{namespace}:message_store:"
    sessions = {"s-1": langchain_conversation(1), "s-2": langchain_conversation(2)[:3], "empty": []}
    write_langchain(server.url, prefix, sessions)
    raw_client.rpush(f"{prefix}not-json", b"{oops")
    # Valid JSON, nested past the parser's depth: a session's error, not a RecursionError.
    raw_client.rpush(
        f"{prefix}too-deep", b'{"type": "human", "data": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    )
    before = source_dump(raw_client, f"{prefix}*")

    results = {r.thread_id: r for r in import_langchain(store, raw_client, key_prefix=prefix)}

    assert source_dump(raw_client, f"{prefix}*") == before  # the source keys are untouched
    assert set(results) == {"s-1", "s-2", "not-json", "too-deep"}  # an empty list is no key
    assert "not JSON" in results["not-json"].error and results["not-json"].imported == 0
    assert "too deep" in results["too-deep"].error and results["too-deep"].imported == 0
    assert store.thread("too-deep").stats().stored_messages == 0
    one = results["s-1"]
    assert (one.error, one.source_messages, one.imported, one.already) == (None, 14, 14, 0)
    assert one.stored_messages == 16  # an AI message with text and two calls makes three
    stored = list(store.thread("s-1").iter())
    kinds = [m.message_type for m in stored]
    assert kinds == [
        "system_message",
        "user_message",
        "assistant_message",
        "tool_call_message",
        "tool_call_message",
        "tool_return_message",
        "tool_return_message",
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
        "user_message",
        "user_message",
        "user_message",
        "tool_return_message",
        "assistant_message",
        "assistant_message",
    ]
    assert stored[1].content == "Weather in Oslo? (1)"
    assert [m.tool_call.name for m in stored if isinstance(m, ToolCallMessage)] == [
        "weather",
        "time",
        "weather",
    ]
    assert json.loads(stored[3].tool_call.arguments) == {"city": "Oslo"}
    assert (stored[5].tool_call_id, stored[5].tool_return, stored[5].status) == (
        "call-1-1",
        "cloudy, 4 °C",
        "success",
    )
    assert stored[6].status == "error"
    image = stored[10].content[1].source
    assert (image.type, image.media_type, image.data) == ("base64", "image/png", "iVBORw0KGgo=")
    assert stored[10].content[2].source.url == "https://example.com/c.png"
    assert stored[12].name == "critic" and stored[12].content == "Too terse."
    # what has no kvstore field is kept in metadata, not dropped
    fields = json.loads(stored[2].metadata["source_fields"])
    assert (
        fields["usage_metadata"]["total_tokens"] == 15
        and fields["response_metadata"]["model_name"] == "gpt-4o"
    )
    assert "input_audio" in stored[11].metadata["source_fields"]
    assert {m.metadata["source"] for m in stored} == {"langchain"}

    # and back: LangChain reads the export as the messages it wrote
    exported = lc.messages_from_dict(to_langchain(store.thread("s-1").iter()))
    assert exported == langchain_conversation(1)
    assert (
        lc.messages_from_dict(to_langchain(store.thread("s-2").iter()))
        == langchain_conversation(2)[:3]
    )


def test_langchain_import_twice_stores_nothing_twice(store, server, raw_client, namespace):
    prefix = f"{namespace}:message_store:"
    write_langchain(server.url, prefix, {f"s-{n}": langchain_conversation(n) for n in range(3)})
    first = import_langchain(store, raw_client, key_prefix=prefix)
    assert [r.imported for r in first] == [14, 14, 14]
    counts = {r.thread_id: store.thread(r.thread_id).stats().stored_messages for r in first}

    again = import_langchain(store, raw_client, key_prefix=prefix)
    assert [(r.imported, r.already, r.stored_messages) for r in again] == [(0, 14, 0)] * 3
    assert {r.thread_id: store.thread(r.thread_id).stats().stored_messages for r in again} == counts

    # the session goes on in LangChain; the next import brings only what is new
    write_langchain(
        server.url, prefix, {"s-1": [lc.HumanMessage("one more"), lc.AIMessage("sure")]}
    )
    grown = {r.thread_id: r for r in import_langchain(store, raw_client, key_prefix=prefix)}
    assert (grown["s-1"].imported, grown["s-1"].already, grown["s-1"].stored_messages) == (2, 14, 2)
    assert [m.content for m in list(store.thread("s-1").iter())[-2:]] == ["one more", "sure"]


def test_interrupted_import_resumes(store, server, raw_client, namespace):
    prefix = f"{namespace}:message_store:"
    conversation = [
        lc.HumanMessage(f"q{n}") if n % 2 == 0 else lc.AIMessage(f"a{n}") for n in range(1000)
    ]
    write_langchain(server.url, prefix, {"long": conversation})
    appends = []

    def fail_after_three(key, done):
        appends.append(done)
        if len(appends) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_langchain(
            store, raw_client, key_prefix=prefix, batch_messages=50, progress=fail_after_three
        )
    assert store.thread("long").stats().stored_messages == 150  # three whole appends, a prefix

    (resumed,) = import_langchain(store, raw_client, key_prefix=prefix, batch_messages=50)
    assert (resumed.imported, resumed.already, resumed.stored_messages) == (850, 150, 850)
    stored = list(store.thread("long").iter())
    assert [m.content for m in stored] == [m.content for m in conversation]
    assert [m.seq_id for m in stored] == list(range(1, 1001))


def test_a_batch_stored_before_its_reply_is_not_stored_again(store, server, raw_client, namespace):
    # the first append of a session stored, its caller gone before it knew: the ids find it
    prefix = f"{namespace}:message_store:"
    write_langchain(server.url, prefix, {"s": langchain_conversation(0)})
    import_langchain(store, raw_client, key_prefix=prefix, batch_messages=4)
    thread = store.thread("s")
    messages = list(thread.iter())
    assert append_missing(thread, messages[:5]) == (0, 5)
    assert thread.stats().stored_messages == len(messages)


def test_invalid_session_id_and_oversized_fields_are_reported(store, server, raw_client, namespace):
    prefix = f"{namespace}:message_store:"
    write_langchain(
        server.url,
        prefix,
        {
            "has space": [lc.HumanMessage("hi")],
            "big": [lc.AIMessage("x", response_metadata={"logprobs": "y" * SOURCE_FIELDS_MAX})],
            "fine": [lc.HumanMessage("hi")],
        },
    )
    results = {
        r.source_key[len(prefix) :]: r
        for r in import_langchain(store, raw_client, key_prefix=prefix)
    }
    assert "may hold only" in results["has space"].error
    assert "metadata" in results["big"].error and results["big"].imported == 0
    assert results["fine"].imported == 1 and results["fine"].error is None
    named = import_langchain(
        store, raw_client, key_prefix=prefix, thread_id=lambda key: key.replace(" ", "-")[-9:]
    )
    assert {r.thread_id for r in named if r.error is None} >= {"has-space"}


def test_a_number_json_cannot_carry_is_refused_by_message(store, server, raw_client, namespace):
    # The peers write Python's json.dumps, which writes NaN and Infinity; kvstore keeps the
    # source's fields as standard JSON, so such a message is refused by name, as any bad one
    # (what came before it stays, as after any refused message).
    prefix = f"{namespace}:message_store:"
    write_langchain(
        server.url,
        prefix,
        {
            "nan-kwargs": [
                lc.HumanMessage("hi"),
                lc.AIMessage("x", additional_kwargs={"n": math.nan}),
            ],
            "inf-args": [
                lc.HumanMessage("hi"),
                lc.AIMessage("", tool_calls=[{"name": "f", "args": {"x": math.inf}, "id": "c1"}]),
            ],
            "fine": [lc.HumanMessage("hi")],
        },
    )
    results = {
        r.source_key[len(prefix) :]: r
        for r in import_langchain(store, raw_client, key_prefix=prefix, batch_messages=10)
    }
    for name in ("nan-kwargs", "inf-args"):
        assert results[name].error_type == "InvalidMessage", results[name]
        assert "message 1" in results[name].error and results[name].imported == 1
        assert [m.content for m in store.thread(name).iter()] == ["hi"]
    assert results["fine"].imported == 1 and results["fine"].error is None

    # LlamaIndex's own store writes null for them; another writer's json.dumps does not.
    raw_client.rpush(
        f"{namespace}:chat:inf",
        b'{"role":"user","content":"hi"}',
        b'{"role":"assistant","blocks":[{"block_type":"tool_call","tool_call_id":"c1",'
        b'"tool_name":"f","tool_kwargs":{"x":-Infinity}}]}',
    )
    [result] = import_llamaindex(store, raw_client, pattern=f"{namespace}:chat:*")
    assert result.error_type == "InvalidMessage" and result.imported == 1, result


def test_llamaindex_import_compares_message_by_message(store, server, raw_client, namespace):
    chat_store = RedisChatStore(redis_url=server.url)
    conversation = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather in Oslo?"),
        ChatMessage(
            role="assistant",
            content=None,
            additional_kwargs={
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ]
            },
        ),
        ChatMessage(
            role="tool",
            content="cloudy",
            additional_kwargs={"tool_call_id": "c1", "name": "weather"},
        ),
        ChatMessage(
            role="assistant",
            blocks=[
                ThinkingBlock(content="short answer"),
                ToolCallBlock(tool_call_id="c2", tool_name="time", tool_kwargs={"tz": "CET"}),
                TextBlock(text="Cloudy."),
            ],
        ),
        ChatMessage(
            role="user",
            blocks=[
                TextBlock(text="this?"),
                ImageBlock(url="https://example.com/a.png"),
                ImageBlock(image=b"\x89PNG fake", image_mimetype="image/png"),
            ],
        ),
        ChatMessage(
            role="chatbot", content="from another model", additional_kwargs={"usage": {"tokens": 3}}
        ),
    ]
    chat_store.set_messages(f"{namespace}:chat:a", conversation)
    raw_client.rpush(f"{namespace}:chat:other-list", b"plain", b"values")
    raw_client.set(f"{namespace}:chat:string", b"not a list")
    before = source_dump(raw_client, f"{namespace}:chat:*")

    results = {
        r.source_key: r for r in import_llamaindex(store, raw_client, pattern=f"{namespace}:chat:*")
    }

    assert source_dump(raw_client, f"{namespace}:chat:*") == before
    assert set(results) == {f"{namespace}:chat:a", f"{namespace}:chat:other-list"}
    other = results[f"{namespace}:chat:other-list"]
    assert "not a LlamaIndex chat" in other.skipped and other.error is None
    result = results[f"{namespace}:chat:a"]
    assert (result.thread_id, result.imported, result.error) == (f"{namespace}:chat:a", 7, None)
    stored = list(store.thread(f"{namespace}:chat:a").iter())
    assert [m.message_type for m in stored] == [
        "system_message",
        "user_message",
        "tool_call_message",
        "tool_return_message",
        "reasoning_message",
        "assistant_message",
        "tool_call_message",
        "user_message",
        "assistant_message",
    ]
    assert stored[0].content == "Be brief." and stored[1].content == "Weather in Oslo?"
    assert (stored[2].tool_call.name, stored[2].tool_call.tool_call_id) == ("weather", "c1")
    assert (stored[3].tool_call_id, stored[3].tool_return, stored[3].name) == (
        "c1",
        "cloudy",
        "weather",
    )
    assert stored[4].reasoning == "short answer" and stored[5].content == "Cloudy."
    assert json.loads(stored[6].tool_call.arguments) == {"tz": "CET"}
    parts = stored[7].content
    assert parts[0].text == "this?" and parts[1].source.url == "https://example.com/a.png"
    original = chat_store.get_messages(f"{namespace}:chat:a")[5].blocks[2].image
    assert parts[2].source.data == original.decode() and parts[2].source.media_type == "image/png"
    assert stored[8].content == "from another model"
    assert json.loads(stored[8].metadata["source_fields"]) == {
        "role": "chatbot",
        "additional_kwargs": {"usage": {"tokens": 3}},
    }
    again = import_llamaindex(store, raw_client, pattern=f"{namespace}:chat:a")
    assert [(r.imported, r.already) for r in again] == [(0, 7)]


def test_cli_import_from_and_export_langchain(
    store, server, raw_client, namespace, tmp_path, capsys
):
    prefix = "message_store:"
    sessions = {f"{namespace}-s{n}": langchain_conversation(n) for n in range(2)}
    write_langchain(server.url, prefix, sessions)
    args = [
        "import-from",
        "langchain",
        "--url",
        server.url,
        "--pattern",
        f"{prefix}{namespace}-*",
        "--namespace",
        namespace,
    ]
    assert cli(args) == 0
    out = capsys.readouterr().out
    assert (
        f"message_store:{namespace}-s0" in out
        and "28 source messages: 28 imported, 0 already" in out
    )
    assert cli(args) == 0
    assert "28 source messages: 0 imported, 28 already" in capsys.readouterr().out
    raw_client.rpush(f"{prefix}{namespace}-bad", b"[]")
    assert cli(args) == 1  # a session that failed is in the table, and the status says so
    assert "failed: " in capsys.readouterr().out

    out = tmp_path / "s1.json"
    assert (
        cli(
            [
                "export",
                f"{namespace}-s1",
                "--format",
                "langchain",
                "-o",
                str(out),
                "--url",
                server.url,
                "--namespace",
                namespace,
            ]
        )
        == 0
    )
    assert lc.messages_from_dict(json.loads(out.read_text())) == langchain_conversation(1)


def test_export_langchain_of_a_native_thread(store):
    from kvstore import AssistantMessage, ReasoningMessage, ToolCall, ToolReturnMessage, UserMessage

    thread = store.thread("native")
    thread.append(
        [
            UserMessage(content="hi"),
            ReasoningMessage(reasoning="greet"),
            AssistantMessage(content="checking", step_id="s1"),
            ToolCallMessage(
                tool_call=ToolCall(name="w", arguments='{"a": 1}', tool_call_id="c1"), step_id="s1"
            ),
            ToolCallMessage(
                tool_call=ToolCall(name="w", arguments='{"a": 2}', tool_call_id="c2"), step_id="s1"
            ),
            ToolReturnMessage(status="success", tool_call_id="c1", tool_return="one"),
            ToolReturnMessage(status="success", tool_call_id="c2", tool_return="two"),
            AssistantMessage(content="done"),
            ToolReturnMessage(
                status="success",
                tool_call_id="c3",
                tool_return="x",
                tool_returns=[
                    {"status": "success", "tool_call_id": "c3", "tool_return": "three"},
                    {"status": "error", "tool_call_id": "c4", "tool_return": "four"},
                ],
            ),
        ]
    )
    thread.compact("said hi", last_sequence=1)
    buffer = io.StringIO()
    records = to_langchain(thread.iter())
    json.dump(records, buffer)
    back = lc.messages_from_dict(json.loads(buffer.getvalue()))
    assert [type(m).__name__ for m in back] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "ToolMessage",
        "AIMessage",
        "ToolMessage",
        "ToolMessage",
        "SystemMessage",
    ]
    assert [(m.tool_call_id, m.status, m.content) for m in back[5:7]] == [
        ("c3", "success", "three"),
        ("c4", "error", "four"),
    ]
    assert back[1].content == "checking" and [c["args"] for c in back[1].tool_calls] == [
        {"a": 1},
        {"a": 2},
    ]
    assert back[7].content.endswith("said hi") and langchain_left_out(thread.iter()) == 1


def test_batch_size_is_checked(store, raw_client):
    with pytest.raises(errors.ConfigError):
        import_langchain(store, raw_client, batch_messages=0)


def test_cli_import_killed_midway_is_finished_by_the_next_run(
    store, server, raw_client, namespace, capsys
):
    import os
    import signal
    import subprocess
    import sys
    import time

    from ..support import lifetime

    key = f"message_store:{namespace}-killed"
    total = 20_000
    records = [
        json.dumps(
            lc.message_to_dict(lc.HumanMessage(f"m{n}") if n % 2 == 0 else lc.AIMessage(f"m{n}"))
        )
        for n in range(total)
    ]
    raw_client.lpush(key, *records)  # oldest first, as add_message pushes them
    args = [
        "import-from",
        "langchain",
        "--url",
        server.url,
        "--pattern",
        key,
        "--namespace",
        namespace,
        "--batch",
        "10",
    ]
    process = lifetime.Popen(
        [sys.executable, "-m", "kvstore", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    thread = store.thread(f"{namespace}-killed")
    deadline = time.monotonic() + 60
    while (
        thread.stats().stored_messages < 500
        and time.monotonic() < deadline
        and process.poll() is None
    ):
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    stored = thread.stats().stored_messages
    assert 500 <= stored < total, "the import was not killed midway"

    assert cli(args) == 0
    assert f"{total - stored:,} imported, {stored:,} already" in capsys.readouterr().out
    messages = list(thread.iter())
    assert [m.content for m in messages] == [f"m{n}" for n in range(total)]


# --- per-session errors, changed sources, both APIs ------------------------------------------------


@pytest.fixture
def run_import(mode, server, server_only, namespace):
    """run_import(kind, config=None, **arguments): one import by the sync API or the async one."""

    def run(kind: str, config: StoreConfig | None = None, **arguments):
        config = config or StoreConfig(namespace=namespace)
        if mode == "sync":
            with (
                MessageStore.from_url(server.url, config) as store,
                redis.Redis.from_url(server.url) as source,
            ):
                return (import_langchain if kind == "langchain" else import_llamaindex)(
                    store, source, **arguments
                )

        async def run_async():
            store = AsyncMessageStore.from_url(server.url, config)
            source = redis.asyncio.Redis.from_url(server.url)
            try:
                call = import_langchain_async if kind == "langchain" else import_llamaindex_async
                return await call(store, source, **arguments)
            finally:
                await store.close()
                await source.aclose()

        return asyncio.run(run_async())

    return run


def contents(store, thread_id: str) -> list[str]:
    return [getattr(m, "content", m.message_type) for m in store.thread(thread_id).iter()]


def test_each_session_a_strict_store_refuses_is_reported_and_the_others_go_on(
    run_import, store, server, raw_client, namespace
):
    prefix = f"{namespace}:message_store:"
    write_langchain(
        server.url,
        prefix,
        {
            "a": [lc.HumanMessage("hi"), lc.AIMessage("hello")],
            "b-orphan": [
                lc.HumanMessage("hi"),
                lc.ToolMessage("rain", tool_call_id="call-of-nobody"),
                lc.AIMessage("x"),
            ],
            "c-big": [lc.HumanMessage("fits"), lc.HumanMessage("x" * 5000)],
            "d": [
                lc.HumanMessage("weather?"),
                lc.AIMessage("", tool_calls=[{"name": "w", "args": {}, "id": "c1"}]),
                lc.ToolMessage("rain", tool_call_id="c1"),
                lc.AIMessage("rain"),
            ],
        },
    )
    raw_client.rpush(f"{prefix}e-not-json", b"{oops")
    raw_client.rpush(f"{prefix}f-retyped", b"{}")

    def thread_id(key: str) -> str:
        if key.endswith("f-retyped"):  # the key becomes a string after SCAN listed it
            raw_client.delete(key)
            raw_client.set(key, b"not a list any more")
        return key[len(prefix) :]

    strict = StoreConfig(namespace=namespace, history_checks="strict", max_message_bytes=4096)
    results = run_import(
        "langchain", strict, key_prefix=prefix, thread_id=thread_id, batch_messages=1
    )

    assert [(r.thread_id, r.imported, r.error_type) for r in results] == [
        ("a", 2, None),
        ("b-orphan", 1, "HistoryConflict"),
        ("c-big", 1, "MessageTooLarge"),
        ("d", 4, None),
        ("e-not-json", 0, "InvalidMessage"),
        ("f-retyped", 0, "ResponseError"),
    ]
    assert "call-of-nobody" in results[1].error and "WRONGTYPE" in results[5].error
    assert contents(store, "b-orphan") == ["hi"]  # what came before the refused message stays
    assert contents(store, "d")[-1] == "rain"

    chat_store = RedisChatStore(redis_url=server.url)
    chat_store.set_messages(
        f"{namespace}:chat:a-orphan",
        [
            ChatMessage(role="user", content="hi"),
            ChatMessage(
                role="tool", content="rain", additional_kwargs={"tool_call_id": "call-of-nobody"}
            ),
        ],
    )
    raw_client.rpush(f"{namespace}:chat:b-other-list", b"plain")
    chat_store.set_messages(f"{namespace}:chat:c", [ChatMessage(role="user", content="hi")])
    results = run_import("llamaindex", strict, pattern=f"{namespace}:chat:*")
    assert [(r.imported, r.error_type) for r in results] == [
        (0, "HistoryConflict"),
        (0, None),  # no chat: left alone
        (1, None),
    ]
    assert "not a LlamaIndex chat" in results[1].skipped


def test_a_connection_failure_ends_the_import_and_the_next_run_finishes_it(
    store, server, raw_client, namespace
):
    prefix = f"{namespace}:message_store:"
    write_langchain(server.url, prefix, {f"s{n}": [lc.HumanMessage(f"hi {n}")] for n in range(3)})

    class Failing:  # the source server goes away when the second session is read
        def __init__(self):
            self.reads = 0

        def llen(self, key):
            self.reads += 1
            if self.reads == 2:
                raise redis.ConnectionError("Connection refused")
            return raw_client.llen(key)

        def __getattr__(self, name):
            return getattr(raw_client, name)

    failing = Failing()
    done = []
    with pytest.raises(redis.ConnectionError):
        import_langchain(store, failing, key_prefix=prefix, sessions=done)
    assert [(r.thread_id, r.imported, r.error_type) for r in done] == [
        ("s0", 1, None),
        ("s1", 0, "ConnectionError"),
    ]
    assert [r.imported for r in import_langchain(store, raw_client, key_prefix=prefix)] == [0, 1, 1]
    assert [r.already for r in import_langchain(store, raw_client, key_prefix=prefix)] == [1, 1, 1]


def test_a_cleared_and_refilled_session_is_reported_changed_not_spliced(
    run_import, store, server, raw_client, namespace
):
    prefix = f"{namespace}:message_store:"
    history = RedisChatMessageHistory("s", url=server.url, key_prefix=prefix)
    history.add_messages([lc.HumanMessage(f"old {n}") for n in range(8)])
    assert [(r.imported, r.error) for r in run_import("langchain", key_prefix=prefix)] == [
        (8, None)
    ]
    imported = contents(store, "s")

    history.clear()
    history.add_messages([lc.HumanMessage("new 0"), lc.HumanMessage("new 1")])
    (refilled,) = run_import("langchain", key_prefix=prefix)
    assert (refilled.error_type, refilled.imported, refilled.already) == ("SourceChanged", 0, 0)
    assert "fresh thread id" in refilled.error
    history.add_messages(
        [lc.HumanMessage(f"new {n}") for n in range(2, 10)]
    )  # longer than the import now
    (grown,) = run_import("langchain", key_prefix=prefix)
    assert (grown.error_type, grown.imported, grown.already) == ("SourceChanged", 0, 0)
    assert contents(store, "s") == imported  # nothing spliced onto the old conversation

    (fresh,) = run_import("langchain", key_prefix=prefix, thread_id=lambda key: "s-2")
    assert (fresh.imported, fresh.error) == (10, None)
    assert contents(store, "s-2") == [f"new {n}" for n in range(10)]
    history.add_message(lc.HumanMessage("new 10"))  # a session that only grew gets its tail
    (more,) = run_import("langchain", key_prefix=prefix, thread_id=lambda key: "s-2")
    assert (more.imported, more.already, more.error) == (1, 10, None)
    (again,) = run_import("langchain", key_prefix=prefix, thread_id=lambda key: "s-2")
    assert (again.imported, again.already, again.error) == (0, 11, None)


def test_a_rewritten_or_edited_llamaindex_chat_is_reported_changed(
    run_import, store, server, namespace
):
    chat_store = RedisChatStore(redis_url=server.url)
    key = f"{namespace}:chat"
    chat_store.set_messages(key, [ChatMessage(role="user", content=f"m{n}") for n in range(6)])
    assert [(r.imported, r.error) for r in run_import("llamaindex", pattern=key)] == [(6, None)]

    chat_store.delete_message(key, 2)  # rewrites the list: positions 2.. hold other messages now
    chat_store.add_message(key, ChatMessage(role="user", content="m6"))
    (rewritten,) = run_import("llamaindex", pattern=key)
    assert (rewritten.error_type, rewritten.imported) == ("SourceChanged", 0)

    chat_store.set_messages(
        key, [ChatMessage(role="user", content="edited" if n == 1 else f"m{n}") for n in range(8)]
    )  # one early message edited, the rest grown
    (edited,) = run_import("llamaindex", pattern=key)
    assert (edited.error_type, edited.imported) == ("SourceChanged", 0)
    assert contents(store, key) == [f"m{n}" for n in range(6)]

    chat_store.set_messages(key, [ChatMessage(role="user", content=f"m{n}") for n in range(8)])
    (grown,) = run_import("llamaindex", pattern=key)  # back to the imported prefix, grown: its tail
    assert (grown.imported, grown.already, grown.error) == (2, 6, None)
    assert contents(store, key) == [f"m{n}" for n in range(8)]


def test_a_thread_that_went_on_natively_takes_no_more_of_the_session(
    run_import, store, server, namespace
):
    from kvstore import UserMessage

    prefix = f"{namespace}:message_store:"
    history = RedisChatMessageHistory("s", url=server.url, key_prefix=prefix)
    history.add_messages([lc.HumanMessage("q0"), lc.AIMessage("a0")])
    run_import("langchain", key_prefix=prefix)
    store.thread("s").append(UserMessage(content="asked in kvstore"))
    (unchanged,) = run_import("langchain", key_prefix=prefix)  # nothing new: nothing to say
    assert (unchanged.imported, unchanged.already, unchanged.error) == (0, 2, None)

    history.add_message(lc.HumanMessage("q1"))
    (grown,) = run_import("langchain", key_prefix=prefix)  # its tail would follow another message
    assert (grown.error_type, grown.imported) == ("SourceChanged", 0)
    assert contents(store, "s") == ["q0", "a0", "asked in kvstore"]


def test_cli_import_reports_each_failed_session_and_exits_1(
    store, server, raw_client, namespace, capsys
):
    prefix = f"message_store:{namespace}-"
    write_langchain(
        server.url,
        prefix,
        {
            "a": [lc.HumanMessage("hi")],
            "b": [lc.HumanMessage("hi"), lc.ToolMessage("rain", tool_call_id="call-of-nobody")],
            "c": [lc.HumanMessage("hi"), lc.AIMessage("hello")],
        },
    )
    args = [
        "import-from",
        "langchain",
        "--url",
        server.url,
        "--pattern",
        f"{prefix}*",
        "--namespace",
        namespace,
        "--history-checks",
        "strict",
    ]
    assert cli(args) == 1
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in out if line.startswith(prefix)}
    assert rows[f"{prefix}a"].endswith("ok") and rows[f"{prefix}c"].endswith("ok")
    assert "failed: " in rows[f"{prefix}b"] and "call-of-nobody" in rows[f"{prefix}b"]
    assert out[-1].endswith("3 imported, 0 already stored (3 kvstore messages written); 1 failed")


@pytest.mark.parametrize("cut", ["before", "after"])
def test_async_import_cancelled_at_any_await_then_run_again_is_as_uninterrupted(
    server, server_only, raw_client, namespace, cut
):
    """Each await of the import (a source read, a store call) cancelled in turn, before its
    command is sent or after its reply came (the call done, the caller gone); the same import
    run again then leaves the threads as one uninterrupted import does."""
    prefix = f"{namespace}:message_store:"
    write_langchain(
        server.url,
        prefix,
        {
            "a": [
                lc.HumanMessage("q"),
                lc.AIMessage("", tool_calls=[{"name": "w", "args": {}, "id": "c1"}]),
                lc.ToolMessage("rain", tool_call_id="c1"),
                lc.AIMessage("rain"),
            ],
            "b": [lc.HumanMessage(f"m{n}") for n in range(5)],
        },
    )

    async def state(store, thread_ids):
        return {
            thread_id: [
                (m.id, m.seq_id, m.message_type) async for m in store.thread(thread_id).iter()
            ]
            for thread_id in thread_ids
        }

    async def run(target: str, cancel_at: int | None) -> tuple[int, dict]:
        store = AsyncMessageStore.from_url(
            server.url, StoreConfig(namespace=target, history_checks="strict")
        )
        source = redis.asyncio.Redis.from_url(server.url)
        again = redis.asyncio.Redis.from_url(server.url)
        awaits = 0

        def counted(call):
            async def wrapper(*args, **kwargs):
                nonlocal awaits
                awaits += 1
                if awaits == cancel_at and cut == "before":
                    raise asyncio.CancelledError
                reply = await call(*args, **kwargs)
                if awaits == cancel_at and cut == "after":
                    raise asyncio.CancelledError
                return reply

            return wrapper

        store.run = counted(store.run)
        for command in ("scan", "llen", "lrange"):
            setattr(source, command, counted(getattr(source, command)))
        try:
            try:
                await import_langchain_async(store, source, key_prefix=prefix, batch_messages=2)
            except asyncio.CancelledError:
                assert cancel_at is not None
            steps = awaits
            results = await import_langchain_async(
                store, again, key_prefix=prefix, batch_messages=2
            )
            assert [r.error for r in results] == [None, None]
            return steps, await state(store, ["a", "b"])
        finally:
            await store.close()
            await source.aclose()
            await again.aclose()

    steps, expected = asyncio.run(run(f"{namespace}-whole", None))
    assert [len(expected["a"]), len(expected["b"])] == [4, 5]
    for cancel_at in range(1, steps + 1):
        assert asyncio.run(run(f"{namespace}-cut{cancel_at}", cancel_at))[1] == expected, (
            f"cut at await {cancel_at}"
        )


def test_cli_import_ended_by_a_connection_failure_shows_the_sessions_done(
    store, server, raw_client, namespace, capsys, monkeypatch
):
    from kvstore.cli import import_from as command

    prefix = f"message_store:{namespace}-"
    write_langchain(server.url, prefix, {name: [lc.HumanMessage("hi")] for name in "abc"})
    raw_client.rpush(f"{prefix}d-retyped", b"{}")
    real = command.import_langchain

    def source_gone(store, source, *args, **kwargs):
        class Gone:  # the source server goes away when the third session is read
            def __init__(self):
                self.reads = 0

            def llen(self, key):
                self.reads += 1
                if self.reads == 3:
                    raise redis.ConnectionError("Connection refused")
                return source.llen(key)

            def __getattr__(self, name):
                return getattr(source, name)

        return real(store, Gone(), *args, **kwargs)

    monkeypatch.setattr(command, "import_langchain", source_gone)
    args = [
        "import-from",
        "langchain",
        "--url",
        server.url,
        "--pattern",
        f"{prefix}*",
        "--namespace",
        namespace,
    ]
    assert cli(args) == 1
    captured = capsys.readouterr()
    rows = [line for line in captured.out.splitlines() if line.startswith(prefix)]
    assert [row.split()[0] for row in rows] == [f"{prefix}a", f"{prefix}b", f"{prefix}c"]
    assert rows[0].endswith("ok") and rows[2].endswith("failed: Connection refused")
    assert "run the same command again" in captured.err and "Connection refused" in captured.err
    monkeypatch.setattr(command, "import_langchain", real)
    listed = command.find_sessions

    def find_then_retype(source, pattern):  # a key changes type after the command listed it
        keys = listed(source, pattern)
        raw_client.delete(f"{prefix}d-retyped")
        raw_client.set(f"{prefix}d-retyped", b"x")
        return keys

    monkeypatch.setattr(command, "find_sessions", find_then_retype)
    assert cli(args) == 0  # the progress bar's count passes it over; the import finds it no list
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(prefix)]
    assert [row.split()[-1] for row in rows] == ["ok"] * 3


def test_append_missing_of_a_batch_that_repeats_an_id_says_so_at_once(store, server, mode):
    from kvstore import UserMessage
    from kvstore.importers import append_missing_async

    async def run_async(messages):
        async_store = AsyncMessageStore.from_url(server.url, store.config)
        try:
            return await append_missing_async(async_store.thread("repeats"), messages)
        finally:
            await async_store.close()

    messages = [
        UserMessage(content="one", id="message-a"),
        UserMessage(content="two", id="message-a"),
    ]
    with pytest.raises(
        errors.MessageIdRepeated
    ):  # not "kept being stored by another process", three reads later
        append_missing(store.thread("repeats"), messages) if mode == "sync" else asyncio.run(
            run_async(messages)
        )
    assert store.thread("repeats").stats().stored_messages == 0


# --- the command line's reports: names, lists of other kinds, progress ------------------------------


def test_cli_counts_a_misnamed_session_and_renames_it(
    store, server, raw_client, namespace, tmp_path, capsys
):
    """A session whose id is no thread id is reported with the messages it holds and why, and
    `--rename` (or `--rename-file`) imports it under another name."""
    prefix = f"message_store:{namespace}-"
    write_langchain(
        server.url,
        prefix,
        {"has space": [lc.HumanMessage("hi"), lc.AIMessage("hello"), lc.HumanMessage("bye")]},
    )
    args = ["import-from", "langchain", "--url", server.url, "--pattern", f"{prefix}*"]
    args += ["--namespace", namespace, "--key-prefix", prefix]
    assert cli(args) == 1
    out = capsys.readouterr().out.splitlines()
    row = next(line for line in out if line.startswith(f"{prefix}has space"))
    assert row.split()[3:5] == ["3", "0"] and "failed: " in row and "may hold only" in row
    assert "--rename SOURCE_KEY THREAD_ID" in out[-1]

    assert cli([*args, "--rename", f"{prefix}has space", f"{namespace}-has-space"]) == 0
    out = capsys.readouterr().out
    assert f"{namespace}-has-space" in out and out.splitlines()[-1].startswith(
        "1 sessions into namespace"
    )
    assert contents(store, f"{namespace}-has-space") == ["hi", "hello", "bye"]

    renames = tmp_path / "renames.json"
    renames.write_text(json.dumps({f"{prefix}has space": f"{namespace}-other"}))
    assert cli([*args, "--rename-file", str(renames)]) == 0
    assert contents(store, f"{namespace}-other") == ["hi", "hello", "bye"]
    capsys.readouterr()
    # A rename that names no session found, or a name that is no thread id, says so.
    assert cli([*args, "--rename", f"{prefix}nobody", "x"]) == 1
    assert f"{prefix}nobody" in capsys.readouterr().err
    assert cli([*args, "--rename", f"{prefix}has space", "still bad"]) == 1
    assert "may hold only" in capsys.readouterr().err


def test_cli_llamaindex_leaves_other_lists_alone_and_exits_0(
    store, server, raw_client, namespace, capsys
):
    """LlamaIndex's default pattern finds every list: a LangChain session among them is reported
    as left alone, and the import succeeds (docs/MIGRATING.md)."""
    db = 9  # a database of this test's own, for the default pattern `*`
    url = server.url.rsplit("/", 1)[0] + f"/{db}"
    source = redis.Redis.from_url(url)
    try:
        source.flushdb()
        RedisChatStore(redis_url=url).set_messages(
            f"{namespace}:chat", [ChatMessage(role="user", content="hi")]
        )
        write_langchain(url, "message_store:", {f"{namespace}-s": [lc.HumanMessage("hi")]})
        # An Agents SDK session whose first item reads as a ChatMessage: its last does not.
        agents = f"agents:session:{namespace}:messages"
        source.rpush(
            agents,
            json.dumps({"role": "user", "content": "hi"}),
            json.dumps({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}),
            json.dumps({"type": "function_call_output", "call_id": "c1", "output": "ok"}),
        )
        args = ["import-from", "llamaindex", "--url", url, "--to-url", server.url]
        assert cli([*args, "--namespace", namespace]) == 0
        out = capsys.readouterr().out.splitlines()
        for key in (f"message_store:{namespace}-s", agents):
            row = next(line for line in out if line.startswith(key))
            assert "left alone: not a LlamaIndex chat" in row and "failed" not in row
        assert out[-1].endswith(
            "1 imported, 0 already stored (1 kvstore messages written); 2 left alone (not chats)"
        )
        assert contents(store, f"{namespace}:chat") == ["hi"]
        assert store.thread(agents).stats().stored_messages == 0
    finally:
        source.flushdb()
        source.close()


def test_cli_progress_ends_at_the_total_whatever_the_sessions_did(
    store, server, raw_client, namespace, capsys
):
    """The progress counts every source message: those of a session that failed part way, of one
    named by no thread id and of a list left alone too, so its last line is N/N."""
    chat = [ChatMessage(role="user", content=f"m{n}").model_dump_json() for n in range(508)]
    raw_client.rpush(f"{namespace}:chat:a", *chat, b"not JSON")  # fails at its last message
    raw_client.rpush(f"{namespace}:chat:bad id", *chat[:3])  # no thread id
    raw_client.rpush(f"{namespace}:chat:queue", b"job-1", b"job-2")  # no chat: left alone
    args = ["import-from", "llamaindex", "--url", server.url, "--pattern", f"{namespace}:chat:*"]
    assert cli([*args, "--namespace", namespace, "--progress-every", "0"]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1] == "  imported: 514/514 messages (100%)", captured.err
    rows = {
        line.split()[0]: line for line in captured.out.splitlines() if line.startswith(namespace)
    }
    assert rows[f"{namespace}:chat:a"].split()[2:4] == ["509", "508"]
    assert "left alone" in rows[f"{namespace}:chat:queue"]


def test_llamaindex_tool_calls_make_no_empty_assistant_message(
    run_import, store, raw_client, namespace
):
    """A tool-calling step LlamaIndex wrote with ``content=""`` (an empty text block) is its tool
    calls only, as one written with ``content=None`` is."""
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
    ]
    conversation = [
        ChatMessage(role="user", content="Weather and time?"),
        ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": calls}),
        ChatMessage(role="tool", content="cloudy", additional_kwargs={"tool_call_id": "c1"}),
        ChatMessage(role="tool", content="noon", additional_kwargs={"tool_call_id": "c2"}),
        ChatMessage(
            role="assistant",
            blocks=[
                TextBlock(text=""),
                ToolCallBlock(tool_call_id="c3", tool_name="w", tool_kwargs={}),
            ],
        ),
        ChatMessage(role="tool", content="rain", additional_kwargs={"tool_call_id": "c3"}),
        ChatMessage(role="assistant", content=""),  # no tool calls: an (empty) answer, kept
    ]
    for message in conversation:
        raw_client.rpush(f"{namespace}:tools", message.model_dump_json())
    (result,) = run_import("llamaindex", pattern=f"{namespace}:tools")
    assert (result.imported, result.error) == (7, None)
    assert [m.message_type for m in store.thread(f"{namespace}:tools").iter()] == [
        "user_message",
        "tool_call_message",
        "tool_call_message",
        "tool_return_message",
        "tool_return_message",
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
