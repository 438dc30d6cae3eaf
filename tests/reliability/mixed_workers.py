"""The worker of the mixed-load run (tests/reliability/test_mixed_load.py), importable without
pytest: every public operation against shared threads, with a ledger of what was acknowledged.

Ledger lines (JSON, flushed before the next step):
- ``ack``: thread, turn (or None), and [otid, id, sequence] of each message an append returned;
- ``replaced``: thread, id, otid — a replace that returned;
- ``removed``: thread, turn — a remove_turn that returned (the turn's messages are gone);
- ``finished``: thread, turn, the TurnResult of the first finish_turn and of a second one;
- ``check``: a read's invariant that failed, with what was read (the test fails on any);
- ``counts``: how often each operation ran, at the end.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import ClassVar

import redis

from kvstore import AssistantMessage, MessageStore, StoreConfig, SummaryMessage, UserMessage, errors

from .workers import Ledger, content_for

MIXED_CONFIG = dict(window_size=8, chunk_size=4, chunk_max_bytes=4096, retained_message_limit=300)
SHARED_THREADS = 6


def shared_thread_ids() -> list[str]:
    return [f"shared-{i}" for i in range(SHARED_THREADS)]


def write_layout_1(client: redis.Redis, keys, count: int, tag: str) -> None:
    """A layout-1 thread written with raw commands (docs/LAYOUT.md, "Layout 1")."""
    records, ids = {}, {}
    for sequence in range(1, count + 1):
        body = {
            "message_type": "user_message",
            "id": f"legacy-{tag}-{sequence}",
            "content": f"legacy {sequence}",
        }
        records[sequence] = json.dumps(body).encode()
        ids[body["id"]] = sequence
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.legacy, mapping=records)
    pipe.hset(keys.ids, mapping=ids)
    pipe.hset(keys.meta, mapping={"layout": "1", "last_seq": count})
    pipe.execute()


class Worker:
    def __init__(self, url: str, namespace: str, worker: int, ledger_dir: str, seed: int) -> None:
        self.config = StoreConfig(namespace=namespace, **MIXED_CONFIG)
        self.store = MessageStore.from_url(url, self.config)
        self.raw = redis.Redis.from_url(url)
        self.rng = random.Random(seed)
        self.worker = worker
        self.ledger = Ledger(Path(ledger_dir) / f"w{worker}.jsonl")
        self.counts: Counter = Counter()
        self.n = 0
        self.own: dict[str, list[tuple[str, str]]] = {
            t: [] for t in shared_thread_ids()
        }  # (id, otid)
        self.turns: dict[str, list[str]] = {t: [] for t in shared_thread_ids()}  # finished turns

    def otid(self) -> str:
        self.n += 1
        return f"w{self.worker}-{self.n}"

    def fail(self, what: str, **details) -> None:
        self.ledger.write(event="check", what=what, **details)

    def append(self, thread_id: str, otids: list[str], turn: str | None = None, kind=UserMessage):
        thread = self.store.thread(thread_id)
        messages = [kind(content=content_for(o), otid=o) for o in otids]
        stored = thread.append(messages, turn_id=turn)
        self.ledger.write(
            event="ack",
            thread=thread_id,
            turn=turn,
            messages=[[m.otid, m.id, m.seq_id] for m in stored],
        )
        self.own[thread_id] += [(m.id, m.otid) for m in stored]
        return stored

    # -------------------------------------------------------------------------- operations

    def op_append(self, thread_id: str) -> None:
        self.append(thread_id, [self.otid()])

    def op_batch(self, thread_id: str) -> None:
        size = self.rng.choice((2, 5, 20, 20, 200))
        self.append(thread_id, [self.otid() for _ in range(size)])

    def op_replay(self, thread_id: str) -> None:
        """Sends one of this worker's recent messages again (same otid): a replay, or an
        OtidConflict-free MessageNotFound-free answer naming the stored message."""
        if not self.own[thread_id]:
            return
        message_id, otid = self.rng.choice(self.own[thread_id][-50:])
        thread = self.store.thread(thread_id)
        try:
            stored = thread.get_by_otid(otid)
        except errors.MessageNotFound:  # retained away or its turn removed: its otid is free again
            self.counts["replay after retention"] += 1
            return
        if stored.id != message_id:
            self.fail("get_by_otid returned another message", otid=otid, got=stored.id)
        again = thread.append(UserMessage(content=content_for(otid), otid=otid))
        if not again.replayed or [m.id for m in again] != [message_id]:
            if not (again and again[0].id != message_id and not again.replayed):
                self.fail("a re-sent otid was not a replay", otid=otid, got=[m.id for m in again])
            else:
                # Retention deleted it between the get and the re-send: stored anew, as a new message.
                self.ledger.write(
                    event="ack",
                    thread=thread_id,
                    turn=None,
                    messages=[[m.otid, m.id, m.seq_id] for m in again],
                )
                self.counts["replay after retention"] += 1

    def op_turn(self, thread_id: str) -> None:
        thread = self.store.thread(thread_id)
        turn = f"turn-{self.worker}-{self.n}"
        self.append(thread_id, [self.otid()], turn=turn)
        start = thread.start_turn(turn)
        if thread.start_turn(turn) != start:  # a retried start_turn changes nothing
            self.fail("start_turn sent again moved the turn", turn=turn)
        replies = []
        for _ in range(self.rng.randint(1, 3)):
            replies += [
                m.seq_id
                for m in self.append(thread_id, [self.otid()], turn=turn, kind=AssistantMessage)
            ]
        result = thread.finish_turn(turn)
        again = thread.finish_turn(turn)
        self.ledger.write(
            event="finished",
            thread=thread_id,
            turn=turn,
            start=start,
            replies=replies,
            result=result.model_dump(),
            again=again.model_dump(),
        )
        self.turns[thread_id].append(turn)

    def op_compact(self, thread_id: str) -> None:
        thread = self.store.thread(thread_id)
        stats = thread.stats()
        last = stats.next_sequence - 1 - self.rng.randint(5, 15)
        if last <= (stats.summary_last_sequence or 0):
            return
        try:
            summary = thread.compact(f"summary up to {last}", last_sequence=last)
        except errors.InvalidSummaryRange:  # another worker's summary moved past `last` meanwhile
            self.counts["compact refused"] += 1
            return
        if summary.seq_id is None or not isinstance(summary, SummaryMessage):
            self.fail("compact returned no stored summary", summary=summary.to_dict())

    def op_replace(self, thread_id: str) -> None:
        if not self.own[thread_id]:
            return
        message_id, otid = self.rng.choice(self.own[thread_id][-200:])
        thread = self.store.thread(thread_id)
        try:
            thread.replace(message_id, UserMessage(content=f"replaced {otid}"))
        except errors.MessageNotFound:  # retained away, or its turn removed
            self.counts["replace not found"] += 1
            return
        self.ledger.write(event="replaced", thread=thread_id, id=message_id, otid=otid)

    def op_remove_turn(self, thread_id: str) -> None:
        if not self.turns[thread_id]:
            return
        turn = self.turns[thread_id].pop(self.rng.randrange(len(self.turns[thread_id])))
        self.store.thread(thread_id).remove_turn(turn)
        self.ledger.write(event="removed", thread=thread_id, turn=turn)

    def op_page(self, thread_id: str) -> None:
        thread = self.store.thread(thread_id)
        order = self.rng.choice(("asc", "desc"))
        limit = self.rng.choice((1, 7, 50))
        stats = thread.stats()
        cursor = self.rng.randint(0, stats.next_sequence) if self.rng.random() < 0.7 else None
        seen, pages = [], 0
        while pages < 5:
            page = thread.list(after=cursor, limit=limit, order=order)
            sequences = [m.seq_id for m in page.messages]
            if sequences != sorted(sequences, reverse=order == "desc") or len(
                set(sequences)
            ) != len(sequences):
                self.fail("page out of order", sequences=sequences)
            if (
                page.deleted_before_sequence
                and sequences
                and min(sequences) < page.deleted_before_sequence
            ):
                self.fail("page holds a deleted sequence", sequences=sequences)
            seen += sequences
            pages += 1
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        if len(set(seen)) != len(seen):
            self.fail("pages repeat a message", sequences=seen)

    def op_iter(self, thread_id: str) -> None:
        sequences = [m.seq_id for m in self.store.thread(thread_id).iter()]
        if sequences != sorted(set(sequences)):
            self.fail("iter out of order or repeating", sequences=sequences[:50])

    def op_context(self, thread_id: str) -> None:
        messages = self.store.thread(thread_id).context()
        if not messages:
            return
        sequences = [m.seq_id for m in messages]
        if isinstance(messages[0], SummaryMessage):
            covered = int(messages[0].summary.split()[-1])
            rest = sequences[1:]
            if rest and rest[0] <= covered:
                self.fail(
                    "context holds what its summary covers", covered=covered, sequences=rest[:10]
                )
            if any(s == sequences[0] for s in rest):
                self.fail("context repeats its summary", sequences=sequences[:10])
            # Kept messages after the summary are every stored one: holes only where a turn was
            # removed, which the test checks against the ledger.
            self.ledger.write(event="context", thread=thread_id, covered=covered, sequences=rest)
        elif sequences != sorted(set(sequences)):
            self.fail("context out of order", sequences=sequences[:50])

    def op_snapshot(self, thread_id: str) -> None:
        snapshot = self.store.thread(thread_id).snapshot()
        if snapshot.messages and snapshot.stats.next_sequence <= snapshot.messages[-1].seq_id:
            self.fail("snapshot stats older than its messages")

    def op_get(self, thread_id: str) -> None:
        if not self.own[thread_id]:
            return
        message_id, otid = self.rng.choice(self.own[thread_id][-200:])
        try:
            message = self.store.thread(thread_id).get(message_id)
        except errors.MessageNotFound:
            self.counts["get not found"] += 1
            return
        if message.id != message_id or message.otid != otid:
            self.fail("get returned another message", id=message_id, got=message.id)

    def op_delete_scratch(self, _thread_id: str) -> None:
        thread_id = f"scratch-{self.worker}-{self.n}"
        thread = self.store.thread(thread_id)
        for start in range(0, self.rng.choice((10, 60)), 10):
            thread.append([UserMessage(content=f"scratch {start + i}") for i in range(10)])
        thread.delete()
        self.n += 1
        left = list(
            self.raw.scan_iter(match=f"{self.config.namespace}:{{{thread_id}}}:*", count=1000)
        )
        if left:
            self.fail("delete left keys", thread=thread_id, keys=[k.decode() for k in left[:5]])

    def op_migrate_scratch(self, _thread_id: str) -> None:
        thread_id = f"legacy-{self.worker}-{self.n}"
        self.n += 1
        thread = self.store.thread(thread_id)
        count = self.rng.choice((5, 40, 150))
        write_layout_1(self.raw, thread.keys, count, thread_id)
        new = thread.append(UserMessage(content="after layout 1"))
        if new[0].seq_id != count + 1:
            self.fail("migration reused a sequence", thread=thread_id, got=new[0].seq_id)
        thread.migrate()
        sequences = [m.seq_id for m in thread.iter()]
        if sequences != list(range(1, count + 2)):
            self.fail("migration lost messages", thread=thread_id, sequences=sequences[:20])
        if thread.get(f"legacy-{thread_id}-1").seq_id != 1:
            self.fail("migrated id points elsewhere", thread=thread_id)
        thread.delete()

    OPERATIONS: ClassVar[dict[str, int]] = {
        "append": 20,
        "batch": 6,
        "replay": 4,
        "turn": 10,
        "compact": 4,
        "replace": 4,
        "remove_turn": 2,
        "page": 10,
        "iter": 2,
        "context": 6,
        "snapshot": 3,
        "get": 6,
        "delete_scratch": 1,
        "migrate_scratch": 1,
    }

    def run(self, stop_at: float) -> None:
        names = list(self.OPERATIONS)
        weights = [self.OPERATIONS[name] for name in names]
        while time.time() < stop_at:
            name = self.rng.choices(names, weights)[0]
            thread_id = self.rng.choice(shared_thread_ids())
            getattr(self, f"op_{name}")(thread_id)
            self.counts[name] += 1
        self.ledger.write(event="counts", counts=dict(self.counts))


def mixed_worker(
    url: str, namespace: str, worker: int, ledger_dir: str, stop_at: float, seed: int
) -> None:
    Worker(url, namespace, worker, ledger_dir, seed).run(stop_at)
