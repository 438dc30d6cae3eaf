"""A client process SIGKILLed at random points of its appends, then its calls replayed.

A child appends batches of 1-4 messages with fresh otids in a loop, writing each batch's otids to
its ledger before the call and the stored ids and sequences after it. The parent kills it at a
random moment (mid-call most of the time), replays the batch that was in flight and an earlier
acknowledged one with the same otids, and starts the next child. A replay must return the
original ids and sequences and store nothing; a batch is stored whole or not at all.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import Counter

import redis

from kvstore import MessageStore, StoreConfig, UserMessage

from ..support.layout_check import check_layout
from .support import dedicated_server, fresh_namespace
from .workers import CRASH_CONFIG, appending_child, content_for, read_ledger

KILLS = 60


def _context():
    # Children fork from a server process that has kvstore imported already: a restart costs
    # milliseconds, not the second a spawned interpreter needs to import it.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.reliability.workers"])
    return context


def test_client_sigkill_at_random_points_then_replay_stores_exactly_once(kind, tmp_path):
    with dedicated_server(kind) as server:
        namespace = fresh_namespace()
        config = StoreConfig(namespace=namespace, **CRASH_CONFIG)
        store = MessageStore.from_url(server.url, config)
        thread = store.thread("victim")
        raw = redis.Redis(port=server.port)
        context = _context()
        rng = random.Random(5)
        acked: dict[str, tuple[str, int]] = {}
        sent: list[list[str]] = []
        figures = Counter()
        next_otid = 0
        started = time.time()
        for kill in range(KILLS):
            ready = context.Event()
            child = context.Process(
                target=appending_child,
                args=(server.url, namespace, str(tmp_path / f"ledger-{kill}"), next_otid, ready),
            )
            child.start()
            assert ready.wait(30), "the child never connected"
            time.sleep(rng.uniform(0.002, 0.06))
            os.kill(child.pid, signal.SIGKILL)
            child.join()
            assert child.exitcode == -signal.SIGKILL, (
                f"the child ended by itself ({child.exitcode})"
            )

            # What the child knew when it died: the batches it sent and those acknowledged.
            # (Each child has its own ledger: a line cut by the kill ends only that one.)
            entries = read_ledger(tmp_path / f"ledger-{kill}")
            intents = [e["otids"] for e in entries if e["event"] == "intent"]
            for e in entries:
                if e["event"] == "ack":
                    for otid, message_id, seq in e["messages"]:
                        acked[otid] = (message_id, seq)
            sent += intents
            next_otid = 1 + max((int(o[1:]) for batch in sent for o in batch), default=-1)
            in_flight = (
                intents[-1] if intents and any(o not in acked for o in intents[-1]) else None
            )

            if in_flight is not None:
                figures["kills mid-call"] += 1
                before = raw.hmget(thread.keys.otids, in_flight)
                assert len(set(map(bool, before))) == 1, (
                    f"batch {in_flight} is stored in part: {before}"
                )
                stored_before = before[0] is not None
                figures[
                    "in-flight batches the server had stored"
                    if stored_before
                    else "in-flight batches not stored"
                ] += 1
                last_seq = thread.stats().next_sequence - 1
                replay = thread.append(
                    [UserMessage(content=content_for(o), otid=o) for o in in_flight]
                )
                assert [m.otid for m in replay] == in_flight
                assert all(m.content == content_for(m.otid) for m in replay)
                if stored_before:
                    assert [m.seq_id for m in replay] == [int(s) for s in before]
                    assert thread.stats().next_sequence - 1 == last_seq, "the replay stored again"
                else:
                    assert [m.seq_id for m in replay] == list(
                        range(last_seq + 1, last_seq + 1 + len(in_flight))
                    )
                for m in replay:
                    acked[m.otid] = (m.id, m.seq_id)
            else:
                figures["kills between calls"] += 1

            # Replay an earlier acknowledged batch: the original ids and sequences come back.
            done = [batch for batch in sent if all(o in acked for o in batch)]
            if done:
                batch = rng.choice(done)
                last_seq = thread.stats().next_sequence - 1
                replay = thread.append(
                    [UserMessage(content="a different body", otid=o) for o in batch]
                )
                assert [(m.id, m.seq_id) for m in replay] == [acked[o] for o in batch]
                assert all(m.content == content_for(m.otid) for m in replay)
                assert thread.stats().next_sequence - 1 == last_seq
                figures["acknowledged batches replayed"] += 1

        messages = list(thread.iter())
        otids = [m.otid for m in messages]
        assert len(otids) == len(set(otids)), "a message is stored twice"
        assert [m.seq_id for m in messages] == list(range(1, len(messages) + 1))
        assert set(otids) == {o for batch in sent for o in batch}, (
            "a sent batch is missing after its replay"
        )
        assert {m.otid: (m.id, m.seq_id) for m in messages} == acked
        check_layout(raw, thread.keys, config)
        print(
            f"\nclient SIGKILL [{kind}]: {KILLS} kills in {time.time() - started:.1f} s,"
            f" {figures['kills mid-call']} mid-call ({figures['in-flight batches the server had stored']}"
            f" already stored by the server, {figures['in-flight batches not stored']} not),"
            f" {figures['kills between calls']} between calls; {len(messages)} messages stored once;"
            f" {figures['acknowledged batches replayed']} acknowledged batches replayed with their"
            f" original ids and sequences"
        )
        assert figures["kills mid-call"] >= KILLS // 2
