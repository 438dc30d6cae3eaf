"""Token counts stored with each message (docs/HISTORY.md, "Counting tokens"; docs/LAYOUT.md,
"Token counts"): given by the caller, counted by the store's counter or by the default rule;
kept in the side infos, the index members and meta through every write; read back by stats()
and by context(max_tokens=N), which plans from them in two round trips (and reads the system
messages the thread starts with in one more where the context does not reach its start:
test_system_prompt.py counts that one; the round trips here are the planner's)."""

from __future__ import annotations

import json
import math
import random

import pytest

from kvstore import (
    AssistantMessage,
    StoreConfig,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
    errors,
)
from kvstore._engine.budget import CONTEXT_HINT
from kvstore._engine.core import Batch, ThreadRef, snapshot, stats
from kvstore._engine.layout.formats import ChunkEntry, LargeEntry, side_tokens
from kvstore._engine.tokens import estimated_tokens
from kvstore._engine.views import context as history_context  # context() but its system prompt

from ..conftest import make_sync_store
from ..support.layout_check import check_layout
from .test_migration import write_layout_1
from .test_page_reads import drive

SMALL = dict(window_size=4, chunk_size=2, chunk_max_bytes=4096, retained_message_limit=3)


def users(n: int, start: int = 0) -> list[UserMessage]:
    return [UserMessage(content=f"message {start + i} " + "w" * (i % 7)) for i in range(n)]


def stored_counts(client, keys) -> dict[int, int]:
    """Each stored sequence's count, read with raw commands from the side infos: the window's
    (layout 2), the open chunk's manifest (layout 3) and each chunk's, a layout-3 string or a
    layout-2 hash's field."""
    counts = {int(s): side_tokens(v) for s, v in client.hgetall(keys.window_side).items()}
    manifests = [client.get(keys.open_manifest) or b""]
    for member in client.zrange(keys.chunk_index, 0, -1) + client.zrange(keys.large_index, 0, -1):
        first = int(member.split(b":")[0])
        manifests.append(
            client.get(keys.chunk_manifest(first)) or client.hget(keys.chunk(first), "_m")
        )
    for manifest in manifests:
        for line in manifest.split(b"\n")[:-1]:
            sequence, _, side = line.partition(b"\t")
            counts[int(sequence)] = side_tokens(side)
    return counts


def keys_of(thread):
    return getattr(thread, "_thread", thread).keys


# --- where a count comes from ------------------------------------------------------------------


def test_counts_given_with_the_messages_are_stored_and_summed(make_thread, raw_client):
    thread = make_thread()
    stored = thread.append(users(3), tokens=[5, 0, 11])
    stored += thread.append(UserMessage(content="one"), tokens=7)
    assert stored_counts(raw_client, keys_of(thread)) == {1: 5, 2: 0, 3: 11, 4: 7}
    assert thread.stats().tokens == 23


def test_the_stores_counter_counts_what_the_caller_did_not(make_thread, raw_client):
    def count(message):
        return len(message.content) if message.message_type == "user_message" else 50

    thread = make_thread(count_tokens=count)
    thread.append([UserMessage(content="abc"), UserMessage(content="hello")])
    thread.append(UserMessage(content="given"), tokens=100)
    summary = thread.compact("four", 2)
    counts = stored_counts(raw_client, keys_of(thread))
    assert counts == {1: 3, 2: 5, 3: 100, summary.seq_id: 50}
    assert thread.stats().tokens == 158


def test_without_a_counter_the_default_rule_counts_each_message(make_thread, raw_client):
    thread = make_thread()
    stored = thread.append(users(3)) + thread.append(users(2), turn_id="turn-with-a-long-name")
    counts = stored_counts(raw_client, keys_of(thread))
    # The rule counts the message as it reads back (seq_id and the turn id left out).
    assert [counts[m.seq_id] for m in stored] == [estimated_tokens(m) for m in thread.iter()]
    assert thread.stats().tokens == sum(estimated_tokens(m) for m in stored)


def test_a_summary_takes_its_given_count(make_thread):
    thread = make_thread()
    thread.append(users(4), tokens=[1, 2, 3, 4])
    thread.compact("s", 2, tokens=9)
    assert thread.stats().tokens == 1 + 2 + 3 + 4 + 9


@pytest.mark.parametrize(
    "tokens", [[1], [1, 2, 3], [-1, 2], [1.5, 2], [True, 1], [1, "2"], "12", 3, {"a": 1}]
)
def test_bad_counts_are_refused_before_anything_is_sent(make_thread, raw_client, tokens):
    thread = make_thread()
    with pytest.raises(errors.InvalidMessage):
        thread.append(users(2), tokens=tokens)
    assert not raw_client.exists(keys_of(thread).meta, keys_of(thread).window)


def test_a_counter_giving_a_bad_count_stores_nothing(make_thread, raw_client):
    thread = make_thread(count_tokens=lambda m: -1)
    with pytest.raises(errors.InvalidMessage, match="token counter"):
        thread.append(users(2))
    with pytest.raises(errors.InvalidMessage):
        thread.compact("s", 1, tokens=-3)
    assert not raw_client.exists(keys_of(thread).meta, keys_of(thread).window)


def test_a_bad_replacement_count_is_refused(make_thread):
    thread = make_thread()
    (stored,) = thread.append(UserMessage(content="a"), tokens=[4])
    with pytest.raises(errors.InvalidMessage):
        thread.replace(stored.id, UserMessage(content="b"), tokens=-1)
    assert thread.stats().tokens == 4


def test_a_store_refuses_a_counter_that_is_not_a_function(backend, namespace):
    with pytest.raises(errors.ConfigError):
        make_sync_store(backend, StoreConfig(namespace=namespace), count_tokens=12)


# --- kept right by every write -----------------------------------------------------------------


def expected_total(thread, counts_by_id: dict[str, int]) -> int:
    return sum(counts_by_id[m.id] for m in thread.iter())


def test_counts_follow_rollover_retention_replace_and_turn_removal(make_thread, raw_client):
    thread = make_thread(**SMALL)
    keys = keys_of(thread)
    config = StoreConfig(namespace=keys.meta.split(":")[0], **SMALL)
    rng = random.Random(7)
    counts_by_id: dict[str, int] = {}
    for step in range(12):
        batch = users(rng.randint(1, 3), start=10 * step)
        tokens = [rng.randint(0, 50) for _ in batch]
        stored = thread.append(batch, turn_id=f"turn-{step % 3}", tokens=tokens)
        counts_by_id.update((m.id, t) for m, t in zip(stored, tokens, strict=True))
        check_layout(raw_client, keys, config)
        assert thread.stats().tokens == expected_total(thread, counts_by_id)
    # An oversized message: its own chunk, its count in the large index member.
    (big,) = thread.append(UserMessage(content="x" * 5000), tokens=[321])
    counts_by_id[big.id] = 321
    assert [LargeEntry.parse(m).tokens for m in raw_client.zrange(keys.large_index, 0, -1)] == [321]
    # A compaction and the retention it runs.
    last = thread.stats().next_sequence - 1
    summary = thread.compact("so far", last - 6, tokens=13)
    counts_by_id[summary.id] = 13
    assert thread.stats().deleted_before_sequence is not None
    check_layout(raw_client, keys, config)
    assert thread.stats().tokens == expected_total(thread, counts_by_id)
    # Replace a chunk message and a window message.
    messages = list(thread.iter())
    in_chunk = next(
        m
        for m in messages
        if raw_client.hget(keys.window_side, m.seq_id) is None and m.id != big.id
    )
    newest = messages[-1]
    for message, tokens in ((in_chunk, 77), (newest, 2)):
        thread.replace(message.id, AssistantMessage(content="changed"), tokens=tokens)
        counts_by_id[message.id] = tokens
        check_layout(raw_client, keys, config)
        assert thread.stats().tokens == expected_total(thread, counts_by_id)
    members = [ChunkEntry.parse(m) for m in raw_client.zrange(keys.chunk_index, 0, -1)]
    assert any(e.first <= in_chunk.seq_id <= e.last and e.tokens >= 77 for e in members)
    # Remove a turn whose messages are in chunks and the window.
    assert thread.remove_turn("turn-1") > 0
    check_layout(raw_client, keys, config)
    assert thread.stats().tokens == expected_total(thread, counts_by_id)


def test_a_fork_keeps_each_messages_count(make_thread, raw_client):
    thread = make_thread(**SMALL)
    rng = random.Random(3)
    tokens = [rng.randint(0, 40) for _ in range(17)]
    stored = thread.append(users(17), tokens=tokens)
    fork = thread.fork("thread-fork", at=stored[10].id)
    source = stored_counts(raw_client, keys_of(thread))
    copied = stored_counts(raw_client, keys_of(fork))
    assert copied == {s: t for s, t in source.items() if s <= stored[10].seq_id}
    assert fork.stats().tokens == sum(tokens[:11])
    check_layout(
        raw_client, keys_of(fork), StoreConfig(namespace=keys_of(fork).meta.split(":")[0], **SMALL)
    )


# --- data written before counts existed --------------------------------------------------------


def strip_counts(client, keys) -> None:
    """Rewrites a thread as a version without counts wrote it: side infos of five fields (six
    with the escape mark), index members without tokens, no meta total."""

    def old_side(side: bytes) -> bytes:
        fields = side.split(b"\t")
        escaped = fields[-1] == b"%"
        fields = fields[:5] + ([b"%"] if escaped else [])
        return b"\t".join(fields)

    def old_manifest(manifest: bytes) -> bytes:
        lines = [line.partition(b"\t") for line in manifest.split(b"\n")[:-1]]
        return b"".join(s + b"\t" + old_side(side) + b"\n" for s, _, side in lines)

    for sequence, side in client.hgetall(keys.window_side).items():
        client.hset(keys.window_side, sequence, old_side(side))
    if client.exists(keys.open_manifest):  # layout 3's open chunk, its sum by the rule
        opened = old_manifest(client.get(keys.open_manifest))
        client.set(keys.open_manifest, opened)
        rule = sum(math.ceil(int(line.split(b"\t")[4]) / 4) for line in opened.split(b"\n")[:-1])
        client.hset(keys.meta, mapping={"open_tokens": rule, "open_manifest_bytes": len(opened)})
    for index, width in ((keys.chunk_index, 5), (keys.large_index, 3)):
        for member, score in client.zrange(index, 0, -1, withscores=True):
            client.zrem(index, member)
            client.zadd(index, {b":".join(member.split(b":")[:width]): score})
            first = int(member.split(b":")[0])
            if client.exists(keys.chunk_manifest(first)):  # a layout-3 chunk's string
                manifest = client.get(keys.chunk_manifest(first))
                client.set(keys.chunk_manifest(first), old_manifest(manifest))
            else:
                manifest = client.hget(keys.chunk(first), "_m")
                client.hset(keys.chunk(first), "_m", old_manifest(manifest))
    client.hdel(keys.meta, "tokens")


def old_rule_total(client, keys) -> int:
    """What the documented rule counts for a thread without counts: ceil(bytes / 4) per window
    and open chunk message and per index member."""
    total = sum(math.ceil(int(v.split(b"\t")[3]) / 4) for v in client.hvals(keys.window_side))
    opened = (client.get(keys.open_manifest) or b"").split(b"\n")[:-1]
    total += sum(math.ceil(int(line.split(b"\t")[4]) / 4) for line in opened)
    total += sum(
        math.ceil(int(m.split(b":")[3]) / 4) for m in client.zrange(keys.chunk_index, 0, -1)
    )
    total += sum(
        math.ceil(int(m.split(b":")[1]) / 4) for m in client.zrange(keys.large_index, 0, -1)
    )
    return total


def test_side_infos_and_members_written_without_counts_still_read(make_thread, raw_client):
    thread = make_thread(**SMALL)
    keys = keys_of(thread)
    config = StoreConfig(namespace=keys.meta.split(":")[0], **SMALL)
    thread.append(users(9), turn_id="t-old")
    thread.append(UserMessage(content="y" * 5000))  # oversized
    before = list(thread.iter())
    strip_counts(raw_client, keys)
    # Every manifest line (layout 3: the open chunk's and the chunks') has five side fields.
    firsts = [int(m.split(b":")[0]) for m in raw_client.zrange(keys.chunk_index, 0, -1)]
    manifests = [raw_client.get(keys.open_manifest) or b""] + [
        raw_client.get(keys.chunk_manifest(f)) or raw_client.hget(keys.chunk(f), "_m")
        for f in firsts
    ]
    assert all(line.count(b"\t") == 5 for m in manifests for line in m.split(b"\n")[:-1])
    # Read as they are: pages, stats by the rule, a budgeted context.
    assert list(thread.iter()) == before
    by_rule = old_rule_total(raw_client, keys)
    assert thread.stats().tokens == math.ceil(int(raw_client.hget(keys.meta, "bytes")) / 4)
    assert thread.context(max_tokens=10**9)[-1] == before[-1]
    # A budget is planned by the rule, in two round trips (one when the handle's last plan named
    # the same chunks), as the client counting by it gives.
    by_seq = stored_counts(raw_client, keys)
    store = (
        None if hasattr(thread, "_thread") else thread._store
    )  # round trips counted on the sync store
    for budget in (3, 40, 400):
        rule = thread.context(max_tokens=budget, count_tokens=lambda m: by_seq[m.seq_id])
        assert thread.context(max_tokens=budget) == rule
        if store is not None:
            _, requests = drive(store, history_context(thread._ref, budget))
            assert len(requests) in (1, 2)
            _, requests = drive(store, history_context(thread._ref, budget))
            assert len(requests) == 1
    counts = stored_counts(raw_client, keys)
    window = {int(s) for s in raw_client.hkeys(keys.window_side)}
    for s in window:
        record_bytes = int(raw_client.hget(keys.window_side, s).split(b"\t")[3])
        assert counts[s] == math.ceil(record_bytes / 4)
    # The next write gives meta its total, and adds to it.
    thread.append(UserMessage(content="new"), tokens=[6])
    assert int(raw_client.hget(keys.meta, "tokens")) == by_rule + 6
    check_layout(raw_client, keys, config)
    # Every write path takes old members and side infos as they are.
    thread.replace(before[0].id, UserMessage(content="r"), tokens=1)
    check_layout(raw_client, keys, config)
    thread.remove_turn("t-old")
    check_layout(raw_client, keys, config)
    thread.compact("s", thread.stats().next_sequence - 2, tokens=2)
    check_layout(raw_client, keys, config)
    assert thread.stats().tokens == int(raw_client.hget(keys.meta, "tokens"))


def test_stats_of_a_thread_written_before_counts_reads_no_more_than_before(backend, namespace):
    """stats() and snapshot() of a thread no write has touched since counts were kept are one
    round trip whatever the thread's length (a read of every index member per call would make an
    archive's page loads grow with it): its total is the rule on its stored bytes until its
    first write counts each chunk and message."""
    store = make_sync_store(backend, StoreConfig(namespace=namespace, **SMALL))
    thread = store.thread("archive")
    thread.append(users(40))
    drive(store, snapshot(thread._ref))  # the store has read it at layout 3: no window read next
    _, counted_snapshot = drive(store, snapshot(thread._ref))
    strip_counts(store.client, thread.keys)
    stored_bytes = int(store.client.hget(thread.keys.meta, "bytes"))
    result, requests = drive(store, stats(thread._ref))
    assert len(requests) == 1
    assert result.tokens == math.ceil(stored_bytes / 4)
    result, requests = drive(store, snapshot(thread._ref))
    assert requests == counted_snapshot and result.stats.tokens == math.ceil(stored_bytes / 4)
    # The first write counts it by each member and window message, and adds its own.
    by_rule = old_rule_total(store.client, thread.keys)
    thread.append(UserMessage(content="new"), tokens=[5])
    assert thread.stats().tokens == by_rule + 5


def test_an_old_escaped_side_info_reads(make_thread, raw_client):
    thread = make_thread()
    keys = keys_of(thread)
    thread.append(users(2), tokens=[3, 4])
    # An id holding a tab, as a layout-1 migration wrote it before counts: escaped, no count
    # (layout 3: in the open chunk's manifest, its record's true size).
    manifest = raw_client.get(keys.open_manifest)
    first, rest = manifest.split(b"\n", 1)
    size = int(first.split(b"\t")[4])
    raw_client.set(keys.open_manifest, b"1\ta%%09b\t\t0\t%d\t\t%%\n" % size + rest)
    # As the writer of that line would have accounted for it (meta frames the open chunk).
    raw_client.hset(keys.meta, "open_manifest_bytes", raw_client.strlen(keys.open_manifest))
    raw_client.hdel(keys.meta, "tokens")
    # The next write counts it: its record bytes by the rule, the other message's stored count.
    thread.append(UserMessage(content="c"), tokens=[1])
    expected = math.ceil(size / 4) + 4 + 1
    assert int(raw_client.hget(keys.meta, "tokens")) == expected == thread.stats().tokens


# --- context(max_tokens) from the stored counts ------------------------------------------------


def newest_fitting(messages, counts_by_id, budget):
    kept = []
    for message in reversed(messages):
        if counts_by_id[message.id] > budget:
            break
        budget -= counts_by_id[message.id]
        kept.append(message)
    return kept[::-1]


@pytest.mark.parametrize("compacted", [False, True])
def test_a_budget_is_planned_from_stored_counts_in_two_round_trips(backend, namespace, compacted):
    """Two round trips, one when the plan needs no closed chunk or when the handle's last plan
    named the chunks this one needs (read ahead in the first); the same context either way."""
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    rng = random.Random(11)
    messages = users(300)
    tokens = [rng.randint(0, 30) for _ in messages]
    thread.append(messages[:150], tokens=tokens[:150])
    thread.append(UserMessage(content="z" * 5000), tokens=[25])  # an oversized one among them
    thread.append(messages[150:], tokens=tokens[150:])
    counts_by_id = {
        m.id: t for m, t in zip(thread.iter(), [*tokens[:150], 25, *tokens[150:]], strict=True)
    }
    summary = None
    if compacted:
        summary = thread.compact("s", 120, tokens=40)
        counts_by_id[summary.id] = 40
    ref = ThreadRef.of(config, "t")
    full = thread.context()
    body = full[1:] if compacted else full
    for budget in (1, 5, 60, 400, 2500, 10**6):
        result, requests = drive(store, history_context(ref, budget))
        assert len(requests) in (1, 2) and all(isinstance(r, Batch) for r in requests), requests
        guessed = ref.hints.get(CONTEXT_HINT)
        again, requests = drive(store, history_context(ref, budget))
        assert again == result
        if guessed is not None:
            assert len(requests) == 1, requests
        # The same as counting on the client with the stored counts.
        assert result == thread.context(
            max_tokens=budget, count_tokens=lambda m: counts_by_id[m.id]
        )
        left = budget - (40 if compacted else 0)
        assert result == ([summary] if compacted else []) + newest_fitting(body, counts_by_id, left)


@pytest.mark.parametrize("compacted", [False, True])
def test_context_without_a_budget_is_the_plan_every_message_fits(backend, namespace, compacted):
    """No budget: the summary and every message after what it covers, in the plan's two round
    trips however many pages they fill (up to 128 chunks, as a budget), equal to what a
    page-by-page read gives."""
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=16)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    for start in range(0, 1200, 300):
        thread.append(users(300, start), tokens=[0, 7, 1000] * 100)
    thread.append(UserMessage(content="z" * 5000))  # an oversized one, counted by the rule
    summary = thread.compact("s", 500, tokens=40) if compacted else None
    expected = ([summary] if summary else []) + [
        m for m in thread.iter() if m.seq_id > (500 if compacted else 0) and m != summary
    ]
    ref = ThreadRef.of(config, "t")
    result, requests = drive(store, history_context(ref, None))
    assert len(requests) == 2 and all(isinstance(r, Batch) for r in requests), requests
    assert CONTEXT_HINT not in ref.hints  # too many chunks to read ahead
    assert result == expected and len(result) > 700
    # A counter of the caller's reads page by page, and agrees.
    assert thread.context(max_tokens=2**52, count_tokens=lambda m: 1) == expected
    store.close()


def test_a_budget_past_the_newest_members_reads_more_of_the_index(backend, namespace):
    config = StoreConfig(namespace=namespace, window_size=4, chunk_size=2)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    for start in range(0, 400, 100):
        thread.append(users(100, start), tokens=[1] * 100)
    result, requests = drive(store, history_context(ThreadRef.of(config, "t"), 350))
    assert result == list(thread.iter())[-350:]
    assert len(requests) == 3  # the plan, the next 128 index members, the fetch


def test_a_budget_keeps_pairs_whole_with_stored_counts(make_thread):
    thread = make_thread(window_size=4, chunk_size=2)
    call = ToolCallMessage(tool_call={"name": "f", "arguments": "{}", "tool_call_id": "c1"})
    answer = ToolReturnMessage(tool_call_id="c1", tool_return="ok", status="success")
    thread.append(
        [UserMessage(content="q"), call, answer, AssistantMessage(content="a")],
        tokens=[1, 10, 10, 1],
    )
    assert [m.message_type for m in thread.context(max_tokens=11)] == ["assistant_message"]
    assert [m.message_type for m in thread.context(max_tokens=21)] == [
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]


def test_a_migrated_layout_1_thread_counts_its_records_by_the_rule(
    make_thread, raw_client, namespace
):
    thread = make_thread("old-thread", window_size=8, chunk_size=4)
    keys = keys_of(thread)
    write_layout_1(raw_client, keys, 40)
    legacy = {int(s): len(r) for s, r in raw_client.hgetall(keys.legacy).items()}
    (new,) = thread.append(UserMessage(content="the first new message"), tokens=[8])
    thread.migrate()
    assert thread.stats().layout_version == 3  # through 2
    counts = stored_counts(raw_client, keys)
    assert counts == {**{s: math.ceil(size / 4) for s, size in legacy.items()}, new.seq_id: 8}
    assert thread.stats().tokens == sum(counts.values())
    check_layout(raw_client, keys, StoreConfig(namespace=namespace, window_size=8, chunk_size=4))


def test_an_export_carries_the_counts_and_an_import_restores_them(
    backend, namespace, raw_client, server_only
):
    import io

    from kvstore.cli import backup

    source = make_sync_store(backend, StoreConfig(namespace=namespace, **SMALL))
    target = make_sync_store(backend, StoreConfig(namespace=namespace + "r", **SMALL))
    tokens = [random.Random(5).randint(0, 60) for _ in range(14)]
    source.thread("chat").append(users(14), tokens=tokens)
    out = io.StringIO()
    backup.export(source, "chat", out, progress_out=io.StringIO())
    lines = [
        json.loads(line) for line in out.getvalue().splitlines()[1:-1]
    ]  # the header, the messages, the end line
    assert [line["tokens"] for line in lines] == tokens
    backup.import_lines(
        target,
        "chat",
        io.StringIO(out.getvalue()),
        backup.ImportProgress(),
        progress_out=io.StringIO(),
    )
    assert stored_counts(raw_client, target.thread("chat").keys) == stored_counts(
        raw_client, source.thread("chat").keys
    )
    assert target.thread("chat").stats().tokens == sum(tokens)
    # A count that is not an int >= 0 is refused before anything of the line is stored.
    bad = out.getvalue().replace(f'"tokens":{tokens[0]}', '"tokens":-4', 1)
    with pytest.raises(errors.InvalidMessage, match="line 2"):
        backup.import_lines(
            target, "other", io.StringIO(bad), backup.ImportProgress(), progress_out=io.StringIO()
        )
    assert not target.thread("other").stats().stored_messages
