"""Network partitions of a real cluster (3 primaries, one replica each, every node a test host of
its own: tests/partition/netlab.py), while worker processes append with otids and keep a ledger
of what was acknowledged (tests/cluster/workload.py).

Each scenario cuts links around one primary P (the one owning the first shard's threads), holds
the partition for HOLD_S (longer than the cluster's node timeout, so the majority promotes P's
replica where it can no longer see P), heals in the scenario's order, and then checks the ledger:

- under ``durability="replicated"``: every acknowledged message stored, exactly once, at the
  sequence it was acknowledged with (acked-lost 0);
- under ``"default"``: the same, except that acknowledged messages of P's threads may be lost
  when P went on accepting writes its replica never received (P cut from its shard while clients
  still reach it) and the replica was promoted: counted, reported, never hidden;
- always: no duplicate, no sequence gap, no batch in part, every thread's layout invariants
  true, and writes resume on every thread after healing;
- a watcher on a store used only for watching, on one of P's threads from its start: it
  delivers every stored message exactly once and in order; where a failover took back P's own
  history after the watcher delivered it (P cut from its shard while clients reach it), it
  delivers the sequences from there again as they are now, so its last word on each sequence
  is what is stored (`taken back` counts what it delivered that is not).

The CI run takes a subset (one scenario per kind of cut); ``KVSTORE_LONG=1 python -m pytest
tests/partition -s`` runs every scenario under both durability modes and prints the table
docs/SCALING.md quotes.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import redis
from redis.crc import key_slot

from kvstore import MessageStore, StoreConfig

from ..cluster.harness import cluster_binaries, thread_ids_on_each_primary, wait_until
from ..cluster.workload import (
    LedgerReport,
    WatchOnly,
    check_ledger,
    errors_by_type,
    read_jsonl,
    start_workers,
    stop_workers,
    wait_for_acks,
)
from ..support.layout_check import check_layout
from .netcluster import NetCluster, NetNode
from .netlab import CLIENTS, NetLab, available

SMALL = dict(window_size=8, chunk_size=4, chunk_max_bytes=4096)
WORKERS = 4
BATCH = 2
HOLD_S = 4.0  # the partition lasts this long: four node timeouts
STEP_ACKS = 30  # appends acknowledged before the cut, and after the heal


@dataclass
class Cut:
    """What a scenario does to the links around P (its replica R), and how it heals them."""

    cut: Callable[[NetLab, NetNode, NetNode, list[NetNode]], list[tuple[int, int]]]
    heal_order: str = "together"  # or "clients first" / "nodes first"
    may_lose_under_default: bool = False
    moving: bool = False  # a slot of P's threads is being moved to the other end of the cut


def _shard_and_majority(lab, p, r, others):
    return [(p.host, n.host) for n in [r, *others]]


def _everything(lab, p, r, others):
    return [(p.host, CLIENTS), *_shard_and_majority(lab, p, r, others)]


def _replica_only(lab, p, r, others):
    return [(p.host, r.host)]


def _clients_only(lab, p, r, others):
    return [(p.host, CLIENTS)]


def _to_the_move_target(lab, p, r, others):
    return [(p.host, others[0].host)]


SCENARIOS = {
    # Jepsen's case: P keeps its clients but loses its replica and the majority. It accepts writes
    # until it notices (node timeout), while the majority promotes R; healed, P follows R.
    "primary cut from its replica and the majority, clients still reach it": Cut(
        _shard_and_majority, may_lose_under_default=True
    ),
    "primary isolated, clients healed first": Cut(_everything, "clients first"),
    "primary isolated, nodes healed first": Cut(_everything, "nodes first"),
    "primary cut from its replica only": Cut(_replica_only),
    "clients cut from a primary": Cut(_clients_only),
    # A reshard's source and target cut apart halfway through moving a slot of P's threads:
    # its MIGRATE fails until the heal, then the move is finished.
    "primary cut from the target of a slot it is moving": Cut(_to_the_move_target, moving=True),
}
IN_CI = {
    ("primary cut from the target of a slot it is moving", "replicated"),
    ("primary cut from its replica and the majority, clients still reach it", "replicated"),
    ("primary cut from its replica and the majority, clients still reach it", "default"),
    ("primary isolated, nodes healed first", "replicated"),
    ("primary cut from its replica only", "replicated"),
}


def _cases():
    for name in SCENARIOS:
        for durability in ("replicated", "default"):
            marks = () if (name, durability) in IN_CI else (pytest.mark.slow,)
            yield pytest.param(name, durability, marks=marks, id=f"{name}-{durability}")


@dataclass
class Outcome:
    kind: str
    scenario: str
    durability: str
    report: LedgerReport
    shard_threads: list[str]
    cut_at: float
    healed_at: float
    recovered_s: float  # heal to the first acknowledged append after it on every thread
    stalled_s: float  # the longest time P's threads went without an acknowledged append
    errors: dict[str, int]
    layout_problems: list[str]
    watched: list[tuple[int, str | None]]  # what the watcher delivered: (sequence, otid)
    stored: list[tuple[int, str | None]]  # what the watched thread holds at the end

    def line(self) -> str:
        return (
            f"| {self.kind} | {self.scenario} | {self.durability} | {self.report.acknowledged} |"
            f" {len(self.report.lost)} | {sum('stored twice' in p for p in self.report.problems)} |"
            f" {self.stalled_s:.1f} s | {self.recovered_s:.1f} s | {len(self.watched)} |"
            f" {len(set(self.watched) - set(self.stored))} |"
            f" {sum(dict(self.watched).get(seq) != otid for seq, otid in self.stored)} |"
        )


@pytest.fixture(scope="module")
def lab():
    why = available()
    if why:
        pytest.fail(f"the partition tests need network namespaces: {why}")
    with NetLab(6) as made:
        yield made


def _run(kind: str, lab: NetLab, scenario: str, durability: str, out) -> Outcome:
    cluster = NetCluster(kind, cluster_binaries()[kind], lab).start(primaries=3, replicas=1)
    processes: list = []
    try:
        lab.heal_all()
        namespace = f"p{uuid.uuid4().hex[:10]}"
        limits = dict(SMALL, durability=durability, durability_timeout_ms=500)
        shards: dict[str, list[str]] = {}
        for suffix in ("a", "b"):
            for owner, thread_id in thread_ids_on_each_primary(cluster, f"part-{suffix}"):
                shards.setdefault(owner.node_id, []).append(thread_id)
        thread_ids = [t for threads in shards.values() for t in threads]
        p_id, shard_threads = next(iter(shards.items()))
        p = cluster.node_by_id(p_id)
        (r,) = cluster.replicas_of(p)
        others = sorted(
            (n for n in cluster.net_nodes() if n not in (p, r)), key=lambda n: n.role() != "master"
        )
        assert isinstance(p, NetNode) and isinstance(r, NetNode)
        watcher = WatchOnly(
            cluster.client(), StoreConfig(namespace=namespace, **SMALL), shard_threads[0]
        )
        processes += start_workers(
            "partition", WORKERS, cluster.addresses(), namespace, limits, thread_ids, out, BATCH
        )
        assert wait_for_acks(out, STEP_ACKS, processes), _worker_errors(out)

        cut = SCENARIOS[scenario]
        move = _SlotMove(cluster, p, others[0], shard_threads[0]) if cut.moving else None
        links = cut.cut(lab, p, r, others)
        cut_at = time.time()
        for a, b in links:
            lab.cut(a, b)
        if move is not None:
            move.attempt_while_cut()
        time.sleep(HOLD_S)
        healed_at = time.time()
        _heal(lab, links, cut.heal_order)
        if move is not None:
            move.finish()
        cluster.wait_healthy(60)
        acked = len(read_jsonl("ledger-*.jsonl", out))
        assert wait_for_acks(out, acked + STEP_ACKS, processes, timeout=60), _worker_errors(out)
        recovered = wait_until(
            lambda: _recovered(out, thread_ids, healed_at), 60, "writes on every thread"
        )
        stop_workers(out, processes)

        store = MessageStore(cluster.client(), StoreConfig(namespace=namespace, **SMALL))
        report = check_ledger(store, thread_ids, out, BATCH)
        stored = [(m.seq_id, m.otid) for m in store.thread(shard_threads[0]).iter()]
        watched = watcher.stop_at(stored[-1][0])
        layout_problems = []
        for thread_id in thread_ids:
            try:
                check_layout(store.client, store.thread(thread_id).keys, store.config)
            except AssertionError as exc:
                layout_problems.append(f"{thread_id}: {exc}")
        return Outcome(
            kind,
            scenario,
            durability,
            report,
            shard_threads,
            cut_at,
            healed_at,
            recovered - healed_at,
            _longest_stall(out, shard_threads),
            errors_by_type(read_jsonl("errors-*.jsonl", out), 50),
            layout_problems,
            watched,
            stored,
        )
    finally:
        stop_workers(out, processes, timeout=10)
        lab.heal_all()
        cluster.teardown()


class _SlotMove:
    """A reshard of the slot of `thread_id` from `source` to `target`, as the loopback harness
    moves one (IMPORTING / MIGRATING, MIGRATE a few keys at a time, SETSLOT NODE everywhere),
    begun here and moved halfway before the cut."""

    def __init__(self, cluster: NetCluster, source: NetNode, target: NetNode, thread_id: str):
        self.cluster, self.source, self.target = cluster, source, target
        self.slot = key_slot(thread_id.encode())
        target.admin.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", source.node_id)
        source.admin.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", target.node_id)
        keys = source.admin.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 1000)
        self._migrate(keys[: len(keys) // 2])
        self.failed_while_cut = False

    def _migrate(self, keys: list[str]) -> None:
        if keys:
            self.source.admin.execute_command(
                "MIGRATE", self.target.ip, self.target.port, "", 0, 1000, "KEYS", *keys
            )

    def attempt_while_cut(self) -> None:
        """One more batch, which cannot reach the target: the reshard tool's error."""
        keys = self.source.admin.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 10)
        try:
            self._migrate(keys)
        except redis.ResponseError as exc:  # IOERR: the target is out of reach
            self.failed_while_cut = "IOERR" in str(exc) or "timeout" in str(exc).lower()

    def finish(self) -> None:
        """After the heal: the rest of the keys, then the slot's owner set on every primary."""
        deadline = time.monotonic() + 30
        while keys := self.source.admin.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 50):
            try:
                self._migrate(keys)
            except redis.ResponseError:  # the link is just back: the next batch goes
                assert time.monotonic() < deadline, "the move could not go on after the heal"
                time.sleep(0.1)
        for node in (self.target, self.source, *self.cluster.primaries()):
            node.admin.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", self.target.node_id)
        assert self.failed_while_cut, "the move went on across the cut"


def _heal(lab: NetLab, links: list[tuple[int, int]], order: str) -> None:
    to_clients = [link for link in links if CLIENTS in link]
    to_nodes = [link for link in links if CLIENTS not in link]
    if order == "clients first":
        batches = [to_clients, to_nodes]
    elif order == "nodes first":
        batches = [to_nodes, to_clients]
    else:
        batches = [links]
    for number, batch in enumerate(batches):
        if number:
            time.sleep(HOLD_S / 2)  # the first healed side settles before the second
        for a, b in batch:
            lab.heal(a, b)


def _recovered(out, thread_ids: list[str], healed_at: float) -> float | None:
    """When every thread had an append acknowledged that was sent after the heal, or None."""
    firsts: dict[str, float] = {}
    for entry in read_jsonl("ledger-*.jsonl", out):
        if entry["sent"] > healed_at:
            thread = entry["thread"]
            firsts[thread] = min(firsts.get(thread, entry["acked"]), entry["acked"])
    return max(firsts.values()) if set(firsts) == set(thread_ids) else None


def _longest_stall(out, threads: list[str]) -> float:
    acked = sorted(e["acked"] for e in read_jsonl("ledger-*.jsonl", out) if e["thread"] in threads)
    return max((b - a for a, b in itertools.pairwise(acked)), default=0.0)


def _worker_errors(out) -> str:
    return str(errors_by_type(read_jsonl("errors-*.jsonl", out), 80))


@pytest.mark.parametrize(("scenario", "durability"), list(_cases()))
def test_a_partition_loses_no_acknowledged_write_and_writes_resume(
    cluster_kind, lab, scenario, durability, tmp_path
):
    outcome = _run(cluster_kind, lab, scenario, durability, tmp_path)
    print(outcome.line(), outcome.errors)
    report = outcome.report
    assert report.problems == [], (report.problems[:10], outcome.errors)
    assert outcome.layout_problems == [], outcome.layout_problems
    if durability == "replicated" or not SCENARIOS[scenario].may_lose_under_default:
        assert report.lost == [], (report.lost[:10], outcome.errors)
    else:
        # What "default" may lose: P's threads, acknowledged while P was cut off.
        for lost in report.lost:
            assert lost["thread"] in outcome.shard_threads, lost
            assert outcome.cut_at <= lost["acked"] <= outcome.healed_at, lost
    untyped = {k: v for k, v in outcome.errors.items() if "kvstore.errors" not in k}
    assert untyped == {}, untyped
    if not SCENARIOS[scenario].may_lose_under_default:
        assert outcome.watched == outcome.stored, (len(outcome.watched), len(outcome.stored))
    else:
        # P's own history may have been taken back after the watcher delivered part of it (P
        # applied writes its replica never got, acknowledged or not): once it
        # followed the slot to the promoted replica, it found the first sequence no longer held
        # as delivered and paged the thread again from there, so what it delivered last for
        # each sequence is what is stored, and it went on to the end (no false ThreadDeleted).
        final = dict(outcome.watched)
        stale = [seq for seq, otid in outcome.stored if final.get(seq) != otid]
        assert stale == [] and outcome.watched[-1] == outcome.stored[-1], stale[:10]
