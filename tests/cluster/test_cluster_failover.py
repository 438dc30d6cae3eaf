"""Failover while worker processes append: a coordinated CLUSTER FAILOVER on one shard, then a
primary killed with SIGKILL on another (its replica takes over after cluster-node-timeout, 1 s).

Four workers (two sync, two asyncio) append with otids to two threads on each shard and keep a
ledger of acknowledged appends. Writes must continue once the new primaries are elected, and every
acknowledged message must be stored exactly once, except what the server may lose by design:
replication is asynchronous, so a write the killed primary acknowledged but had not yet sent to
its replica is gone after the replica takes over (redis.io, "Redis Cluster consistency
guarantees"; the same holds for Valkey). A coordinated failover loses nothing: the replica
catches up with the primary before it switches.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import pytest
from redis.crc import key_slot

from kvstore import MessageStore, StoreConfig, UserMessage, errors

from ..support.layout_check import check_layout
from .harness import Cluster, cluster_binaries, thread_ids_on_each_primary, wait_until
from .workload import (
    LedgerReport,
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
STEP_ACKS = 60  # appends acknowledged between the steps


@dataclass
class Failover:
    kind: str
    coordinated_threads: list[str]  # threads on the shard failed over with CLUSTER FAILOVER
    killed_threads: list[str]  # threads on the shard whose primary was killed
    other_threads: list[str]
    coordinated_at: float  # when CLUSTER FAILOVER was sent
    coordinated_done: float  # when the cluster agreed on the new primary
    killed_at: float
    elected_at: float  # when the cluster agreed on the replica as primary
    restarted_at: float
    report: LedgerReport
    ledger: list[dict]
    errors: list[dict]
    noscript_on_promoted: dict[str, int]
    layout_problems: list[str]


@pytest.fixture(scope="module")
def failed_over(cluster_kind, tmp_path_factory) -> Failover:
    out = tmp_path_factory.mktemp(f"failover-{cluster_kind}")
    cluster = Cluster(cluster_kind, cluster_binaries()[cluster_kind]).start(primaries=3, replicas=1)
    processes = []
    try:
        namespace = f"f{uuid.uuid4().hex[:10]}"
        config = StoreConfig(namespace=namespace, **SMALL)
        shards = {}
        for suffix in ("a", "b"):
            for owner, thread_id in thread_ids_on_each_primary(cluster, f"failover-{suffix}"):
                shards.setdefault(owner.node_id, []).append(thread_id)
        (first, first_threads), (second, second_threads), (_, other_threads) = shards.items()
        thread_ids = [t for threads in shards.values() for t in threads]

        ports = [n.port for n in cluster.nodes]
        processes += start_workers(
            "failover", WORKERS, ports, namespace, SMALL, thread_ids, out, BATCH
        )

        def progress(more: int) -> None:
            wait_for_acks(out, len(read_jsonl("ledger-*.jsonl", out)) + more, processes)

        progress(STEP_ACKS)
        (replica,) = cluster.replicas_of(cluster.node_by_id(first))
        coordinated_at = time.time()
        cluster.failover(replica)
        coordinated_done = time.time()
        progress(STEP_ACKS)

        victim = cluster.node_by_id(second)
        (heir,) = cluster.replicas_of(victim)
        killed_at = time.time()
        cluster.kill(victim)
        cluster.wait_healthy(dead=(victim,))
        elected_at = time.time()
        progress(STEP_ACKS)
        cluster.restart(victim)  # rejoins as a replica of its heir
        restarted_at = time.time()
        progress(STEP_ACKS)
        stop_workers(out, processes)

        store = MessageStore(cluster.client(), config)
        report = check_ledger(store, thread_ids, out, BATCH)
        layout_problems = []
        for thread_id in thread_ids:
            try:
                check_layout(store.client, store.thread(thread_id).keys, config)
            except AssertionError as exc:
                layout_problems.append(f"{thread_id}: {exc}")
        return Failover(
            kind=cluster_kind,
            coordinated_threads=first_threads,
            killed_threads=second_threads,
            other_threads=other_threads,
            coordinated_at=coordinated_at,
            coordinated_done=coordinated_done,
            killed_at=killed_at,
            elected_at=elected_at,
            restarted_at=restarted_at,
            report=report,
            ledger=read_jsonl("ledger-*.jsonl", out),
            errors=read_jsonl("errors-*.jsonl", out),
            noscript_on_promoted={
                node.name: node.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0)
                for node in (replica, heir)
            },
            layout_problems=layout_problems,
        )
    finally:
        stop_workers(out, processes, timeout=10)
        cluster.teardown()


def summary(result: Failover) -> str:
    by_type = errors_by_type(result.errors, 70)
    killed = set(result.killed_threads)
    stalls = [
        e["acked"] - e["sent"]
        for e in result.ledger
        if e["thread"] in killed and e["sent"] < result.elected_at
    ]
    return (
        f"{result.kind}: {result.report.acknowledged} messages acknowledged, {len(result.report.lost)} lost"
        f" ({[(m['thread'], m['seq'], round(m['acked'] - result.killed_at, 3)) for m in result.report.lost]});"
        f" CLUSTER FAILOVER took {result.coordinated_done - result.coordinated_at:.2f}s, the kill -9 to the"
        f" elected replica {result.elected_at - result.killed_at:.2f}s; longest append on the killed shard"
        f" {max(stalls, default=0):.2f}s; NOSCRIPT on the promoted replicas {result.noscript_on_promoted};"
        f" errors seen by the workers: {by_type}"
    )


def test_acknowledged_appends_survive_failover_except_unreplicated_writes_of_the_killed_primary(
    failed_over,
):
    report = failed_over.report
    assert report.problems == [], summary(failed_over)
    assert failed_over.layout_problems == [], summary(failed_over)
    killed = set(failed_over.killed_threads)
    for lost in report.lost:
        # Only the killed primary may lose writes, only ones it acknowledged before it died, and
        # only the newest of each thread (the tail it had not yet replicated).
        assert lost["thread"] in killed, summary(failed_over)
        assert lost["acked"] <= failed_over.killed_at, summary(failed_over)
    for thread_id in killed:
        lost = [m["seq"] for m in report.lost if m["thread"] == thread_id]
        kept = [
            seq
            for entry in failed_over.ledger
            if entry["thread"] == thread_id and entry["acked"] <= failed_over.killed_at
            for seq in entry["seqs"]
            if not any(m["thread"] == thread_id and m["seq"] == seq for m in report.lost)
        ]
        assert not lost or min(lost) > max(kept, default=0), summary(failed_over)
    print(summary(failed_over))


def test_writes_continue_on_every_shard_after_each_failover(failed_over):
    def acked_after(threads: list[str], moment: float) -> set[str]:
        return {
            e["thread"] for e in failed_over.ledger if e["thread"] in threads and e["sent"] > moment
        }

    coordinated = failed_over.coordinated_threads
    killed = failed_over.killed_threads
    assert acked_after(coordinated, failed_over.coordinated_done) == set(coordinated), summary(
        failed_over
    )
    assert acked_after(killed, failed_over.elected_at) == set(killed), summary(failed_over)
    assert acked_after(killed, failed_over.restarted_at) == set(killed), summary(failed_over)
    others = failed_over.other_threads
    assert acked_after(others, failed_over.elected_at) == set(others), summary(failed_over)


def test_promoted_replicas_answer_noscript_and_the_store_reloads(failed_over):
    """The script cache is not replicated: each promoted replica answered NOSCRIPT at least once,
    and the store sent the script there and carried on (the ledger test shows the writes)."""
    assert all(count >= 1 for count in failed_over.noscript_on_promoted.values()), summary(
        failed_over
    )


def test_no_error_escapes_kvstore_untyped_during_failover(failed_over):
    """A dead primary's calls fail until the replica takes over: a write as OutcomeUnknown, which
    the caller re-sends; nothing may reach the caller as a raw redis-py exception."""
    untyped = [e for e in failed_over.errors if not e.get("typed") and not e.get("gave_up")]
    assert untyped == [], summary(failed_over)


def test_a_kill_before_replication_loses_only_the_unreplicated_tail_and_the_thread_stays_whole(
    fresh_cluster,
):
    """The case the server documents: the primary acknowledges, dies before its replica got the
    write, and the replica takes over without it. Made certain here: the replica is stopped
    (SIGSTOP) and its link closed by the primary, the primary acknowledges 5 appends that go
    nowhere but its own backlog, then it is killed and the replica resumed."""
    cluster = fresh_cluster(primaries=3, replicas=1)
    namespace = f"l{uuid.uuid4().hex[:10]}"
    config = StoreConfig(namespace=namespace, **SMALL)
    store = MessageStore(cluster.client(), config)
    (primary, thread_id), *_ = thread_ids_on_each_primary(cluster, "lossy")
    thread = store.thread(thread_id)
    replicated = []
    for i in range(10):
        replicated += thread.append(
            [UserMessage(content=f"r{i}.{j}", otid=f"r{i}-{j}") for j in range(2)]
        )
    (replica,) = cluster.replicas_of(primary)
    offset = primary.info("replication")["master_repl_offset"]
    wait_until(
        lambda: replica.info("replication")["slave_repl_offset"] >= offset,
        10,
        "the replica to catch up",
    )

    replica.pause()
    try:
        assert primary.admin.execute_command("CLIENT", "KILL", "TYPE", "replica") == 1
        unreplicated = []
        for i in range(5):
            unreplicated += thread.append(
                [UserMessage(content=f"u{i}.{j}", otid=f"u{i}-{j}") for j in range(2)]
            )
        cluster.kill(primary)
    finally:
        replica.resume()
    cluster.wait_healthy(dead=(primary,))
    assert cluster.owner(key_slot(thread.keys.meta.encode())) is replica

    # The 20 replicated messages are there; the 10 acknowledged but unreplicated ones are not.
    assert list(thread.iter()) == replicated
    assert [m.seq_id for m in unreplicated] == list(range(21, 31))
    assert thread.stats().next_sequence == 21
    check_layout(store.client, thread.keys, config)
    # The thread carries on consistently: the lost sequences are assigned again, and re-sending
    # the lost calls stores them (their otids are unknown to the new primary: not a replay).
    resent = []
    for i in range(5):
        resent += thread.append(
            [UserMessage(content=f"u{i}.{j}", otid=f"u{i}-{j}") for j in range(2)]
        )
    assert [m.seq_id for m in resent] == list(range(21, 31))
    assert [m.otid for m in thread.iter()] == [m.otid for m in replicated + unreplicated]
    # The killed primary comes back as a replica and takes the new primary's data: nothing it
    # had alone comes back.
    cluster.restart(primary)
    assert cluster.replicas_of(replica) == [primary]
    assert [m.id for m in thread.iter()] == [m.id for m in replicated + resent]
    check_layout(store.client, thread.keys, config)


def test_calls_on_a_shard_whose_primary_is_down_raise_kvstore_errors(
    fresh_cluster, thread_on, mode
):
    """Between a primary's death and its replica's election (here: no replica at all), every call
    on its threads fails: a write as OutcomeUnknown, a read as a kvstore error too, never as a raw
    redis-py exception. Threads on the other primaries are not affected."""
    cluster = fresh_cluster(primaries=3)
    (dead, dead_id), (_alive, alive_id), _ = thread_ids_on_each_primary(cluster, "down")
    thread = thread_on(cluster, dead_id, **SMALL)
    other = thread_on(cluster, alive_id, **SMALL)
    stored = thread.append([UserMessage(content=f"m{i}") for i in range(20)])
    other.append(UserMessage(content="elsewhere"))
    cluster.kill(dead)
    calls = {
        "append": lambda: thread.append(UserMessage(content="x", otid="x")),
        "newest page": lambda: thread.list(limit=5, order="desc"),
        "list by cursor": lambda: thread.list(after=3, limit=5),
        "get": lambda: thread.get(stored[0].id),
        "stats": lambda: thread.stats(),
    }
    outcomes = {}
    for name, call in calls.items():
        started = time.monotonic()
        try:
            call()
        except errors.KVStoreError as exc:
            outcomes[name] = type(exc).__name__
        except Exception as exc:
            outcomes[name] = (
                f"untyped {type(exc).__module__}.{type(exc).__qualname__}: {str(exc)[:80]}"
            )
        else:
            outcomes[name] = "succeeded with its primary dead"
        outcomes[name] += f" ({time.monotonic() - started:.2f}s)"
    report = "; ".join(f"{k}: {v}" for k, v in outcomes.items())
    assert outcomes["append"].startswith("OutcomeUnknown"), report
    assert other.append(UserMessage(content="still fine"))[0].seq_id == 2
    assert [k for k, v in outcomes.items() if v.startswith(("untyped", "succeeded"))] == [], report
