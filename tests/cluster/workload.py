"""Worker processes that append to threads on a cluster and keep a ledger of what was acknowledged.

Each worker appends batches whose messages carry otids `w<worker>-<batch>-<i>`, to its threads in
turn. An append is acknowledged when `append()` returns: the worker then writes one ledger line
(thread, otids, sequences, when). A failed call is re-sent with the same otids until it is
acknowledged (kvstore promises that a re-sent call never stores twice); every failure is written to
the worker's error log with its type, so the tests can say which errors escaped kvstore untyped.
Every few appends the worker also reads (newest page, a page by cursor, get by id).

`check_ledger` then reads every thread and checks what the reliability suite checks: every
acknowledged message stored exactly once at the sequence it was acknowledged with, sequences
contiguous, no batch stored in part.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kvstore import AsyncMessageStore, MessageStore, StoreConfig, UserMessage, errors

# A call failing for this long is given up (the test then fails on the ledger or the errors).
GIVE_UP_AFTER = 30.0
RESEND_PAUSE = 0.05


def _write(path: Path, record: dict) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(record) + "\n")


def _address(node: int | str) -> tuple[str, int]:
    """A node as (host, port): a port on loopback, or "host:port"."""
    if isinstance(node, int):
        return "127.0.0.1", node
    host, _, port = node.rpartition(":")
    return host, int(port)


def append_worker(
    ports: list[int] | list[str],
    namespace: str,
    config: dict[str, Any],
    thread_ids: list[str],
    worker: int,
    out_dir: str,
    batch_size: int,
    use_async: bool = False,
    read_every: int = 5,
) -> None:
    """Appends until `out_dir/stop` exists; the call in flight is finished (acknowledged) first.

    With `use_async`, the same loop drives an AsyncMessageStore on a redis.asyncio RedisCluster."""
    out = Path(out_dir)
    ledger, error_log = out / f"ledger-{worker}.jsonl", out / f"errors-{worker}.jsonl"
    store_config = StoreConfig(namespace=namespace, **config)
    if use_async:
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        loop = asyncio.new_event_loop()
        run = loop.run_until_complete
        store = AsyncMessageStore(
            RedisCluster(
                startup_nodes=[ClusterNode(*_address(p)) for p in ports], decode_responses=False
            ),
            store_config,
        )
    else:
        from redis.cluster import ClusterNode, RedisCluster

        def run(result):
            return result

        store = MessageStore(
            RedisCluster(
                startup_nodes=[ClusterNode(*_address(p)) for p in ports], decode_responses=False
            ),
            store_config,
        )
    threads = [store.thread(t) for t in thread_ids]
    stop = out / "stop"
    batch = 0
    while not stop.exists():
        thread_id = thread_ids[batch % len(thread_ids)]
        thread = threads[batch % len(threads)]
        otids = [f"w{worker}-{batch}-{i}" for i in range(batch_size)]
        messages = [UserMessage(content=f"{otid} " + "m" * 200, otid=otid) for otid in otids]
        sent = time.time()
        attempts = 0
        while True:
            attempts += 1
            try:
                stored = run(thread.append(messages))
            except Exception as exc:  # every failure is logged and the same call re-sent
                _write(error_log, _error_record("append", exc, thread_id, otids))
                if time.time() - sent > GIVE_UP_AFTER:
                    _write(
                        error_log,
                        {"op": "append", "gave_up": True, "thread": thread_id, "otids": otids},
                    )
                    return
                time.sleep(RESEND_PAUSE)
                continue
            break
        _write(
            ledger,
            {
                "thread": thread_id,
                "otids": otids,
                "seqs": [m.seq_id for m in stored],
                "ids": [m.id for m in stored],
                "sent": sent,
                "acked": time.time(),
                "attempts": attempts,
            },
        )
        if read_every and batch % read_every == 0:
            # Reads are exercised, not checked here: the ledger check compares the data.
            reads = {
                "newest page": partial(thread.list, limit=5, order="desc"),  # native reads
                "page by cursor": partial(
                    thread.list, after=max(stored[0].seq_id - 3, 0), limit=3
                ),  # plan
                "get": partial(thread.get, stored[0].id),  # locate script, then native reads
            }
            for name, read in reads.items():
                try:
                    run(read())
                except Exception as exc:
                    _write(error_log, _error_record(f"read ({name})", exc, thread_id, otids))
        batch += 1
    run(store.close())
    if use_async:
        loop.close()


def _error_record(op: str, exc: BaseException, thread_id: str, otids: list[str]) -> dict:
    # Where the error left kvstore: its innermost frame in the kvstore package.
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if f"{os.sep}kvstore{os.sep}" in f.filename
    ]
    return {
        "op": op,
        "typed": isinstance(exc, errors.KVStoreError),
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc)[:300],
        "where": f"{Path(frames[-1].filename).name}:{frames[-1].lineno} {frames[-1].name}"
        if frames
        else "",
        "thread": thread_id,
        "otids": otids,
        "at": time.time(),
    }


def read_jsonl(pattern: str, out_dir: Path) -> list[dict]:
    """Every complete record; a worker may be halfway through writing the last line while we read."""
    records = []
    for path in sorted(out_dir.glob(pattern)):
        text = path.read_text()
        complete = text[: text.rfind("\n") + 1]
        records += [json.loads(line) for line in complete.splitlines() if line.strip()]
    return records


def errors_by_type(errors: list[dict], width: int = 70) -> dict[str, int]:
    """How often the workers met each kind of error (operation, type, where, message start)."""
    return dict(
        Counter(
            f"{e['op']}: {e.get('type')} at {e.get('where')}: {e.get('message', 'gave up')[:width]}"
            for e in errors
        )
    )


def acked_count(out_dir: Path) -> int:
    return len(read_jsonl("ledger-*.jsonl", out_dir))


@dataclass
class LedgerReport:
    acknowledged: int = 0  # acknowledged messages
    stored: int = 0  # messages stored in the threads
    lost: list[dict] = field(default_factory=list)  # acknowledged, not stored (with acked time)
    problems: list[str] = field(default_factory=list)  # anything else wrong


def check_ledger(
    store: MessageStore, thread_ids: list[str], out_dir: Path, batch_size: int
) -> LedgerReport:
    """Compares the workers' ledgers with what every thread holds.

    Problems: a sequence gap or repeat, an otid stored twice, a batch stored in part or out of
    order, an acknowledged message stored at another sequence than acknowledged or with another
    id, a message no worker sent (the threads hold only the workers' messages). Acknowledged messages that are missing are returned in `lost`
    (the caller decides whether the server may have lost them), not as problems.
    """
    report = LedgerReport()
    ledger = read_jsonl("ledger-*.jsonl", out_dir)
    acked = {}
    for entry in ledger:
        for otid, seq, message_id in zip(entry["otids"], entry["seqs"], entry["ids"], strict=True):
            acked[otid] = (entry["thread"], seq, message_id, entry["acked"])
    report.acknowledged = len(acked)
    found: dict[str, tuple[str, int, str]] = {}
    for thread_id in thread_ids:
        messages = list(store.thread(thread_id).iter())
        report.stored += len(messages)
        sequences = [m.seq_id for m in messages]
        if sequences != list(range(1, len(messages) + 1)):
            report.problems.append(
                f"{thread_id}: sequences are not 1..{len(messages)}: {_gaps(sequences)}"
            )
        batches: dict[str, list[int]] = {}
        for message in messages:
            if message.otid is None or not message.otid.startswith("w"):
                report.problems.append(
                    f"{thread_id}: message {message.seq_id} was not sent by a worker"
                )
                continue
            if message.otid in found:
                report.problems.append(f"otid {message.otid} stored twice")
            found[message.otid] = (thread_id, message.seq_id, message.id)
            batches.setdefault(message.otid.rsplit("-", 1)[0], []).append(message.seq_id)
        for name, seqs in batches.items():
            if len(seqs) != batch_size or seqs != list(range(seqs[0], seqs[0] + batch_size)):
                report.problems.append(f"{thread_id}: batch {name} stored as sequences {seqs}")
    for otid, (thread_id, seq, message_id, acked_at) in acked.items():
        if otid not in found:
            report.lost.append({"otid": otid, "thread": thread_id, "seq": seq, "acked": acked_at})
        elif found[otid] != (thread_id, seq, message_id):
            report.problems.append(
                f"{otid} acknowledged as {(thread_id, seq, message_id)}, stored as {found[otid]}"
            )
    # Stored messages nobody acknowledged are calls in flight or given up; they are whole batches
    # (checked above) and were sent by a worker, so they are not problems.
    return report


def _gaps(sequences: list[int]) -> str:
    counts = Counter(sequences)
    missing = [s for s in range(1, max(sequences, default=0) + 1) if s not in counts][:10]
    repeated = sorted(s for s, n in counts.items() if n > 1)[:10]
    return f"missing {missing}, repeated {repeated}"


def start_workers(
    name: str,
    count: int,
    ports: list[int] | list[str],
    namespace: str,
    limits: dict,
    thread_ids: list[str],
    out_dir: Path,
    batch: int,
) -> list:
    """`count` append_worker processes (spawned, every other one on the asyncio store), started."""
    context = multiprocessing.get_context("spawn")
    processes = []
    for w in range(count):
        process = context.Process(
            target=append_worker,
            args=(ports, namespace, limits, thread_ids, w, str(out_dir), batch, w % 2 == 1),
            name=f"{name}-worker-{w}",
        )
        process.start()
        processes.append(process)
    return processes


def stop_workers(out_dir: Path, processes: list, timeout: float = 60) -> None:
    (out_dir / "stop").touch()
    for process in processes:
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()


def wait_for_acks(out_dir: Path, count: int, processes: list, timeout: float = 60) -> bool:
    """Waits until the ledgers hold `count` acknowledged appends (workers start in ~1 s).

    False if a worker exited first (it gave up a call: its error log says why) or time ran out."""
    deadline = time.monotonic() + timeout
    while acked_count(out_dir) < count:
        if any(not p.is_alive() for p in processes) or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class WatchOnly:
    """A watch-only store's watcher of one thread, from its start, in a thread of its own."""

    def __init__(self, client: Any, config: StoreConfig, thread_id: str) -> None:
        self.store = MessageStore(client, config)
        self.delivered: list[tuple[int, str | None]] = []
        self.failure: BaseException | None = None
        self._events = self.store.thread(thread_id).watch(after=0, block_ms=500)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._events:
                for message in getattr(event, "messages", None) or ():
                    self.delivered.append((message.seq_id, message.otid))
        except BaseException as exc:  # the test reports it
            self.failure = exc

    def stop_at(self, last_sequence: int, timeout: float = 30) -> list[tuple[int, str | None]]:
        """Once the watcher delivered `last_sequence` (or `timeout` passed): stops it, returns
        what it delivered."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.failure:
            if self.delivered and self.delivered[-1][0] >= last_sequence:
                break
            time.sleep(0.05)
        self.store.close()
        self._thread.join(10)
        assert self.failure is None, repr(self.failure)
        return list(self.delivered)
