"""Four processes run every operation on shared threads; the ledger and the layout agree after.

Each worker (tests/reliability/mixed_workers.py) appends single messages and batches (up to 200),
runs turns (start, replies, finish twice), compacts, replaces, removes its own turns, pages with
random cursors in both orders, iterates, reads the context, snapshots and gets messages, and on
threads of its own deletes and migrates layout-1 threads. Afterwards, on every shared thread:
- every acknowledged message is stored once at the id, otid and sequence it was acknowledged
  with, unless retention deleted it (below deleted_before) or its turn was removed;
- nothing is stored that no worker sent (summaries aside);
- every finish_turn result matched the replies sent, and finishing again returned the same;
- the layout invariants of docs/LAYOUT.md hold (tests/support/layout_check.py);
- no read saw a state that breaks its invariants.
15 s per server by default; KVSTORE_LONG=1 runs 60 s.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter

import pytest
import redis

from kvstore import MessageStore, StoreConfig, SummaryMessage

from ..support.layout_check import check_layout
from .mixed_workers import MIXED_CONFIG, mixed_worker, shared_thread_ids
from .support import fresh_namespace, new_server, server_kinds
from .workers import read_ledger

WORKERS = 4
LONG = os.environ.get("KVSTORE_LONG") == "1"


@pytest.mark.parametrize("kind", server_kinds())
def test_four_processes_mixing_every_operation_keep_every_promise(kind, tmp_path):
    duration = 60.0 if LONG else 15.0
    server = new_server(kind)
    try:
        namespace = fresh_namespace()
        context = multiprocessing.get_context("spawn")
        stop_at = time.time() + 1.5 + duration  # a spawned worker takes about a second to import
        workers = [
            context.Process(
                target=mixed_worker,
                args=(server.url, namespace, w, str(tmp_path), stop_at, 500 + w),
            )
            for w in range(WORKERS)
        ]
        for process in workers:
            process.start()
        for process in workers:
            process.join(duration + 120)
            assert process.exitcode == 0, f"worker exited with {process.exitcode}"
        figures = verify(server, namespace, tmp_path)
        print(f"\n{kind}: {duration:.0f} s, {WORKERS} processes: {figures}")
    finally:
        server.cleanup()


def verify(server, namespace: str, ledger_dir) -> dict:
    raw = redis.Redis(port=server.port)
    config = StoreConfig(namespace=namespace, **MIXED_CONFIG)
    store = MessageStore.from_url(server.url, config)
    entries = [entry for w in range(WORKERS) for entry in read_ledger(ledger_dir / f"w{w}.jsonl")]
    failures = [e for e in entries if e["event"] == "check"]
    assert not failures, failures[:5]

    counts = Counter()
    for entry in entries:
        if entry["event"] == "counts":
            counts.update(entry["counts"])
    acked: dict[str, dict[str, tuple[str, int, str | None]]] = {t: {} for t in shared_thread_ids()}
    removed = {(e["thread"], e["turn"]) for e in entries if e["event"] == "removed"}
    replaced = {(e["thread"], e["id"]) for e in entries if e["event"] == "replaced"}
    deleted_before = {t: store.thread(t).stats().deleted_before_sequence or 0 for t in acked}
    for entry in entries:
        if entry["event"] == "ack" and entry["thread"] in acked:
            for otid, message_id, sequence in entry["messages"]:
                earlier = acked[entry["thread"]].get(otid)
                # An otid is stored once, unless retention deleted it and it was sent again.
                assert earlier is None or earlier[1] < deleted_before[entry["thread"]], (
                    f"{otid} acknowledged twice"
                )
                if earlier is None or earlier[1] < sequence:
                    acked[entry["thread"]][otid] = (message_id, sequence, entry["turn"])
    for entry in entries:
        if entry["event"] == "finished":
            result, again, replies = entry["result"], entry["again"], entry["replies"]
            assert again == result, entry  # finishing a finished turn returns its result
            # Replies are the messages appended with the turn id after start_turn, less those
            # retention deleted before the turn finished.
            kept = [s for s in replies if s >= deleted_before[entry["thread"]]]
            assert len(kept) <= result["reply_count"] <= len(replies), entry
            if result["reply_count"] == len(replies):
                assert (result["first_sequence"], result["last_sequence"]) == (
                    replies[0],
                    replies[-1],
                ), entry
            assert result["first_sequence"] is None or result["first_sequence"] >= entry["start"], (
                entry
            )

    messages_checked = retained = removed_count = 0
    for thread_id, by_otid in acked.items():
        thread = store.thread(thread_id)
        check_layout(raw, thread.keys, config)
        stats = thread.stats()
        deleted_before = stats.deleted_before_sequence or 0
        stored = {m.seq_id: m for m in thread.iter()}
        sent_sequences = set()
        for otid, (message_id, sequence, turn) in by_otid.items():
            sent_sequences.add(sequence)
            if sequence < deleted_before:
                assert sequence not in stored
                retained += 1
            elif (thread_id, turn) in removed:
                assert sequence not in stored, f"{otid} of removed turn {turn} is still stored"
                removed_count += 1
            else:
                message = stored.get(sequence)
                assert message is not None, f"acknowledged {otid} at {sequence} is gone"
                assert (message.id, message.otid) == (message_id, otid), (
                    otid,
                    message.id,
                    message.otid,
                )
                if (thread_id, message_id) not in replaced:
                    assert otid in str(message.content), otid
                messages_checked += 1
        for sequence, message in stored.items():
            if not isinstance(message, SummaryMessage):
                assert sequence in sent_sequences, (
                    f"{thread_id}: sequence {sequence} was never acknowledged"
                )
        # Everything after the summary is in the context, with holes only for removed turns.
        context = thread.context()
        if context and isinstance(context[0], SummaryMessage):
            assert [m.seq_id for m in context[1:]] == sorted(
                s for s in stored if s > stats.summary_last_sequence and s != context[0].seq_id
            )
    leftovers = [k for k in raw.scan_iter(match=f"{namespace}:{{scratch-*", count=1000)]
    leftovers += [k for k in raw.scan_iter(match=f"{namespace}:{{legacy-*", count=1000)]
    assert not leftovers, leftovers[:5]
    store.close()
    return {
        "operations": sum(counts.values()),
        "acknowledged": sum(len(v) for v in acked.values()),
        "checked stored": messages_checked,
        "retained away": retained,
        "removed with their turn": removed_count,
        **{name: counts[name] for name in sorted(counts)},
    }
