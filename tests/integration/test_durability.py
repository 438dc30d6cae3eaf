"""Durability modes: what an acknowledged write waits for, on servers that have it."""

from __future__ import annotations

import time

import pytest
import redis

from kvstore import MessageStore, StoreConfig, UserMessage, errors

from ..support.servers import ServerProcess, redis_binary, valkey_binary


@pytest.fixture
def aof_valkey():
    server = ServerProcess(
        "valkey-aof", valkey_binary(), ["--appendonly", "yes", "--appendfsync", "always"]
    ).start()
    yield server
    server.cleanup()


def test_fsync_mode_waits_for_the_aof(aof_valkey, namespace):
    store = MessageStore.from_url(
        aof_valkey.url, StoreConfig(namespace=namespace, durability="fsync")
    )
    thread = store.thread("t")
    stored = thread.append([UserMessage(content=f"m{i}") for i in range(3)])
    assert [m.seq_id for m in stored] == [1, 2, 3]
    thread.start_turn("turn")
    assert thread.list().messages == stored


def test_fsync_mode_is_refused_before_writing_where_the_server_cannot_do_it(namespace):
    servers = [ServerProcess("valkey-noaof", valkey_binary()).start()]
    if redis_binary():
        servers.append(ServerProcess("redis-7.0", redis_binary(), ["--appendonly", "yes"]).start())
    try:
        for server in servers:
            store = MessageStore.from_url(
                server.url, StoreConfig(namespace=namespace, durability="fsync")
            )
            with pytest.raises(errors.ConfigError, match="WAITAOF"):
                store.thread("t").append(UserMessage(content="x"))
            assert redis.Redis.from_url(server.url).keys(f"{namespace}:*") == []
    finally:
        for server in servers:
            server.cleanup()


def test_replicated_mode_waits_for_a_replica_and_reports_a_shortfall(namespace):
    primary = ServerProcess("primary", valkey_binary()).start()
    replica = None
    try:
        config = StoreConfig(
            namespace=namespace, durability="replicated", durability_timeout_ms=200
        )
        thread = MessageStore.from_url(primary.url, config).thread("t")
        # No replica: the write happens, but it is not confirmed durable.
        with pytest.raises(errors.NotDurable, match="reached 0 of 1 replicas"):
            thread.append(UserMessage(content="lonely", otid="o1"))
        assert [
            m.content
            for m in MessageStore.from_url(primary.url, StoreConfig(namespace=namespace))
            .thread("t")
            .iter()
        ] == ["lonely"]
        # With a replica attached, the same mode acknowledges.
        replica = ServerProcess(
            "replica", valkey_binary(), ["--replicaof", "127.0.0.1", str(primary.port)]
        ).start()
        deadline = time.monotonic() + 10
        while (
            redis.Redis.from_url(primary.url).info("replication").get("slave0", {}).get("state")
            != "online"
        ):
            assert time.monotonic() < deadline, "the replica did not connect"
            time.sleep(0.05)
        patient = StoreConfig(
            namespace=namespace, durability="replicated", durability_timeout_ms=5000
        )
        thread = MessageStore.from_url(primary.url, patient).thread("t")
        stored = thread.append(UserMessage(content="safe"))
        assert stored[0].seq_id == 2
        replica_client = redis.Redis.from_url(replica.url)
        assert replica_client.hget(thread.keys.ids, stored[0].id) == b"2"
        # Re-sending the call that fell short stores nothing twice.
        assert thread.append(UserMessage(content="lonely", otid="o1"))[0].seq_id == 1
    finally:
        primary.cleanup()
        if replica:
            replica.cleanup()


def test_durability_values_are_checked():
    with pytest.raises(errors.ConfigError):
        StoreConfig(durability="sometimes")
    with pytest.raises(errors.ConfigError):
        StoreConfig(durability="replicated", durability_replicas=0)
