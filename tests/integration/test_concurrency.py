"""Many processes on one thread, and a process killed in the middle of its appends."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time

from kvstore import MessageStore, StoreConfig, UserMessage

from ..support.layout_check import check_layout

SMALL = dict(window_size=16, chunk_size=8, chunk_max_bytes=4096)


def _append_worker(url: str, namespace: str, worker: int, count: int) -> None:
    thread = MessageStore.from_url(url, StoreConfig(namespace=namespace, **SMALL)).thread("shared")
    for i in range(count):
        thread.append(
            UserMessage(
                content=f"w{worker} n{i} " + "x" * random.randint(0, 900), otid=f"w{worker}-{i}"
            )
        )


def test_four_processes_get_gap_free_distinct_sequences(server, raw_client, namespace, server_only):
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_append_worker, args=(server.url, namespace, w, 250))
        for w in range(4)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join(120)
        assert process.exitcode == 0
    store = MessageStore.from_url(server.url, StoreConfig(namespace=namespace, **SMALL))
    thread = store.thread("shared")
    messages = list(thread.iter())
    assert [m.seq_id for m in messages] == list(range(1, 1001))
    assert len({m.otid for m in messages}) == 1000
    # Each worker's own messages are in the order it sent them.
    for w in range(4):
        own = [int(m.otid.split("-")[1]) for m in messages if m.otid.startswith(f"w{w}-")]
        assert own == list(range(250))
    check_layout(raw_client, thread.keys, store.config)


def _batch_worker(url: str, namespace: str, batches: int) -> None:
    thread = MessageStore.from_url(url, StoreConfig(namespace=namespace, **SMALL)).thread("killed")
    for b in range(batches):
        thread.append(
            [UserMessage(content=f"b{b} m{i} " + "y" * 700, otid=f"b{b}-m{i}") for i in range(10)]
        )


def test_sigkill_mid_append_leaves_no_partial_batch_and_replay_stores_nothing_twice(
    server, raw_client, namespace, server_only
):
    context = multiprocessing.get_context("spawn")
    rng = random.Random(3)
    store = MessageStore.from_url(server.url, StoreConfig(namespace=namespace, **SMALL))
    thread = store.thread("killed")
    for _ in range(3):
        before = thread.stats().stored_messages
        process = context.Process(target=_batch_worker, args=(server.url, namespace, 400))
        process.start()
        # Killed while it appends: once it stored a new batch (past its replays of the batches
        # an earlier worker stored), at a random point of the appends that follow. Bounded.
        deadline = time.monotonic() + 60
        while thread.stats().stored_messages == before and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.4))
        os.kill(process.pid, signal.SIGKILL)
        process.join()
    stored = list(thread.iter())
    assert stored, "the worker was killed before it stored anything; raise the sleep"
    batches: dict[str, int] = {}
    for message in stored:
        batches[message.otid.split("-")[0]] = batches.get(message.otid.split("-")[0], 0) + 1
    assert set(batches.values()) == {10}, "a batch was stored in part"
    assert [m.seq_id for m in stored] == list(range(1, len(stored) + 1))
    # Re-sending every batch with the same otids stores each message exactly once.
    for b in range(max(int(k[1:]) for k in batches) + 3):
        thread.append([UserMessage(content="replay", otid=f"b{b}-m{i}") for i in range(10)])
    after = list(thread.iter())
    otids = [m.otid for m in after]
    assert len(otids) == len(set(otids))
    assert after[: len(stored)] == stored
    check_layout(raw_client, thread.keys, store.config)
