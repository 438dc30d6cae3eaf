"""A page that holds only unreadable records does not end an adapter's read (docs/RELIABILITY.md,
"One bad record": such a page still counts its places, and the next page goes on): the newest
item or message behind a bad record is read, popped, deleted or chained to, on the real servers."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from langchain_core import messages as lc
from llama_index.core.base.llms.types import ChatMessage

from kvstore import StoreConfig
from kvstore.integrations.langchain import KvstoreChatMessageHistory
from kvstore.integrations.llamaindex import KvstoreChatStore
from kvstore.integrations.openai_agents import KvstoreSession
from tests.conftest import make_async_store, make_sync_store
from tests.integration.test_bad_records import store_unchecked

BAD = b"\xc1\xc1 not a record"


@pytest.fixture
def config(namespace) -> StoreConfig:
    return StoreConfig(namespace=namespace, chunk_size=4)


def poison(store: Any, thread_id: str, monkeypatch, count: int = 2) -> None:
    """Appends `count` unreadable records to the thread, as an older version or a bug would."""
    for n in range(count):
        store_unchecked(
            store.thread(thread_id), monkeypatch, [BAD], [f"m-bad-{n}"], [f"o-bad-{n}"], "t"
        )


def said(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_the_session_reads_pops_and_chains_past_bad_records(
    backend, server_only, config, monkeypatch, caplog
):
    caplog.set_level(logging.WARNING, logger="kvstore")
    sync = make_sync_store(backend, config)

    async def main() -> None:
        store = make_async_store(backend, config)
        session = KvstoreSession("s", store)
        await session.add_items([said("first"), said("u1"), said("u2")])
        poison(sync, "s", monkeypatch)
        assert await session.get_items(1) == [said("u2")]
        assert await session.get_items(2) == [said("u1"), said("u2")]
        assert await session.get_items() == [said("first"), said("u1"), said("u2")]
        assert await session.pop_item() == said("u2")
        assert await session.pop_item() == said("u1")
        # The item added after the bad records is chained to the last readable message: the
        # same words as the thread's first item are stored, not taken for it.
        await session.add_items([said("first")])
        assert await session.get_items() == [said("first"), said("first")]
        await store.close()

    asyncio.run(main())
    sync.close()


def test_the_history_reads_and_chains_past_bad_records(
    backend, server_only, config, monkeypatch, caplog
):
    caplog.set_level(logging.WARNING, logger="kvstore")
    store = make_sync_store(backend, config)
    history = KvstoreChatMessageHistory(store, "h", max_messages=1)
    history.add_messages([lc.HumanMessage("first"), lc.AIMessage("a1")])
    poison(store, "h", monkeypatch)
    assert history.messages == [lc.AIMessage("a1")]
    history.add_messages([lc.HumanMessage("first"), lc.AIMessage("a1")])  # later: stored
    whole = KvstoreChatMessageHistory(store, "h", max_messages=10).messages
    assert [m.content for m in whole] == ["first", "a1", "first", "a1"]
    store.close()


def test_the_chat_store_deletes_past_bad_records(backend, server_only, config, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="kvstore")
    store = make_sync_store(backend, config)
    chat = KvstoreChatStore(store, max_messages=1)
    chat.set_messages("k", [ChatMessage(role="user", content=f"m{n}") for n in range(3)])
    poison(store, "k", monkeypatch)
    assert chat.get_messages("k") == [ChatMessage(role="user", content="m2")]
    assert chat.delete_last_message("k") == ChatMessage(role="user", content="m2")
    assert KvstoreChatStore(store).get_messages("k") == [
        ChatMessage(role="user", content=f"m{n}") for n in range(2)
    ]
    store.close()
