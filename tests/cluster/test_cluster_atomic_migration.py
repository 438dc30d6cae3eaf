"""Valkey 9's atomic slot migration (CLUSTER MIGRATESLOTS) of a busy slot, while worker
processes append with otids (two sync, two asyncio) and read.

The source streams the slot to the target and hands it over in one step, so clients see no
ASK/TRYAGAIN window of half-moved keys as with the SETSLOT/MIGRATE resharding
(test_cluster_resharding.py): a script on the slot runs wholly on the source or wholly on the
target. Checked: every acknowledged message stored exactly once, no batch in part, layout
invariants, every key on the target, no error reaching a worker untyped, a watch-only store's
watcher of one of the threads delivering each message once and in order; measured: the
migration's time and the longest append. Runs on the server kinds that have the command (the
embedded Valkey 9 does; Redis has its own, CLUSTER MIGRATION, from 8.4).
"""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from redis.crc import key_slot

from kvstore import MessageStore, StoreConfig, UserMessage

from ..support.layout_check import check_layout
from .harness import Cluster, cluster_binaries, thread_ids_in_slot, wait_until
from .workload import (
    WatchOnly,
    acked_count,
    check_ledger,
    errors_by_type,
    read_jsonl,
    start_workers,
    stop_workers,
    wait_for_acks,
)

SMALL = dict(window_size=8, chunk_size=4, chunk_max_bytes=4096)
WORKERS = 4
BATCH = 2
LONG_THREAD_MESSAGES = 1000


def _migrate_atomically(cluster: Cluster, slot: int, target) -> float:
    """CLUSTER MIGRATESLOTS on the slot's owner; returns the seconds until every node agrees."""
    source = cluster.owner(slot)
    started = time.monotonic()
    source.admin.execute_command(
        "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", target.node_id
    )
    wait_until(lambda: cluster.owner(slot) is target, 30, f"slot {slot} on {target.name}")
    cluster.wait_healthy()
    return time.monotonic() - started


# The embedded Valkey (9.x) has it; the other kinds of the matrix (Redis, Valkey 8) do not.
@pytest.mark.parametrize("kind", [k for k in cluster_binaries() if k == "valkey"])
def test_a_busy_slot_moved_by_atomic_migration_loses_nothing(kind, tmp_path):
    cluster = Cluster(kind, cluster_binaries()[kind]).start(primaries=3, replicas=0)
    processes: list = []
    try:
        admin = cluster.primaries()[0].admin
        try:
            admin.execute_command("COMMAND", "INFO", "CLUSTER|MIGRATESLOTS")
        except redis.ResponseError as exc:  # the embedded Valkey must have it
            pytest.fail(f"{kind} has no CLUSTER MIGRATESLOTS: {exc}")
        namespace = f"m{uuid.uuid4().hex[:10]}"
        config = StoreConfig(namespace=namespace, **SMALL)
        slot = key_slot(b"atomic-0")
        *worker_threads, long_id = thread_ids_in_slot(slot, "atomic", 4)
        store = MessageStore(cluster.client(), config)
        long_thread = store.thread(long_id)
        for b in range(LONG_THREAD_MESSAGES // 10):
            long_thread.append(
                [UserMessage(content=f"long {b}.{i}", otid=f"long-{b}-{i}") for i in range(10)]
            )
        watcher = WatchOnly(cluster.client(), config, worker_threads[0])
        ports = [n.port for n in cluster.nodes]
        processes += start_workers(
            "atomic", WORKERS, ports, namespace, SMALL, worker_threads, tmp_path, BATCH
        )
        assert wait_for_acks(tmp_path, 40, processes)
        target = next(n for n in cluster.primaries() if n is not cluster.owner(slot))
        before = acked_count(tmp_path)
        seconds = _migrate_atomically(cluster, slot, target)
        during = acked_count(tmp_path) - before
        assert wait_for_acks(tmp_path, before + during + 40, processes)
        stop_workers(tmp_path, processes)

        report = check_ledger(store, worker_threads, tmp_path, BATCH)
        stored = [(m.seq_id, m.otid) for m in store.thread(worker_threads[0]).iter()]
        watched = watcher.stop_at(stored[-1][0])
        worker_errors = errors_by_type(read_jsonl("errors-*.jsonl", tmp_path), 60)
        ledger = read_jsonl("ledger-*.jsonl", tmp_path)
        longest = max(e["acked"] - e["sent"] for e in ledger)
        print(
            f"{kind}: slot {slot} moved atomically in {seconds:.2f}s; {during} appends acknowledged"
            f" meanwhile; longest append {longest:.2f}s; worker errors {worker_errors}"
        )
        assert report.problems == [] and report.lost == [], (report.problems, report.lost)
        assert watched == stored, "the watch-only store's watcher: each message once, in order"
        assert [k for k in worker_errors if "kvstore.errors" not in k] == [], worker_errors
        for thread_id in (*worker_threads, long_id):
            check_layout(store.client, store.thread(thread_id).keys, config)
        assert [m.seq_id for m in long_thread.iter()] == list(range(1, LONG_THREAD_MESSAGES + 1))
        assert [key for node, key in cluster.keys_of(f"{namespace}:*") if node is not target] == []
    finally:
        stop_workers(tmp_path, processes, timeout=10)
        cluster.teardown()
