"""Owners on a 3-primary cluster, sync and async (docs/OWNERS.md): an owner on each primary, its
threads and directory in its one slot, listed, counted, held to a quota and erased with no
CROSSSLOT and nothing left on any node."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.crc import key_slot

from kvstore import AsyncMessageStore, MessageStore, StoreConfig, UserMessage, errors
from kvstore._engine.layout.keys import OwnerKeys

from ..support.owners import StoreFacade
from .harness import Cluster


def owners_on_each_primary(cluster: Cluster, prefix: str) -> list[str]:
    """One owner id per primary whose slot ({#<owner>}) that primary serves."""
    found = []
    for node in cluster.primaries():
        ranges = node.view()[node.node_id].slots
        n = 0
        while not any(
            first <= key_slot(f"#{prefix}-{n}".encode()) <= last for first, last in ranges
        ):
            n += 1
        found.append(f"{prefix}-{n}")
    return found


@pytest.fixture
def cluster_store(cluster, mode, namespace):
    loop = asyncio.new_event_loop() if mode == "async" else None
    config = StoreConfig(namespace=namespace, chunk_size=4, window_size=4)
    before = cluster.error_stats()
    if mode == "sync":
        store = MessageStore(cluster.client(), config)
        yield store
        store.close()
    else:
        store = AsyncMessageStore(cluster.async_client(), config)
        yield StoreFacade(store, loop)
        loop.run_until_complete(store.close())
        loop.close()
    for node, counts in cluster.error_stats().items():
        grew = counts.get("CROSSSLOT", 0) - before.get(node, {}).get("CROSSSLOT", 0)
        assert grew == 0, f"{node} answered CROSSSLOT {grew} times: {counts}"


def test_owners_on_every_primary(cluster, cluster_store, namespace):
    store = cluster_store
    for owner in owners_on_each_primary(cluster, "owner"):
        for i in range(5):
            chat = store.thread(f"chat-{i}", owner=owner)
            chat.append([UserMessage(content=f"m{j} " + "x" * 100) for j in range(3 + i)])
            time.sleep(0.003)  # distinct milliseconds: the listing's order is the writes'
        store.thread("chat-2", owner=owner).set_info(title="second", metadata={"k": "v"})
        chat = store.thread("chat-1", owner=owner)
        chat.append(UserMessage(content="latest"))
        time.sleep(0.003)
        fork = chat.fork("chat-1-fork", at=2)
        page = store.threads(owner, limit=3)
        assert [t.thread_id for t in page.threads] == ["chat-1-fork", "chat-1", "chat-4"]
        rest = store.threads(owner, limit=10, after=page.next_cursor)
        assert [t.thread_id for t in rest.threads] == ["chat-3", "chat-2", "chat-0"]
        assert [t.thread_id for t in store.threads(owner, where={"k": "v"}).threads] == ["chat-2"]
        usage = store.owner_usage(owner)
        assert (usage.threads, usage.messages) == (
            6,
            3 + 4 + 5 + 6 + 7 + 1 + fork.stats().stored_messages,
        )
        slot = key_slot(f"#{owner}".encode())
        keys = [key for _, key in cluster.keys_of(OwnerKeys.of(namespace, owner).pattern())]
        assert keys and {key_slot(k.encode() if isinstance(k, str) else k) for k in keys} == {slot}
        store.set_owner_quota(owner, threads=6)
        with pytest.raises(errors.QuotaExceeded):
            store.thread("chat-9", owner=owner).append(UserMessage(content="one too many"))
        receipt = store.erase_owner(owner)
        assert (receipt.threads, receipt.messages) == (usage.threads, usage.messages)
        assert list(cluster.keys_of(OwnerKeys.of(namespace, owner).pattern())) == []
