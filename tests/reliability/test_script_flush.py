"""Script cache loss on the EVAL path: SCRIPT FLUSH between calls and while they run, sync and async.

A server restart, a failover or an operator's SCRIPT FLUSH empties the script cache; with
scripting="eval" the executors call scripts by SHA and must reload them transparently (spec §3).
(The function library's loss is tests/integration/test_loading.py's, with the same workload.) A mixed workload
(appends, batches, otid replays, pages, get, replace, compact, remove_turn, context) runs against
a model of what it stored, with the cache flushed before every call, then with a thread
flushing it in a loop.
"""

from __future__ import annotations

import random
import threading
import time

import redis

from kvstore import StoreConfig, UserMessage, errors

from ..support.layout_check import check_layout
from .support import fresh_namespace, thread_in_mode

CONFIG = dict(window_size=8, chunk_size=4, chunk_max_bytes=4096, retained_message_limit=None)
EVAL_PATH = dict(CONFIG, scripting="eval")


def _reloads(admin: redis.Redis) -> int:
    """Scripts sent in full after NOSCRIPT (by EVAL, or SCRIPT LOAD)."""
    stats = admin.info("commandstats")
    return sum(
        int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_eval", "cmdstat_script|load")
    )


def workload(thread, steps: int, seed: int, before_each=None) -> dict:
    """Runs `steps` calls, checks every reply against what was stored; returns the figures."""
    rng = random.Random(seed)
    expected: list = []
    turn_of: dict[str, str] = {}
    summary, summary_last = None, 0
    failures: list[str] = []

    def resync() -> list:
        for _ in range(100):
            try:
                return list(thread.iter())
            except errors.KVStoreError:
                time.sleep(0.001)
        raise AssertionError("the thread could not be read back")

    for i in range(steps):
        if before_each:
            before_each()
        op = i % 10 if expected else 0
        try:
            if op == 0:
                expected += thread.append(
                    UserMessage(content=f"a{i} " + "x" * rng.randint(0, 900), otid=f"o{i}")
                )
            elif op == 1:
                turn = f"turn{rng.randint(0, 4)}"
                stored = thread.append(
                    [UserMessage(content=f"b{i}.{k}") for k in range(3)], turn_id=turn
                )
                turn_of.update((m.id, turn) for m in stored)
                expected += stored
            elif op == 2:
                start = rng.randrange(len(expected))
                page = thread.list(after=expected[start].id, limit=10)
                assert page.messages == expected[start + 1 : start + 11]
            elif op == 3:
                message = rng.choice(expected)
                assert thread.get(message.id) == message
            elif op == 4:
                with_otid = [m for m in expected if m.otid]
                if with_otid:
                    original = rng.choice(with_otid)
                    assert thread.append(UserMessage(content="replayed", otid=original.otid)) == [
                        original
                    ]
            elif op == 5:
                position = rng.randrange(len(expected))
                if expected[position].message_type == "user_message":
                    replaced = thread.replace(expected[position].id, UserMessage(content=f"r{i}"))
                    expected[position] = replaced
            elif op == 6:
                assert thread.list(limit=20, order="desc").messages == expected[::-1][:20]
            elif op == 7:
                context = thread.context()
                if summary is None:
                    assert context == expected
                else:
                    assert context[0] == summary
                    assert context[1:] == [
                        m
                        for m in expected
                        if m.seq_id > summary_last and m.seq_id != summary.seq_id
                    ]
            elif op == 8 and i % 30 == 8:
                last = expected[len(expected) // 2].seq_id
                if last >= summary_last:
                    summary = thread.compact(f"summary {i}", last)
                    summary_last = last
                    expected.append(summary)
            elif op == 9 and i % 20 == 9:
                turn = f"turn{rng.randint(0, 4)}"
                removed = thread.remove_turn(turn)
                before = len(expected)
                expected = [m for m in expected if turn_of.get(m.id) != turn]
                assert removed == before - len(expected)
        except errors.KVStoreError as exc:
            failures.append(f"step {i} (op {op}): {type(exc).__name__}: {exc}")
            expected = resync()
    assert list(thread.iter()) == expected
    return {"steps": steps, "stored": len(expected), "failures": failures}


def test_script_flush_before_every_call_is_transparent(plain_server, mode):
    admin = redis.Redis(port=plain_server.port)
    config = StoreConfig(namespace=fresh_namespace(), **EVAL_PATH)
    reloads = _reloads(admin)
    with thread_in_mode(mode, plain_server.url, config, "flushed") as thread:
        figures = workload(thread, 300, seed=1, before_each=admin.script_flush)
        check_layout(admin, thread.keys, config)
    print(
        f"\nSCRIPT FLUSH between calls [{plain_server.name}, {mode}]: {figures['steps']} calls, each after a"
        f" flush; {_reloads(admin) - reloads} reloads; {len(figures['failures'])} failed; state equals the model"
    )
    assert not figures["failures"], "\n".join(figures["failures"][:10])


def test_script_flush_racing_the_calls_is_transparent(plain_server, mode):
    admin = redis.Redis(port=plain_server.port)
    config = StoreConfig(namespace=fresh_namespace(), **EVAL_PATH)
    stop = threading.Event()
    flushes = [0]

    def flusher():
        control = redis.Redis(port=plain_server.port)
        while not stop.is_set():
            control.script_flush()
            flushes[0] += 1
            time.sleep(0.002)

    reloads = _reloads(admin)
    background = threading.Thread(target=flusher)
    with thread_in_mode(mode, plain_server.url, config, "racing") as thread:
        background.start()
        try:
            figures = workload(thread, 600, seed=2)
        finally:
            stop.set()
            background.join()
        check_layout(admin, thread.keys, config)
    failures = figures["failures"]
    print(
        f"\nSCRIPT FLUSH racing the calls [{plain_server.name}, {mode}]: {figures['steps']} calls while"
        f" {flushes[0]} flushes ran; {_reloads(admin) - reloads} reloads; {len(failures)} calls failed"
        + (f" (first: {failures[0]})" if failures else "")
    )
    assert not failures, f"{len(failures)} of {figures['steps']} calls failed:\n" + "\n".join(
        failures[:10]
    )
