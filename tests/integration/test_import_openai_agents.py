"""The import of the OpenAI Agents SDK's RedisSession, on real servers, with sessions written by
the SDK's own class: the adapter gives every item back as the SDK's session does, a second run
stores nothing, an interrupted run resumes, the source keys are left as they were, and a
session's time to live is reported and carried over by the command line."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import redis.asyncio
from agents.extensions.memory import RedisSession

from kvstore import AsyncMessageStore, MessageStore, StoreConfig
from kvstore.cli.main import main as cli
from kvstore.importers import (
    default_thread_id,
    import_openai_agents,
    import_openai_agents_async,
)
from kvstore.integrations.openai_agents import KvstoreSession
from tests.integration.test_integration_openai_agents import EVERY_ITEM


@pytest.fixture
def store(backend, server_only, server, namespace):
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as made:
        yield made


def write_sessions(url: str, prefix: str, sessions: dict[str, list[Any]], ttl: int | None = None):
    async def write() -> None:
        for session_id, items in sessions.items():
            session = RedisSession.from_url(session_id, url=url, key_prefix=prefix, ttl=ttl)
            try:
                for start in range(0, len(items), 7):  # several add_items calls, as a Runner makes
                    await session.add_items(copy.deepcopy(items[start : start + 7]))
            finally:
                await session.close()

    asyncio.run(write())


def items_through_adapter(url: str, namespace: str, thread_id: str, limit: int | None = None):
    async def read() -> list[Any]:
        async with AsyncMessageStore.from_url(url, StoreConfig(namespace=namespace)) as store:
            return await KvstoreSession(thread_id, store).get_items(limit)

    return asyncio.run(read())


def conversation(n: int) -> list[Any]:
    turns = [
        item
        for i in range(n)
        for item in (
            {"role": "user", "content": f"question {i} ✓"},
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{i}",
                "status": "completed",
                "content": [{"type": "output_text", "text": f"answer {i}", "annotations": []}],
            },
        )
    ]
    # A message item without a role: its content is all it says, and comes back with it.
    return [*EVERY_ITEM, {"type": "message", "content": "hello, no role"}, *turns]


def test_every_item_comes_back_through_the_adapter_as_the_sdk_stored_it(
    store, server, raw_client, namespace
):
    prefix = f"{namespace}:agents"
    sessions = {"s-0": conversation(3), "s-1": conversation(40)}
    write_sessions(server.url, prefix, sessions)
    before = {
        key: raw_client.lrange(key, 0, -1)
        for key in raw_client.scan_iter(f"{prefix}:*", _type="list")
    }

    results = import_openai_agents(store, raw_client, key_prefix=prefix)
    assert [(r.thread_id, r.imported, r.error) for r in results] == [
        ("s-0", len(sessions["s-0"]), None),
        ("s-1", len(sessions["s-1"]), None),
    ]
    for session_id, items in sessions.items():
        assert items_through_adapter(server.url, namespace, session_id) == items
        assert items_through_adapter(server.url, namespace, session_id, 5) == items[-5:]
    stored = list(store.thread("s-1").iter())
    assert [m.metadata["source"] for m in stored] == ["openai_agents"] * len(stored)
    assert [m.message_type for m in stored[6:8]] == ["tool_call_message", "tool_return_message"]
    # the source is only read
    assert {key: raw_client.lrange(key, 0, -1) for key in before} == before

    again = import_openai_agents(store, raw_client, key_prefix=prefix)
    assert [(r.imported, r.already) for r in again] == [
        (0, len(items)) for items in sessions.values()
    ]
    assert store.thread("s-1").stats().stored_messages == len(sessions["s-1"])


def test_the_adapter_goes_on_after_the_import_and_a_retried_add_is_a_replay(
    store, server, raw_client, namespace
):
    prefix = f"{namespace}:agents"
    items = conversation(2)
    write_sessions(server.url, prefix, {"chat": items})
    import_openai_agents(store, raw_client, key_prefix=prefix)
    new = [{"role": "user", "content": "after the switch"}]

    async def go_on() -> list[Any]:
        async with AsyncMessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as s:
            session = KvstoreSession("chat", s)
            await session.add_items(copy.deepcopy(new))
            await session.add_items(copy.deepcopy(new))  # the same step sent again
            return await session.get_items()

    assert asyncio.run(go_on()) == items + new


def test_an_interrupted_import_resumes_and_async_finishes_it(store, server, raw_client, namespace):
    prefix = f"{namespace}:agents"
    items = [{"role": "user" if n % 2 else "assistant", "content": f"m{n}"} for n in range(600)]
    write_sessions(server.url, prefix, {"long": items})
    calls = []

    def stop_after_two(key: str, done: int) -> None:
        calls.append(done)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_openai_agents(
            store, raw_client, key_prefix=prefix, batch_messages=50, progress=stop_after_two
        )
    assert store.thread("long").stats().stored_messages == 100

    async def finish() -> list[Any]:
        source = redis.asyncio.Redis.from_url(server.url)
        try:
            async with AsyncMessageStore.from_url(
                server.url, StoreConfig(namespace=namespace)
            ) as s:
                return await import_openai_agents_async(s, source, key_prefix=prefix)
        finally:
            await source.aclose()

    (resumed,) = asyncio.run(finish())
    assert (resumed.imported, resumed.already) == (500, 100)
    assert items_through_adapter(server.url, namespace, "long") == items
    assert [m.seq_id for m in store.thread("long").iter()] == list(range(1, 601))


def test_an_item_that_is_no_object_fails_its_session_only(store, server, raw_client, namespace):
    prefix = f"{namespace}:agents"
    write_sessions(server.url, prefix, {"good": conversation(1)})
    raw_client.rpush(f"{prefix}:bad:messages", b'{"role": "user", "content": "ok"}', b"[1, 2]")
    bad, good = import_openai_agents(store, raw_client, key_prefix=prefix)
    assert (bad.thread_id, bad.imported, bad.error_type) == ("bad", 1, "InvalidMessage")
    assert "message 1" in bad.error
    assert (good.imported, good.error) == (len(conversation(1)), None)


def test_thread_ids_are_the_session_ids():
    assert default_thread_id("openai_agents", "agents:session:u:42:messages") == "u:42"
    assert default_thread_id("openai_agents", "p:x:messages", "p") == "x"
    assert default_thread_id("openai_agents", "other") == "other"


def test_cli_carries_a_sessions_time_to_live_over_with_thread_ttl(
    server, server_only, raw_client, namespace, capsys
):
    prefix = f"{namespace}:agents"
    write_sessions(server.url, prefix, {"brief": conversation(1)}, ttl=3600)
    args = ["import-from", "openai-agents", "--url", server.url, "--key-prefix", prefix]
    assert cli([*args, "--namespace", f"{namespace}-a"]) == 0
    captured = capsys.readouterr()
    assert f"{len(conversation(1))} imported" in captured.out
    assert "had a time to live" in captured.err and "--thread-ttl" in captured.err
    with MessageStore.from_url(server.url, StoreConfig(namespace=f"{namespace}-a")) as plain:
        assert raw_client.pttl(plain.thread("brief").keys.meta) == -1

    assert cli([*args, "--namespace", f"{namespace}-b", "--thread-ttl", "3600"]) == 0
    assert "had a time to live" not in capsys.readouterr().err
    with MessageStore.from_url(server.url, StoreConfig(namespace=f"{namespace}-b")) as expiring:
        thread = expiring.thread("brief")
        assert 0 < raw_client.pttl(thread.keys.meta) <= 5400 * 1000
        assert items_through_adapter(server.url, f"{namespace}-b", "brief") == conversation(1)
    (result,) = import_openai_agents(MessageStore(raw_client), raw_client, key_prefix=prefix)
    assert result.source_ttl_ms is not None and 0 < result.source_ttl_ms <= 3600 * 1000
