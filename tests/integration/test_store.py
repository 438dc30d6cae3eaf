"""The store object itself: a context manager that closes its connections, and a small public
surface (the executor's decisions are private)."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
import redis

import kvstore
from kvstore import AsyncMessageStore, MessageStore, StoreConfig, UserMessage

# What a user reaches on a store: how to make one, its threads, its health, close. `run` and
# `stream` are the one door every Thread method goes through; `client`, `config` and `functions`
# are what it keeps.
PUBLIC = {"from_url", "in_memory", "thread", "health", "close", "run", "stream"}
# An owner's threads (docs/OWNERS.md).
PUBLIC |= {"threads", "owner_usage", "set_owner_quota", "erase_owner"}
ATTRIBUTES = {"client", "config", "functions"}


def connected(admin: redis.Redis, name: str) -> int:
    return sum(1 for c in admin.client_list() if c.get("name") == name)


def disconnected(admin: redis.Redis, name: str, timeout: float = 5) -> bool:
    """Whether the server sees no connection named `name` (within `timeout`: it learns of a
    closed socket in its next event-loop turn)."""
    deadline = time.monotonic() + timeout
    while connected(admin, name):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_store_closes_its_connections_at_the_end_of_a_with_block(
    server, namespace, mode, server_only
):
    admin = redis.Redis.from_url(server.url)
    name = f"store-{namespace}"
    config = StoreConfig(namespace=namespace)

    async def async_block() -> AsyncMessageStore:
        async with AsyncMessageStore.from_url(server.url, config, client_name=name) as store:
            await store.thread("t").append(UserMessage(content="hello"))
            assert connected(admin, name) == 1
        return store

    if mode == "sync":
        with MessageStore.from_url(server.url, config, client_name=name) as store:
            store.thread("t").append(UserMessage(content="hello"))
            assert connected(admin, name) == 1
    else:
        store = asyncio.run(async_block())
    assert disconnected(admin, name)
    assert [m.content for m in MessageStore.from_url(server.url, config).thread("t").iter()] == [
        "hello"
    ]


def test_a_with_block_that_raises_closes_the_store_and_lets_the_error_through(
    server, namespace, mode, server_only
):
    admin = redis.Redis.from_url(server.url)
    name = f"store-{namespace}"

    async def async_block() -> None:
        async with AsyncMessageStore.from_url(server.url, client_name=name) as store:
            await store.thread("t").stats()
            raise KeyError("the caller's")

    with pytest.raises(KeyError, match="the caller's"):
        if mode == "sync":
            with MessageStore.from_url(server.url, client_name=name) as store:
                store.thread("t").stats()
                raise KeyError("the caller's")
        else:
            asyncio.run(async_block())
    assert disconnected(admin, name)


def test_a_store_made_from_a_client_takes_no_config_and_closes_that_client(server, server_only):
    client = redis.Redis.from_url(server.url, client_name="given-client")
    with MessageStore(client) as store:
        assert store.config == StoreConfig() and store.thread("t").stats().stored_messages == 0
    assert disconnected(redis.Redis.from_url(server.url), "given-client")


@pytest.mark.parametrize("store_class", [MessageStore, AsyncMessageStore])
def test_the_public_surface_is_small(store_class):
    public = {name for name in dir(store_class) if not name.startswith("_")}
    assert public == PUBLIC, sorted(public ^ PUBLIC)
    store = store_class.in_memory()
    assert {name for name in vars(store) if not name.startswith("_")} == ATTRIBUTES
    for internal in (
        "script",
        "missed",
        "load_failed",
        "wait_command",
        "script_error",
        "check_durable",
    ):
        assert not hasattr(store, internal), internal


def test_health_report_is_exported():
    assert "HealthReport" in kvstore.__all__
    assert kvstore.HealthReport is type(MessageStore.in_memory().health())


@pytest.mark.parametrize("store_class", [MessageStore, AsyncMessageStore])
@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"namespace": "chat"}, "StoreConfig(namespace=...)"),
        ({"chunk_size": 32}, "a StoreConfig setting"),
        ({"socket_timeot": 5}, "socket_timeot"),
        ({"decode_responses": True}, "decode_responses must be False"),
    ],
)
def test_from_url_refuses_an_argument_the_client_cannot_take_before_sending_anything(
    server, server_only, store_class, kwargs, says
):
    """redis-py takes any keyword and fails on the first call, deep in its pool; the store says
    at once which argument, and where a StoreConfig field belongs."""
    admin = redis.Redis.from_url(server.url)
    before = admin.info("stats")["total_connections_received"]
    with pytest.raises(kvstore.errors.ConfigError, match=re.escape(says)):
        store_class.from_url(server.url, **kwargs)
    assert admin.info("stats")["total_connections_received"] == before
    admin.close()


@pytest.mark.parametrize("store_class", [MessageStore, AsyncMessageStore])
def test_from_url_refuses_a_url_it_cannot_read_as_a_config_error(store_class):
    with pytest.raises(kvstore.errors.ConfigError, match="http://"):
        store_class.from_url("http://localhost:6379/0")


def test_from_url_passes_the_client_its_own_arguments(server, server_only, namespace):
    config = StoreConfig(namespace=namespace)
    with MessageStore.from_url(server.url, config, socket_timeout=7, decode_responses=False) as s:
        assert s.client.connection_pool.connection_kwargs["socket_timeout"] == 7
        assert s.thread("t").append(UserMessage(content="hi"))[0].seq_id == 1
