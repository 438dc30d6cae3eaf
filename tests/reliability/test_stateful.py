"""A Hypothesis state machine against a model: the library's thread equals the model after every
step, with FUNCTION FLUSH and kill -9 + restart of the server among the steps.

The server is Valkey with `appendonly yes` and `appendfsync always`, so a restart keeps every
acknowledged write. Sizes are small (window 4, chunk 3, 1500-byte chunks, at most 2 chunks moved
per call, 5 messages kept by retention) so rollovers, oversized chunks, retention and its per-call
cap happen within a few steps. Retention's extent depends on chunk boundaries the model does not
track: the model takes `deleted_before` from the library and checks that it is allowed (only what
the summary covers, the newest `retained_message_limit` kept, oldest first) and, after a
compaction, complete (the oldest chunk left is not deletable).
"""

from __future__ import annotations

import os
from collections import Counter

import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvstore import AssistantMessage, MessageStore, StoreConfig, UserMessage, errors
from kvstore._engine.layout.formats import ChunkEntry

from ..support import model
from ..support.layout_check import check_layout, read_layout
from .support import dedicated_server, fresh_namespace

CONFIG = dict(
    window_size=4,
    chunk_size=3,
    chunk_max_bytes=1500,
    max_chunks_per_call=2,
    retained_message_limit=5,
)
SIZES = st.sampled_from([5, 120, 600, 1700])  # 1700 is over chunk_max_bytes: its own chunk
TURNS = st.sampled_from([None, "t0", "t1", "t2", "t3"])

SERVER: dict = {}
STEPS: Counter = Counter()


def body(tag: str, size: int) -> str:
    return (tag + " " + "x" * size)[: max(size, len(tag))]


class ThreadMachine(RuleBasedStateMachine):
    max_size = 10**6  # message sizes drawn above this are cut to it (see SmallMessagesMachine)

    def __init__(self) -> None:
        super().__init__()
        self.server = SERVER["server"]
        self.config = StoreConfig(namespace=fresh_namespace(), **CONFIG)
        self.store = MessageStore.from_url(self.server.url, self.config)
        self.raw = redis.Redis(port=self.server.port)
        self.thread = self.store.thread("machine")
        self.kept: list = []  # sorted by sequence
        self.gone: list = []  # deleted by retention or removed with a turn
        self.turn_of: dict[str, str | None] = {}
        self.last_seq = 0
        self.summary_last = 0
        self.summary_seq: int | None = None
        self.deleted_before = 0
        self.restarts = 0
        self.n = 0
        STEPS["threads"] += 1

    def teardown(self) -> None:
        self.thread.delete()
        self.store.close()
        self.raw.close()

    # ---------------------------------------------------------------------------- helpers

    def _new(self, size: int, kind: str, otid: bool):
        size = min(size, self.max_size)
        self.n += 1
        make = UserMessage if kind == "user" else AssistantMessage
        return make(content=body(f"n{self.n}", size), otid=f"o{self.n}" if otid else None)

    def _stored(self, messages, turn) -> None:
        assert [m.seq_id for m in messages] == list(
            range(self.last_seq + 1, self.last_seq + 1 + len(messages))
        )
        self.last_seq += len(messages)
        self.kept += messages
        self.turn_of.update((m.id, turn) for m in messages)
        self._retention()

    def _retention(self) -> None:
        """Takes deleted_before from the library and checks that what it deleted was allowed."""
        deleted_before = self.thread.stats().deleted_before_sequence or 0
        assert deleted_before >= self.deleted_before
        if deleted_before > self.deleted_before:
            deleted = [m for m in self.kept if m.seq_id < deleted_before]
            assert all(m.seq_id <= self.summary_last for m in deleted), "deleted past the summary"
            assert len(self.kept) - len(deleted) >= CONFIG["retained_message_limit"], (
                "kept fewer than the limit"
            )
            self.kept = [m for m in self.kept if m.seq_id >= deleted_before]
            self.gone += deleted
            self.deleted_before = deleted_before
            STEPS["messages deleted by retention"] += len(deleted)

    def _retention_is_complete(self) -> None:
        """After a compaction the oldest stored message is not deletable (SPEC §3): it is in the
        window, or its chunk ends after the summary's last sequence, or fewer than
        retained_message_limit messages are stored after that chunk (or it is in the open chunk)."""
        if not self.kept or not self.summary_last:
            return
        keys, oldest = self.thread.keys, self.kept[0].seq_id
        if self.raw.zscore(keys.large_index, oldest) is None and self.raw.hexists(
            keys.window_side, oldest
        ):
            return
        opened = (self.raw.get(keys.open_manifest) or b"").split(b"\n")[:-1]
        if oldest in {int(line.split(b"\t")[0]) for line in opened}:
            return  # in the open chunk (layout 3), which retention never deletes
        last = oldest  # an oversized message's own chunk
        for member in self.raw.zrange(keys.chunk_index, "-inf", oldest, byscore=True):
            chunk = ChunkEntry.parse(member)
            if chunk.first <= oldest <= chunk.last:
                last = chunk.last
        after = sum(1 for m in self.kept if m.seq_id > last)
        assert last > self.summary_last or after < CONFIG["retained_message_limit"], (
            f"the chunk holding {oldest} (up to {last}) was still deletable after the compaction:"
            f" {after} messages are stored after it"
        )

    # ------------------------------------------------------------------------------ rules

    @rule(size=SIZES, kind=st.sampled_from(["user", "assistant"]), otid=st.booleans(), turn=TURNS)
    def append_one(self, size, kind, otid, turn):
        STEPS["append"] += 1
        self._stored(self.thread.append(self._new(size, kind, otid), turn_id=turn), turn)

    @rule(sizes=st.lists(SIZES, min_size=2, max_size=5), otids=st.booleans(), turn=TURNS)
    def append_batch(self, sizes, otids, turn):
        STEPS["append batch"] += 1
        batch = [self._new(size, "user", otids) for size in sizes]
        self._stored(self.thread.append(batch, turn_id=turn), turn)

    @precondition(lambda self: any(m.otid for m in self.kept))
    @rule(data=st.data())
    def replay_otids(self, data):
        STEPS["otid replay"] += 1
        with_otid = [m for m in self.kept if m.otid]
        # Positions, not messages, are drawn: a failing run then prints short steps.
        positions = data.draw(
            st.lists(st.integers(0, len(with_otid) - 1), min_size=1, max_size=3, unique=True)
        )
        chosen = [with_otid[i] for i in positions]
        replayed = self.thread.append(
            [UserMessage(content="a different body", otid=m.otid) for m in chosen]
        )
        assert replayed == chosen

    @precondition(lambda self: any(m.otid for m in self.kept))
    @rule(data=st.data())
    def otid_conflict(self, data):
        STEPS["otid conflict"] += 1
        with_otid = [m for m in self.kept if m.otid]
        stored = with_otid[data.draw(st.integers(0, len(with_otid) - 1))]
        try:
            self.thread.append(
                [
                    UserMessage(content="old", otid=stored.otid),
                    UserMessage(content="new", otid="never-stored"),
                ]
            )
        except errors.OtidConflict:
            return
        raise AssertionError("a batch mixing a stored and a new otid was accepted")

    @precondition(lambda self: self.last_seq > 0)
    @rule(data=st.data())
    def compact(self, data):
        STEPS["compact"] += 1
        last = data.draw(st.integers(max(1, self.summary_last), self.last_seq))
        summary = self.thread.compact(f"summary up to {last}", last)
        if last == self.summary_last:
            # The current summary covers exactly this range: a replay, nothing is written.
            STEPS["compact replayed"] += 1
            assert summary.seq_id == self.summary_seq and summary.summary == f"summary up to {last}"
            self._retention()  # a replay runs retention again: rollovers since may allow more
            self._retention_is_complete()
            return
        assert summary.seq_id == self.last_seq + 1
        self.last_seq += 1
        self.kept.append(summary)
        self.turn_of[summary.id] = None
        self.summary_last, self.summary_seq = last, summary.seq_id
        self._retention()
        self._retention_is_complete()

    @precondition(lambda self: self.last_seq > 0)
    @rule(data=st.data())
    def compact_refused(self, data):
        STEPS["compact refused"] += 1
        choices = [self.last_seq + 1, self.last_seq + 50]
        if self.summary_last > 1:
            choices.append(self.summary_last - 1)
        try:
            self.thread.compact("a bad summary", data.draw(st.sampled_from(choices)))
        except errors.InvalidSummaryRange:
            return
        raise AssertionError("a summary past the last sequence or moving back was accepted")

    @precondition(lambda self: any(m.message_type != "summary_message" for m in self.kept))
    @rule(data=st.data(), size=SIZES)
    def replace(self, data, size):
        STEPS["replace"] += 1
        candidates = [m for m in self.kept if m.message_type != "summary_message"]
        target = candidates[data.draw(st.integers(0, len(candidates) - 1))]
        before = read_layout(self.raw, self.thread.keys)
        size = min(size, self.max_size)
        try:
            replaced = self.thread.replace(
                target.id, UserMessage(content=body(f"r{target.seq_id}", size))
            )
        except errors.MessageTooLarge:
            # Allowed only for a message sharing a normal chunk the replacement would overflow.
            (fields,) = [f for f in before.chunks.values() if target.seq_id in f]
            assert len(fields) > 1
            assert (
                sum(len(r) for r in fields.values()) - len(fields[target.seq_id]) + size
                > CONFIG["chunk_max_bytes"] - 300
            )
            STEPS["replace refused (chunk full)"] += 1
            return
        assert (replaced.id, replaced.seq_id, replaced.otid) == (
            target.id,
            target.seq_id,
            target.otid,
        )
        self.kept[self.kept.index(target)] = replaced

    @rule(turn=TURNS.filter(lambda t: t is not None))
    def remove_turn(self, turn):
        STEPS["remove_turn"] += 1
        removed = self.thread.remove_turn(turn)
        going = [m for m in self.kept if self.turn_of.get(m.id) == turn]
        assert removed == len(going)
        self.kept = [m for m in self.kept if self.turn_of.get(m.id) != turn]
        self.gone += going

    @rule(data=st.data())
    def page(self, data):
        STEPS["list"] += 1
        ids = [m.id for m in self.kept]
        by_position = st.integers(0, len(ids) - 1).map(lambda i: ids[i]) if ids else st.none()
        cursor = st.one_of(st.none(), st.integers(0, self.last_seq + 2), by_position)
        after, before = data.draw(cursor), data.draw(cursor)
        limit = data.draw(st.integers(1, 8))
        order = data.draw(st.sampled_from(["asc", "desc"]))
        turn = data.draw(TURNS)
        page = self.thread.list(after=after, before=before, limit=limit, order=order, turn_id=turn)
        seq_of = {m.id: m.seq_id for m in self.kept}
        bounds = [seq_of[c] if isinstance(c, str) else c for c in (after, before)]
        kept = [m for m in self.kept if turn is None or self.turn_of.get(m.id) == turn]
        sequences, has_more = model.page([m.seq_id for m in kept], *bounds, limit, order)
        by_seq = {m.seq_id: m for m in self.kept}
        assert page.messages == [by_seq[s] for s in sequences]
        assert page.has_more == has_more
        assert page.deleted_before_sequence == (self.deleted_before or None)

    @rule()
    def context(self):
        STEPS["context"] += 1
        assert self.thread.context() == model.context(
            self.kept, self.summary_last, self.summary_seq
        )

    @precondition(lambda self: self.kept or self.gone)
    @rule(data=st.data())
    def get(self, data):
        STEPS["get"] += 1
        known = self.kept + self.gone
        message = known[data.draw(st.integers(0, len(known) - 1))]
        if message in self.kept:
            assert self.thread.get(message.id) == message
        else:
            try:
                self.thread.get(message.id)
            except errors.MessageNotFound:
                return
            raise AssertionError(f"{message.id} was deleted or removed but get() found it")

    @rule()
    def function_flush(self):
        STEPS["FUNCTION FLUSH"] += 1
        self.raw.function_flush()

    @precondition(lambda self: self.restarts < 2)
    @rule()
    def restart(self):
        STEPS["kill -9 + restart"] += 1
        self.restarts += 1
        self.server.kill()
        self.server.start()

    # ------------------------------------------------------------------------- invariant

    @invariant()
    def equals_the_model(self):
        STEPS["checks"] += 1
        assert list(self.thread.iter()) == self.kept
        stats = self.thread.stats()
        layout = check_layout(self.raw, self.thread.keys, self.config)
        assert layout.all_sequences() == [m.seq_id for m in self.kept], (
            f"stored {layout.all_sequences()}, the pages show {[m.seq_id for m in self.kept]}"
            f" (deleted_before {self.deleted_before})"
        )
        assert stats.stored_messages == len(self.kept)
        assert stats.next_sequence == self.last_seq + 1
        assert (stats.deleted_before_sequence or 0) == self.deleted_before
        assert (stats.summary_last_sequence or 0) == self.summary_last


class SmallMessagesMachine(ThreadMachine):
    """The same steps with no message over chunk_max_bytes, so no oversized chunk is written."""

    max_size = 1000


def run_machine(machine: type[ThreadMachine], examples: int) -> None:
    with dedicated_server("valkey", "--appendonly", "yes", "--appendfsync", "always") as server:
        SERVER["server"] = server
        STEPS.clear()
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
                # Shrinking a failing run replays it hundreds of times, server restarts included
                # (up to Hypothesis's 5-minute shrink limit): the run is printed as found unless
                # KVSTORE_SHRINK=1 asks for the minimal one.
                phases=[
                    p
                    for p in Phase
                    if p is not Phase.shrink or os.environ.get("KVSTORE_SHRINK") == "1"
                ],
            ),
        )
    print(
        f"\nstateful ({machine.__name__}): {STEPS['threads']} runs, {STEPS['checks']} model checks;"
        f" steps {dict(STEPS.most_common())}"
    )


# Runs of each machine: the full count with KVSTORE_LONG=1, a third of it in every other run (the
# two machines took 4 of CI's 20 minutes of tests/reliability and tests/cluster).
LONG = os.environ.get("KVSTORE_LONG") == "1"


def test_the_thread_equals_the_model_under_flushes_and_restarts():
    run_machine(ThreadMachine, 50 if LONG else 17)


def test_the_thread_equals_the_model_without_oversized_messages():
    """Every message within chunk_max_bytes: the steps spend themselves on rollovers, retention and
    restarts among window-sized messages rather than on oversized chunks."""
    run_machine(SmallMessagesMachine, 40 if LONG else 14)


def test_replacing_a_message_alone_in_its_chunk_with_an_oversized_one_keeps_the_layout():
    """The state machine's shortest way to a replace it found breaking an invariant: a message
    alone in a normal chunk (each 1 KB message fills a 1500-byte chunk) replaced by one over
    chunk_max_bytes must not leave a normal chunk holding an oversized record (docs/LAYOUT.md:
    a normal chunk holds at most chunk_max_bytes of records; oversized messages have their own)."""
    with dedicated_server("valkey") as server:
        config = StoreConfig(namespace=fresh_namespace(), **CONFIG)
        raw = redis.Redis(port=server.port)
        thread = MessageStore.from_url(server.url, config).thread("alone")
        stored = []
        for i in range(6):
            stored += thread.append(UserMessage(content=body(f"m{i}", 1000)))
        assert len(read_layout(raw, thread.keys).chunks[1]) == 1
        replaced = thread.replace(stored[0].id, UserMessage(content=body("big", 1700)))
        stored[0] = replaced
        assert list(thread.iter()) == stored
        check_layout(raw, thread.keys, config)
