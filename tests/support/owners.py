"""What the owner tests share: stores of either mode behind one facade, the namespace's keyspace
by contents, an owner's listing paged to its end, and a wait for a thread's keys to expire."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import redis

from kvstore import StoreConfig
from kvstore._engine.layout.keys import OwnerKeys

from ..conftest import make_async_store, make_sync_store
from .facade import SyncFacade


class StoreFacade:
    """An async store's methods run to completion, its threads SyncFacades: one test body for
    both modes."""

    def __init__(self, store: Any, loop: Any) -> None:
        self._store, self._loop = store, loop

    def thread(self, thread_id: str, owner: str | None = None) -> SyncFacade:
        return SyncFacade(self._store.thread(thread_id, owner), self._loop)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        return lambda *args, **kwargs: self._loop.run_until_complete(attr(*args, **kwargs))


def stores(backend: str, mode: str, namespace: str) -> Iterator[Any]:
    """A make_store fixture's body: make(**config) -> a store of `mode` in `namespace`, each
    closed at the end."""
    loop = asyncio.new_event_loop() if mode == "async" else None
    made: list[Any] = []

    def make(**config_values: Any) -> Any:
        config = StoreConfig(namespace=namespace, **config_values)
        if mode == "sync":
            store = make_sync_store(backend, config)
            made.append(store)
            return store
        store = make_async_store(backend, config)
        made.append(store)
        return StoreFacade(store, loop)

    yield make
    for store in made:
        if loop is None:
            store.close()
        else:
            loop.run_until_complete(store.close())
    if loop:
        loop.close()


def owner_keys(raw_client: Any, namespace: str, owner: str) -> list[bytes]:
    """Every key of the owner and its threads (a SCAN of the owner's hash tag)."""
    return sorted(raw_client.scan_iter(match=OwnerKeys.of(namespace, owner).pattern()))


def _state(raw_client: Any, key: bytes, kind: bytes) -> Any:
    """A key's DUMP; a hash table's contents instead (a read moves a hash table's entries a
    rehash step at a time after it grew, and with them its DUMP's order)."""
    if kind == b"hash":
        try:
            encoding = raw_client.object("encoding", key)
        except redis.ResponseError:  # a server without OBJECT ENCODING: compare contents
            encoding = None
        if encoding not in (b"listpack", b"ziplist"):
            return ("contents", raw_client.hgetall(key))
    return raw_client.dump(key)


def keyspace(raw_client: Any, namespace: str) -> dict[bytes, Any]:
    """Every key of the namespace with its type, DUMP and expiry time (a hash table's contents
    for its DUMP): equal before and after means nothing written."""
    state = {}
    for key in raw_client.scan_iter(match=f"{namespace}:*"):
        kind = raw_client.type(key)
        expiry = raw_client.execute_command("PEXPIRETIME", key)
        state[key] = (kind, _state(raw_client, key, kind), expiry)
    return state


def listed(store: Any, owner: str, **kwargs: Any) -> list[str]:
    """Every thread id of the owner's listing, paged 2 at a time."""
    ids, page = [], store.threads(owner, limit=2, **kwargs)
    ids += [info.thread_id for info in page.threads]
    while page.next_cursor:
        page = store.threads(owner, limit=2, after=page.next_cursor, **kwargs)
        ids += [info.thread_id for info in page.threads]
    return ids


def wait_expired(raw_client: Any, *keys: str, timeout: float = 10) -> None:
    """Waits until none of `keys` exists (their ttl ran out), then 0.1 s more (a thread listed
    by set_info alone ends with the ttl too)."""
    deadline = time.monotonic() + timeout
    while any(raw_client.exists(key) for key in keys) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(raw_client.exists(key) for key in keys)
    time.sleep(0.1)


def totals_match(store: Any, owner: str) -> tuple[Any, ...]:
    """The owner's usage (threads, messages, bytes, tokens), checked against the sum over its
    listed threads of what each thread's own stats say."""
    usage = store.owner_usage(owner)
    infos = store.threads(owner, limit=1000).threads
    stats = [store.thread(info.thread_id, owner).stats() for info in infos]
    got = (usage.threads, usage.messages, usage.stored_bytes, usage.tokens)
    assert got == (
        len(infos),
        sum(s.stored_messages for s in stats),
        sum(s.stored_bytes for s in stats),
        sum(s.tokens for s in stats),
    )
    assert got[1:] == (
        sum(i.messages for i in infos),
        sum(i.stored_bytes for i in infos),
        sum(i.tokens for i in infos),
    )
    return got


def early_in_a_minute(raw_client: Any, margin: float = 20) -> None:
    """Waits, when the server's clock is less than `margin` seconds before a whole minute, for
    the minute to turn: a test of the rate quota (messages in the server's current minute)
    must not see its window end midway."""
    seconds, micros = raw_client.time()
    into = seconds % 60 + micros / 1e6
    if into > 60 - margin:
        time.sleep(60 - into + 0.05)
