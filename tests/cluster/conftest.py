"""Cluster tiers: a 3-primary cluster of each server kind of the matrix (tests/support/servers.py:
Valkey always, Debian Redis where installed and required in CI), formed by
tests/cluster/harness.py on free loopback ports.

`cluster` is one shared cluster per server kind for the whole session (3 primaries, one replica
each); tests that kill nodes or move slots take a `fresh_cluster` of their own instead, so a
failure there cannot leak into the others. Each test gets a fresh random namespace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kvstore import AsyncMessageStore, MessageStore, StoreConfig

from ..support.facade import SyncFacade
from .harness import Cluster, cluster_binaries

_shared: dict[str, Cluster] = {}


def pytest_generate_tests(metafunc):
    if "cluster_kind" in metafunc.fixturenames:
        metafunc.parametrize("cluster_kind", list(cluster_binaries()), scope="session")


@pytest.fixture(scope="session")
def cluster(cluster_kind) -> Iterator[Cluster]:
    """The session's shared cluster of this kind: 3 primaries with one replica each."""
    if cluster_kind not in _shared:
        _shared[cluster_kind] = Cluster(cluster_kind, cluster_binaries()[cluster_kind]).start(
            primaries=3, replicas=1
        )
    yield _shared[cluster_kind]


def pytest_sessionfinish(session, exitstatus):
    for shared in _shared.values():
        shared.teardown()
    _shared.clear()


@pytest.fixture
def fresh_cluster(cluster_kind):
    """fresh_cluster(primaries=3, replicas=0) -> a cluster of this test's own, torn down after it."""
    made: list[Cluster] = []

    def make(primaries: int = 3, replicas: int = 0) -> Cluster:
        made.append(
            Cluster(cluster_kind, cluster_binaries()[cluster_kind]).start(primaries, replicas)
        )
        return made[-1]

    yield make
    for one in made:
        one.teardown()


@pytest.fixture
def thread_on(mode, namespace):
    """thread_on(cluster, thread_id, **config) -> a thread on that cluster through a RedisCluster
    client (sync or asyncio, per `mode`), with sync-looking methods."""
    loop = asyncio.new_event_loop() if mode == "async" else None
    stores: list = []

    def make(cluster: Cluster, thread_id: str, **config_values):
        config = StoreConfig(namespace=namespace, **config_values)
        if mode == "sync":
            store = MessageStore(cluster.client(), config)
            stores.append(store)
            return store.thread(thread_id)
        store = AsyncMessageStore(cluster.async_client(), config)
        stores.append(store)
        return SyncFacade(store.thread(thread_id), loop)

    yield make
    for store in stores:
        try:
            if mode == "async":
                loop.run_until_complete(store.close())
            else:
                store.close()
        except Exception:  # a client of a cluster a test tore down already
            pass
    if loop:
        loop.close()


@pytest.fixture
def cluster_thread(cluster, thread_on):
    """cluster_thread(thread_id, **config) -> a thread on the shared cluster (see thread_on).

    After the test, no node of the cluster may have answered CROSSSLOT during it. (A script
    touching a key of another slot or node fails with an ERR reply, which kvstore raises.)"""
    before = cluster.error_stats()
    yield lambda thread_id, **config_values: thread_on(cluster, thread_id, **config_values)
    for node, counts in cluster.error_stats().items():
        grew = counts.get("CROSSSLOT", 0) - before.get(node, {}).get("CROSSSLOT", 0)
        assert grew == 0, f"{node} answered CROSSSLOT {grew} times during the test: {counts}"


@pytest.fixture
def raw_cluster(cluster):
    """A plain RedisCluster client (bytes) for inspecting state."""
    return cluster.client()
