"""Moving a busy slot while worker processes append to threads in it.

Four worker processes (two sync, two asyncio) append with otids and keep a ledger. The slot is
moved the way a resharding tool does it (SETSLOT IMPORTING / MIGRATING, MIGRATE 10 keys at a
time, SETSLOT NODE). The slot also holds one long thread (2,000 messages, ~500 chunk keys), so
the move lasts as long as a busy slot's does: ~1.2 s here with a 20 ms pause between batches, as
a throttled reshard would take.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

import pytest
import redis
from redis.crc import key_slot

from kvstore import MessageStore, StoreConfig, UserMessage, errors
from kvstore._engine import core as _core
from kvstore._engine.core import ThreadRef

from ..support.layout_check import check_layout
from .harness import HOST, Cluster, cluster_binaries, thread_ids_in_slot
from .workload import (
    LedgerReport,
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
LONG_THREAD_MESSAGES = 2000


@dataclass
class Resharding:
    kind: str
    slot: int
    keys_moved: int
    migration_seconds: float
    acked_before: int
    acked_during: int
    acked_after: int
    report: LedgerReport
    errors: list[dict]
    longest_append: float  # seconds from first send to acknowledgement, over every append
    layout_problems: list[str]
    keys_off_target: list[str]


@pytest.fixture(scope="module")
def resharded(cluster_kind, tmp_path_factory) -> Resharding:
    """Runs the scenario once per server kind; the tests below each check one promise."""
    out = tmp_path_factory.mktemp(f"reshard-{cluster_kind}")
    cluster = Cluster(cluster_kind, cluster_binaries()[cluster_kind]).start(primaries=3, replicas=0)
    processes = []
    try:
        namespace = f"r{uuid.uuid4().hex[:10]}"
        config = StoreConfig(namespace=namespace, **SMALL)
        slot = key_slot(b"reshard-0")
        *worker_threads, long_id = thread_ids_in_slot(slot, "reshard", 4)
        client = cluster.client()
        store = MessageStore(client, config)
        long_thread = store.thread(long_id)
        for b in range(LONG_THREAD_MESSAGES // 10):  # 10 per call: each call's rollover keeps up
            long_thread.append(
                [UserMessage(content=f"long {b}.{i}", otid=f"long-{b}-{i}") for i in range(10)]
            )

        ports = [n.port for n in cluster.nodes]
        processes += start_workers(
            "reshard", WORKERS, ports, namespace, SMALL, worker_threads, out, BATCH
        )
        wait_for_acks(out, 40, processes)

        source = cluster.owner(slot)
        target = next(n for n in cluster.primaries() if n is not source)
        acked_before = acked_count(out)
        started = time.monotonic()
        moved = cluster.migrate_slot(
            slot, target, batch=10, between_batches=lambda _: time.sleep(0.02)
        )
        migration_seconds = time.monotonic() - started
        acked_at_end = acked_count(out)
        wait_for_acks(out, acked_at_end + 40, processes)
        stop_workers(out, processes)

        report = check_ledger(store, worker_threads, out, BATCH)
        layout_problems = []
        for thread_id in (*worker_threads, long_id):
            try:
                check_layout(client, store.thread(thread_id).keys, config)
            except AssertionError as exc:
                layout_problems.append(f"{thread_id}: {exc}")
        long_sequences = [m.seq_id for m in long_thread.iter()]
        if long_sequences != list(range(1, LONG_THREAD_MESSAGES + 1)):
            layout_problems.append(
                f"{long_id}: the long thread changed: {len(long_sequences)} messages"
            )
        off_target = [key for node, key in cluster.keys_of(f"{namespace}:*") if node is not target]
        ledger = read_jsonl("ledger-*.jsonl", out)
        return Resharding(
            kind=cluster_kind,
            slot=slot,
            keys_moved=moved,
            migration_seconds=migration_seconds,
            acked_before=acked_before,
            acked_during=acked_at_end - acked_before,
            acked_after=len(ledger) - acked_at_end,
            report=report,
            errors=read_jsonl("errors-*.jsonl", out),
            longest_append=max((e["acked"] - e["sent"] for e in ledger), default=0.0),
            layout_problems=layout_problems,
            keys_off_target=off_target,
        )
    finally:
        stop_workers(out, processes, timeout=10)
        cluster.teardown()


def summary(result: Resharding) -> str:
    by_type = errors_by_type(result.errors, 60)
    return (
        f"{result.kind}: slot {result.slot}, {result.keys_moved} keys moved in {result.migration_seconds:.2f}s;"
        f" appends acknowledged before/during/after the move: {result.acked_before}/{result.acked_during}/"
        f"{result.acked_after}; longest append {result.longest_append:.2f}s; errors seen by the workers: {by_type}"
    )


def test_every_acknowledged_append_is_stored_once_and_no_batch_in_part(resharded):
    report = resharded.report
    assert report.problems == [], summary(resharded)
    assert report.lost == [], summary(resharded)
    assert report.acknowledged > 0 and report.stored >= report.acknowledged
    assert resharded.layout_problems == [], summary(resharded)
    assert resharded.keys_off_target == [], "keys left behind on the source"
    assert resharded.acked_after >= 40, summary(resharded)


def test_no_error_escapes_kvstore_untyped_during_resharding(resharded):
    """Whatever the client stack cannot retry must reach the caller as a kvstore error."""
    untyped = [e for e in resharded.errors if not e.get("typed") and not e.get("gave_up")]
    assert untyped == [], summary(resharded)


def test_appends_continue_through_the_slot_migration(resharded):
    """ASK, MOVED and TRYAGAIN are retried by the client stack: no append fails while the slot
    moves (a TRYAGAIN reply means the script did not run, so it is always safe to send again)."""
    failed = [e for e in resharded.errors if e["op"] == "append"]
    assert failed == [], summary(resharded)


def test_a_script_never_runs_while_its_slot_is_migrating(fresh_cluster):
    """Mid-move, with some of a thread's keys on each side, the write script is refused before it
    runs (TRYAGAIN on both sides), so it cannot write half its changes and then fail on a key
    that moved; once the move completes the same call succeeds and the layout is intact."""
    cluster = fresh_cluster(primaries=3)
    namespace = f"m{uuid.uuid4().hex[:10]}"
    config = StoreConfig(namespace=namespace, **SMALL)
    store = MessageStore(cluster.client(), config)
    thread = store.thread("moving")
    stored = thread.append(
        [UserMessage(content=f"m{i} " + "q" * 300, otid=f"o{i}") for i in range(40)]
    )
    slot = key_slot(thread.keys.meta.encode())
    source = cluster.owner(slot)
    target = next(n for n in cluster.primaries() if n is not source)
    target.admin.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
    source.admin.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
    chunk_keys = [
        k
        for k in source.admin.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        if ":chunk:" in k
    ]
    source.admin.execute_command("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *chunk_keys[:3])

    plain = redis.Redis(host=HOST, port=source.port)
    on_target = redis.Redis(host=HOST, port=target.port)

    def dump_all():
        """Every key of the slot on either side, serialized (ASKING: the target is importing)."""
        dumps = {}
        for client in (plain, on_target):
            keys = client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.execute_command("ASKING")
                pipe.dump(key)
            dumps.update(zip(((client, k) for k in keys), pipe.execute()[1::2], strict=True))
        return dumps

    before = dump_all()
    assert {client for client, _ in before} == {plain, on_target}, "the thread is not split"
    # The exact call the store would send for an append that rolls a chunk over.
    request = next(
        _core.append(ThreadRef.of(config, "moving"), [UserMessage(content="mid-move")], None)
    )
    script, keys, args = request.script, request.keys, request.args
    plain.script_load(script.source)
    with pytest.raises(redis.exceptions.TryAgainError):
        plain.evalsha(script.sha, len(keys), *keys, *args)
    on_target.script_load(script.source)
    pipe = on_target.pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.evalsha(script.sha, len(keys), *keys, *args)
    _asking, reply = pipe.execute(raise_on_error=False)
    assert isinstance(reply, redis.exceptions.TryAgainError), reply
    assert dump_all() == before, "a refused script changed the thread"
    plain.close()
    on_target.close()

    cluster.migrate_slot(slot, target)
    stored += thread.append([UserMessage(content=f"after {i}", otid=f"a{i}") for i in range(10)])
    assert [m.seq_id for m in stored] == list(range(1, 51))
    assert list(thread.iter()) == stored
    check_layout(cluster.client(), thread.keys, config)


def test_a_call_refused_past_the_client_retries_waits_or_raises_a_kvstore_error(
    fresh_cluster, thread_on, mode
):
    """A slot stuck MIGRATING for 3 s (a slow or stalled reshard; an operator then cancels it):
    every script call on its threads is answered TRYAGAIN meanwhile, and redis-py's cluster client
    gives up after 16 tries (~0.4 s) with ClusterError("TTL exhausted."). Each call must either
    wait the refusal out or raise a kvstore error (the call did not run), never a raw redis-py
    exception; and nothing is stored in part."""
    cluster = fresh_cluster(primaries=3)
    thread = thread_on(cluster, "stuck", **SMALL)
    stored = thread.append([UserMessage(content=f"m{i}", otid=f"o{i}") for i in range(20)])
    slot = key_slot(thread.keys.meta.encode())
    source = cluster.owner(slot)
    target = next(n for n in cluster.primaries() if n is not source)
    target.admin.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
    source.admin.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)

    def cancel() -> None:
        for node in (source, target):
            node.admin.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")

    timer = threading.Timer(3.0, cancel)
    timer.start()
    calls = {
        "append": lambda: thread.append(UserMessage(content="refused", otid="refused")),
        "list by cursor": lambda: thread.list(after=3, limit=5),
        "get": lambda: thread.get(stored[0].id),
        "start_turn": lambda: thread.start_turn("turn-x"),
    }
    outcomes, appended = {}, []
    try:
        for name, call in calls.items():
            started = time.monotonic()
            try:
                result = call()
            except errors.KVStoreError as exc:
                outcomes[name] = f"{type(exc).__name__}"
            except Exception as exc:
                outcomes[name] = f"untyped {type(exc).__module__}.{type(exc).__qualname__}: {exc}"
            else:
                outcomes[name] = "waited and succeeded"
                if name == "append":
                    appended = result
            outcomes[name] += f" after {time.monotonic() - started:.2f}s"
    finally:
        timer.join()
    assert list(thread.iter()) == stored + appended
    report = "; ".join(f"{k}: {v}" for k, v in outcomes.items())
    assert [k for k, v in outcomes.items() if v.startswith("untyped")] == [], report
