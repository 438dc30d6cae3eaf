"""Child processes of the reliability tests (importable without pytest).

Each keeps a ledger: an append-only file with one JSON line per event. A line is written and
flushed to the operating system before the next step, so it survives a kill of the server and
(for the client-kill test) records exactly what the killed child knew.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import redis

from kvstore import MessageStore, StoreConfig, UserMessage, errors

# Small sizes so that rollovers (and their chunk writes) run all the time under the faults.
CRASH_CONFIG = dict(window_size=8, chunk_size=4, chunk_max_bytes=4096, retained_message_limit=None)
CRASH_THREADS = 20


def content_for(otid: str) -> str:
    """The content stored with an otid: lets the check prove a message is the one sent."""
    return f"payload of {otid} " + "p" * (len(otid) * 7 % 300)


class Ledger:
    def __init__(self, path: Path) -> None:
        # Open for the worker's life (a kill may end it at any line): no context manager.
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def write(self, **entry) -> None:
        self._file.write(json.dumps(entry) + "\n")
        self._file.flush()


def read_ledger(path: Path) -> list[dict]:
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            break
    return entries


# ------------------------------------------------------------------------ server crash loop


def crash_loop_worker(
    url: str, namespace: str, worker: int, ledger_dir: str, stop_at: float, seed: int
) -> None:
    """Appends batches of 1-3 messages with otids to 20 threads until `stop_at`.

    Before a batch is sent its otids go to the intent ledger; after the call returns, the stored
    ids and sequences go to the ack ledger. A failed call is re-sent with the same otids until it
    is acknowledged (the server is killed and restarted all the time)."""
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
    store = MessageStore(client, StoreConfig(namespace=namespace, **CRASH_CONFIG))
    rng = random.Random(seed)
    intents = Ledger(Path(ledger_dir) / f"w{worker}.intent")
    acks = Ledger(Path(ledger_dir) / f"w{worker}.ack")
    stats = Ledger(Path(ledger_dir) / f"w{worker}.stats")
    counts = {
        "batches": 0,
        "retries": 0,
        "OutcomeUnknown": 0,
        "ConnectionFailed": 0,
        "ServerError": 0,
        "redis": 0,
    }
    give_up = stop_at + 60
    n = 0
    while time.time() < stop_at:
        thread_id = f"t{rng.randrange(CRASH_THREADS)}"
        otids = [f"w{worker}-{n + k}" for k in range(rng.choice((1, 1, 2, 3)))]
        n += len(otids)
        intents.write(thread=thread_id, otids=otids)
        thread = store.thread(thread_id)
        while True:
            try:
                stored = thread.append([UserMessage(content=content_for(o), otid=o) for o in otids])
                break
            except (errors.OutcomeUnknown, errors.ServerError) as exc:
                counts[type(exc).__name__] += 1
            except redis.RedisError:  # never expected: every failure is one of kvstore's errors
                counts["redis"] += 1
            counts["retries"] += 1
            if time.time() > give_up:
                raise SystemExit(f"worker {worker}: no acknowledgement for {otids} in 60 s")
            time.sleep(0.02)
        acks.write(thread=thread_id, messages=[[m.otid, m.id, m.seq_id] for m in stored])
        counts["batches"] += 1
    stats.write(**counts)


# ------------------------------------------------------------------------ client SIGKILL


def appending_child(url: str, namespace: str, ledger_path: str, first_otid: int, ready) -> None:
    """Appends batches of 1-4 messages with fresh otids in a loop until it is killed."""
    store = MessageStore.from_url(url, StoreConfig(namespace=namespace, **CRASH_CONFIG))
    thread = store.thread("victim")
    ledger = Ledger(Path(ledger_path))
    rng = random.Random(first_otid)
    n = first_otid
    thread.stats()  # connected
    ready.set()
    while True:
        otids = [f"k{n + k}" for k in range(rng.randint(1, 4))]
        n += len(otids)
        ledger.write(event="intent", otids=otids)
        stored = thread.append([UserMessage(content=content_for(o), otid=o) for o in otids])
        ledger.write(event="ack", messages=[[m.otid, m.id, m.seq_id] for m in stored])
