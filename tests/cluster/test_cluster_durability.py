"""durability="replicated" and "fsync" on a cluster client, sync and async: the write and its
WAIT go on one connection to the primary that owns the thread's slot (kvstore/_engine/primary.py),
so WAIT counts that primary's replicas and no other node's; a shortfall is NotDurable and a
re-send with the same otids stores nothing twice; a moved slot and a failover are followed."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from kvstore import UserMessage, errors

from .harness import thread_ids_on_each_primary


def _stored(thread) -> list[str]:
    return [m.otid for m in thread.iter()]


def test_a_replicated_write_waits_for_its_own_primarys_replica(cluster, cluster_thread, mode):
    """On each primary: a write confirmed by its replica; a second replica asked for, which no
    shard has, is NotDurable after the write, and the re-send stores nothing twice."""
    for owner, thread_id in thread_ids_on_each_primary(cluster, "durable"):
        thread = cluster_thread(thread_id, durability="replicated", durability_timeout_ms=2000)
        stored = thread.append(UserMessage(content="kept", otid="m1"))
        assert stored[0].seq_id == 1
        (replica,) = cluster.replicas_of(owner)
        # Confirmed by WAIT on the owner: the replica holds the write when append returns.
        replica.admin.execute_command("READONLY")
        assert replica.admin.exists(thread.keys.meta) == 1

        greedy = cluster_thread(
            thread_id, durability="replicated", durability_replicas=2, durability_timeout_ms=100
        )
        for _ in range(2):  # the first call writes, the re-send is a replay: NotDurable both
            with pytest.raises(errors.NotDurable):
                greedy.append(UserMessage(content="short", otid="m2"))
        assert _stored(thread) == ["m1", "m2"]


def test_fsync_on_a_cluster_without_aof_is_refused_before_any_write(cluster, cluster_thread, mode):
    (_, thread_id), *_ = thread_ids_on_each_primary(cluster, "fsync")
    thread = cluster_thread(thread_id, durability="fsync")
    with pytest.raises(errors.ConfigError, match="WAITAOF"):
        thread.append(UserMessage(content="never", otid="f1"))
    assert cluster_thread(thread_id).snapshot().stats.next_sequence == 1


def test_a_paused_replica_fails_its_own_shards_writes_only_and_a_moved_slot_is_followed(
    fresh_cluster, thread_on, mode
):
    """WAIT sent to any other node would count that node's replicas (all well): with the
    replica of the thread's primary stopped, only the thread's own primary can say NotDurable.
    Then the slot moves to another primary, and fails over to its replica: the store follows
    each and writes there, once."""
    cluster = fresh_cluster(primaries=3, replicas=1)
    (owner, thread_id), (other, _), *_ = thread_ids_on_each_primary(cluster, "paused")
    thread = thread_on(cluster, thread_id, durability="replicated", durability_timeout_ms=300)
    thread.append(UserMessage(content="before", otid="p1"))
    (replica,) = cluster.replicas_of(owner)
    replica.pause()
    try:
        with pytest.raises(errors.NotDurable):
            thread.append(UserMessage(content="unconfirmed", otid="p2"))
    finally:
        replica.resume()
    thread.append(UserMessage(content="unconfirmed", otid="p2"))  # confirmed now, a replay

    cluster.migrate_slot(key_slot(thread.keys.meta.encode()), other)
    assert cluster.owner(key_slot(thread.keys.meta.encode())) is other
    stored = thread.append(UserMessage(content="after the move", otid="p3"))
    assert stored[0].seq_id == 3
    (new_replica,) = cluster.replicas_of(other)
    new_replica.admin.execute_command("READONLY")
    assert new_replica.admin.exists(thread.keys.meta) == 1
    assert _stored(thread) == ["p1", "p2", "p3"]

    # A coordinated failover: the old primary answers MOVED, the store follows to the new one;
    # a re-send of what was stored before it is a replay there.
    cluster.failover(new_replica)
    assert thread.append(UserMessage(content="after the move", otid="p3")).replayed
    assert thread.append(UserMessage(content="after the failover", otid="p4"))[0].seq_id == 4
    assert _stored(thread) == ["p1", "p2", "p3", "p4"]
