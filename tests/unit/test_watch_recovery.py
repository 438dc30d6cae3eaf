"""A cluster watcher's bounded retry (kvstore/_engine/watch_recovery.py), without a server: which
failures it recovers from, the pauses and their bound, the typed errors it raises, and the
store's reads of the messages an event names sent again after their connection was lost."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

from kvstore import errors
from kvstore._engine import watch_recovery
from kvstore._engine.drivers import Sleep
from kvstore._engine.operation import Batch


class RedisCluster:  # is_cluster() goes by the client's module
    pass


RedisCluster.__module__ = "redis.cluster"
CLUSTER, STANDALONE = RedisCluster(), redis.Redis()

RECOVERABLE = [
    MovedError("3999 127.0.0.1:7001"),
    AskError("3999 127.0.0.1:7001"),
    TryAgainError(),
    ClusterDownError("CLUSTERDOWN"),
    ResponseError("UNBLOCKED force unblock from blocking operation"),
    redis.ConnectionError("reset"),
    redis.TimeoutError("timed out"),
    SlotNotCoveredError("no node"),
]


@pytest.mark.parametrize("exc", RECOVERABLE, ids=lambda e: type(e).__name__)
def test_a_cluster_watcher_recovers_from_moves_failovers_and_lost_nodes(exc):
    assert watch_recovery.recoverable(CLUSTER, exc)
    assert not watch_recovery.recoverable(STANDALONE, exc)


def test_other_refusals_are_not_retried_and_every_failure_is_typed():
    wrongtype = ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    assert not watch_recovery.recoverable(CLUSTER, wrongtype)
    assert type(watch_recovery.failed(wrongtype)) is errors.ServerError
    for exc in RECOVERABLE:
        failed = watch_recovery.failed(exc)
        assert isinstance(failed, errors.KVStoreError)
        assert not isinstance(failed, redis.RedisError)
    assert isinstance(watch_recovery.failed(redis.ConnectionError()), errors.ConnectionFailed)


def test_the_pauses_start_at_once_double_and_end_at_the_bound(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(watch_recovery.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(watch_recovery, "RECOVERY_SECONDS", 3.0)
    recovery = watch_recovery.Recovery()
    pauses = []
    with pytest.raises(errors.ConnectionFailed, match="3 s"):
        while True:
            pauses.append(recovery.pause(redis.ConnectionError("refused")))
            now[0] += pauses[-1] + 0.01
    assert pauses[:5] == [0.0, 0.05, 0.1, 0.2, 0.4]
    assert max(pauses) <= watch_recovery._LAST_PAUSE_S
    assert now[0] - 100.0 <= 3.0 + 0.01 * len(pauses)


def _read_one():
    reply = yield Batch([("HMGET", "k", "f")])
    return reply


def test_a_read_that_lost_its_connection_is_sent_again_on_a_fresh_map():
    steps = watch_recovery.patient(_read_one())
    read = next(steps)
    assert isinstance(steps.throw(errors.ConnectionFailed("reset")), Sleep)
    refresh = steps.send(None)
    assert isinstance(refresh, watch_recovery.RefreshMap) and refresh.failed_at > 0
    assert steps.send(None) is read
    with pytest.raises(StopIteration) as done:
        steps.send([b"v"])
    assert done.value.value == [b"v"]


def test_a_read_still_failing_at_the_bound_raises_connection_failed(monkeypatch):
    monkeypatch.setattr(watch_recovery, "RECOVERY_SECONDS", 0.0)
    steps = watch_recovery.patient(_read_one())
    next(steps)
    with pytest.raises(errors.ConnectionFailed, match="no primary that answered"):
        steps.throw(errors.ConnectionFailed("reset"))
    other = watch_recovery.patient(_read_one())
    next(other)
    with pytest.raises(errors.MessageNotFound):  # any other typed error goes to the operation
        other.throw(errors.MessageNotFound("gone"))


class CountingCluster:
    __module__ = "redis.cluster"

    def __init__(self):
        self.reads = 0
        self.nodes_manager = self

    def initialize(self):
        self.reads += 1


def test_watchers_that_lost_their_node_at_once_read_the_slot_map_once():
    client = CountingCluster()
    recoveries = [watch_recovery.Recovery() for _ in range(5)]
    for recovery in recoveries:
        recovery.pause(redis.ConnectionError("reset"))
    for recovery in recoveries:
        watch_recovery.refresh(client, recovery.failed_at)
    assert client.reads == 1
    recoveries[0].pause(redis.ConnectionError("reset again"))  # failed after that read
    watch_recovery.refresh(client, recoveries[0].failed_at)
    assert client.reads == 2


def test_asyncio_watchers_share_their_reads_of_the_slot_map_too():
    import asyncio

    class AsyncCounting(CountingCluster):
        async def initialize(self):
            self.reads += 1
            await asyncio.sleep(0.01)

    client = AsyncCounting()

    async def main():
        recoveries = [watch_recovery.Recovery() for _ in range(5)]
        for recovery in recoveries:
            recovery.pause(redis.ConnectionError("reset"))
        await asyncio.gather(
            *(watch_recovery.refresh_async(client, r.failed_at) for r in recoveries)
        )

    asyncio.run(main())
    assert client.reads == 1
