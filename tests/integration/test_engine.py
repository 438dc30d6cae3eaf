"""The thread engine on every backend, sync and async: append, rollover, index, paging, turns."""

from __future__ import annotations

import random
import re

import pytest

from kvstore import AssistantMessage, StoreConfig, UserMessage, errors
from kvstore._engine.layout.keys import ThreadKeys

from ..support import model
from ..support.layout_check import check_layout, read_layout

SMALL = dict(window_size=8, chunk_size=4, chunk_max_bytes=2048)


def text(n: int, tag: str = "") -> str:
    return (tag + " " + "x" * n)[:n] if n > len(tag) else tag


def test_append_assigns_gap_free_sequences_ids_and_dates(make_thread):
    thread = make_thread()
    first = thread.append(UserMessage(content="hi"))
    batch = thread.append([AssistantMessage(content="a"), UserMessage(content="b")])
    assert [m.seq_id for m in first + batch] == [1, 2, 3]
    assert all(m.id.startswith("message-") and m.date is not None for m in first + batch)
    assert len({m.id for m in first + batch}) == 3
    assert thread.get(batch[1].id) == batch[1]


def test_rollover_keeps_index_exact_after_every_step(make_thread, raw_client, namespace):
    thread = make_thread(**SMALL)
    config = StoreConfig(namespace=namespace, **SMALL)
    rng = random.Random(7)
    stored = []
    for step in range(60):
        size = rng.choice([10, 300, 700, 1500])
        batch = [UserMessage(content=text(size, f"{step}.{i}")) for i in range(rng.randint(1, 3))]
        stored += thread.append(batch)
        layout = check_layout(raw_client, thread.keys, config)
        assert layout.all_sequences() == [m.seq_id for m in stored]
    # Chunks closed on bytes before reaching chunk_size, and every chunk is under the cap.
    layout = read_layout(raw_client, thread.keys)
    counts = [len(fields) for fields in layout.chunks.values()]
    assert layout.chunks and min(counts) < SMALL["chunk_size"]
    assert layout.open  # layout 3: the newest messages are in the open chunk
    assert list(thread.iter()) == stored


def test_oversized_message_goes_straight_into_its_own_chunk(make_thread, raw_client, namespace):
    thread = make_thread(**SMALL)
    config = StoreConfig(namespace=namespace, **SMALL)
    stored = thread.append([UserMessage(content=f"small {i}") for i in range(5)])
    big = thread.append(UserMessage(content="B" * 5000))[0]
    layout = check_layout(raw_client, thread.keys, config)
    assert big.seq_id in layout.large and big.seq_id not in layout.window
    assert raw_client.hget(thread.keys.window_side, big.seq_id) is None
    stored += [big]
    stored += thread.append([UserMessage(content=f"after {i}") for i in range(20)])
    check_layout(raw_client, thread.keys, config)
    assert list(thread.iter()) == stored
    assert thread.list(limit=3, order="desc").messages == stored[::-1][:3]
    newest = thread.list(limit=21, order="desc").messages
    assert newest == stored[::-1][:21] and newest[-1] == big
    assert thread.get(big.id) == big


def test_message_over_max_message_bytes_is_refused_before_the_socket(namespace):
    from kvstore import MessageStore

    store = MessageStore.from_url(
        "redis://127.0.0.1:1/0", StoreConfig(namespace=namespace, max_message_bytes=4096)
    )
    thread = store.thread("t")
    with pytest.raises(errors.MessageTooLarge, match="max_message_bytes is 4096"):
        thread.append(UserMessage(content="x" * 5000))
    with pytest.raises(errors.InvalidCursor):
        thread.list(limit=0)
    with pytest.raises(errors.InvalidCursor):
        thread.list(limit=1001)
    with pytest.raises(errors.InvalidThreadId):
        store.thread("bad{id}")
    with pytest.raises(errors.BatchTooLarge):
        thread.append([UserMessage(content="x")] * 501)


@pytest.mark.parametrize("bad", ["", "a{b", "a}b", "a b", "a*b", "a\nb", "é", "x" * 201, "-lead"])
def test_thread_ids_that_could_escape_their_tag_are_refused(bad):
    with pytest.raises(errors.InvalidThreadId):
        ThreadKeys.of("kv", bad)


@pytest.mark.parametrize("bad", [["chat"], {"chat": 1}, {"chat"}, 7, b"chat", None])
def test_a_thread_id_that_is_not_a_str_is_refused_typed(make_thread, bad):
    """Whatever the value (one a dict cannot hold too): InvalidThreadId before anything is sent."""
    thread = make_thread()
    thread.append(UserMessage(content="x"))
    with pytest.raises(errors.InvalidThreadId):
        thread._store.thread(bad)
    with pytest.raises(errors.InvalidThreadId):
        thread.fork(bad, at=1)


def test_every_key_of_a_thread_shares_one_hash_tag():
    keys = ThreadKeys.of("kv", "user:42/session.7")
    for key in (*keys.fixed(), keys.chunk(12345)):
        assert key.startswith("kv:{user:42/session.7}:")


def test_pages_cross_window_and_chunks_exactly(make_thread, backend, mode):
    thread = make_thread(**SMALL)
    rng = random.Random(11)
    stored = []
    for step in range(40):
        size = rng.choice([20, 500, 900, 3000])  # 3000 bytes are oversized here
        stored += thread.append(
            [UserMessage(content=text(size, str(step))) for _ in range(rng.randint(1, 4))]
        )
    by_seq = {m.seq_id: m for m in stored}
    sequences = sorted(by_seq)
    anchors = {1, 2, len(sequences) // 2, sequences[-1], sequences[-1] - 1, 0, sequences[-1] + 5}
    anchors |= set(rng.sample(sequences, 6))
    limits = [1, 2, 5, 17, 200] if backend != "fakeredis" else [1, 5, 200]
    for limit in limits:
        for order in ("asc", "desc"):
            cases = [(None, None)] + [(a, None) for a in anchors] + [(None, b) for b in anchors]
            cases += [
                (min(a, b), max(a, b)) if order == "asc" else (max(a, b), min(a, b))
                for a, b in zip(sorted(anchors), sorted(anchors)[3:], strict=False)
            ]
            for after, before in cases:
                page = thread.list(after=after, before=before, limit=limit, order=order)
                want, more = model.page(sequences, after, before, limit, order)
                assert [m.seq_id for m in page.messages] == want, (limit, order, after, before)
                assert page.has_more == more, (limit, order, after, before)
                assert page.messages == [by_seq[s] for s in want]
    # Cursors by message id behave as cursors by sequence.
    middle = stored[len(stored) // 2]
    assert (
        thread.list(after=middle.id, limit=7).messages
        == thread.list(after=middle.seq_id, limit=7).messages
    )
    assert (
        thread.list(before=middle.id, limit=7, order="desc").messages
        == thread.list(before=middle.seq_id, limit=7, order="desc").messages
    )


def test_chunk_edges_as_anchors(make_thread, raw_client):
    thread = make_thread(window_size=16, chunk_size=8, chunk_max_bytes=1 << 20)
    stored = []
    for i in range(10):
        stored += thread.append([UserMessage(content=f"m{i}.{j}") for j in range(10)])
    layout = read_layout(raw_client, thread.keys)
    edges = set()
    for first, fields in layout.chunks.items():
        edges |= {first - 1, first, max(fields), max(fields) + 1}
    newest = layout.window or layout.open  # layout 3: the open chunk
    edges |= {min(newest) - 1, min(newest)}
    sequences = [m.seq_id for m in stored]
    for anchor in sorted(edges):
        for limit in (1, 8, 9, 50):
            for order in ("asc", "desc"):
                for kwargs in ({"after": anchor}, {"before": anchor}):
                    page = thread.list(limit=limit, order=order, **kwargs)
                    want, more = model.page(
                        sequences, kwargs.get("after"), kwargs.get("before"), limit, order
                    )
                    assert [m.seq_id for m in page.messages] == want
                    assert page.has_more == more


def test_snapshot_returns_the_newest_200(make_thread):
    thread = make_thread(window_size=16, chunk_size=8)
    stored = []
    for i in range(26):
        stored += thread.append([UserMessage(content=f"m{i}.{j}") for j in range(10)])
    snapshot = thread.snapshot()
    assert snapshot.messages == stored[-200:]
    assert snapshot.stats.stored_messages == 260
    assert snapshot.stats.next_sequence == 261
    assert snapshot.stats.layout_version == 3


def test_stats_count_window_and_chunks(make_thread, raw_client):
    thread = make_thread(**SMALL)
    stored = thread.append([UserMessage(content=f"m{i}") for i in range(30)])
    stats = thread.stats()
    layout = read_layout(raw_client, thread.keys)
    assert stats.stored_messages == 30
    # Layout 3's open chunk counts as its window.
    assert stats.window_messages == len(layout.window) + len(layout.open)
    assert stats.chunks == len(layout.chunks) + len(layout.large)
    assert stats.stored_bytes == sum(
        len(r) for r in [*layout.window.values(), *layout.open.values()]
    ) + sum(len(r) for f in layout.chunks.values() for r in f.values())
    assert stats.deleted_before_sequence is None
    assert [m.seq_id for m in stored] == list(range(1, 31))


def test_otid_semantics(make_thread, raw_client):
    thread = make_thread()
    first = thread.append(
        [UserMessage(content="a", otid="o1"), UserMessage(content="b", otid="o2")]
    )
    # Every otid stored: the stored messages come back and nothing is written.
    replay = thread.append(
        [UserMessage(content="a again", otid="o1"), UserMessage(content="b again", otid="o2")]
    )
    assert replay == first
    assert thread.stats().stored_messages == 2
    # A mix is refused and writes nothing.
    before = {k: raw_client.dump(k) for k in thread.keys.fixed() if raw_client.exists(k)}
    with pytest.raises(errors.OtidConflict) as mix:
        thread.append([UserMessage(content="c", otid="o2"), UserMessage(content="d", otid="o3")])
    assert not isinstance(mix.value, errors.OtidRepeated)
    # A repeat inside the batch is told apart: no state of the thread makes that batch valid.
    with pytest.raises(errors.OtidRepeated, match="appears twice"):
        thread.append([UserMessage(content="c", otid="o9"), UserMessage(content="d", otid="o9")])
    after = {k: raw_client.dump(k) for k in thread.keys.fixed() if raw_client.exists(k)}
    assert before == after
    # None stored: appended.
    new = thread.append([UserMessage(content="e", otid="o4")])
    assert new[0].seq_id == 3
    # Stored otids beside a message without one: a replay of the same call (same ids) returns
    # what it stored; new messages beside stored otids are a mix, refused.
    batch = [UserMessage(content="f", otid="o5"), UserMessage(content="g")]
    stored = thread.append(batch)
    assert thread.append([m.model_copy(update={"seq_id": None}) for m in stored]) == stored
    with pytest.raises(errors.OtidConflict, match="other messages are new"):
        thread.append([UserMessage(content="f", otid="o5"), UserMessage(content="h")])
    assert thread.stats().stored_messages == 5


def test_a_retried_call_stores_nothing_twice(make_thread):
    """redis-py re-sends a timed-out command as is: the same ids make the second run a replay."""
    from kvstore._engine import core as _core
    from kvstore._engine.executor import send_request

    thread = make_thread()
    inner = getattr(thread, "_thread", thread)
    operation = _core.append(inner._ref, [UserMessage(content="x"), UserMessage(content="y")], None)
    request = next(operation)

    def execute():
        result = send_request(inner._store, request)
        return thread._loop.run_until_complete(result) if hasattr(result, "__await__") else result

    assert [int(x) for x in execute()] == [1, 1]
    ids = [m.id.encode() for m in request_messages(request)]
    assert execute() == [0, 1, ids[0], 2, ids[1]]  # a replay: each stored sequence and id
    assert thread.stats().stored_messages == 2


def request_messages(request):
    """The messages an append request carries, as holders of their ids."""

    class Sent:
        def __init__(self, message_id):
            self.id = message_id

    return [Sent(row[0]) for row in request.named()["messages"]]


def test_duplicate_message_ids_are_refused(make_thread):
    thread = make_thread()
    thread.append(UserMessage(id="message-fixed", content="a"))
    with pytest.raises(errors.DuplicateMessageId) as mix:
        thread.append([UserMessage(id="message-fixed", content="a"), UserMessage(content="b")])
    assert not isinstance(mix.value, errors.MessageIdRepeated)
    with pytest.raises(errors.MessageIdRepeated, match="appears twice"):
        thread.append(
            [UserMessage(id="message-new", content="a"), UserMessage(id="message-new", content="b")]
        )
    assert thread.stats().stored_messages == 1


def test_turn_reply_count(make_thread):
    thread = make_thread(**SMALL)
    thread.append(UserMessage(content="question"), turn_id="turn-1")
    start = thread.start_turn("turn-1")
    assert start == 2
    thread.append([AssistantMessage(content=f"r{i}") for i in range(5)], turn_id="turn-1")
    thread.append(UserMessage(content="unrelated"))
    thread.append(AssistantMessage(content="last"), turn_id="turn-1")
    result = thread.finish_turn("turn-1")
    assert (result.reply_count, result.first_sequence, result.last_sequence) == (6, 2, 8)
    assert [m.seq_id for m in thread.list(turn_id="turn-1").messages] == [1, 2, 3, 4, 5, 6, 8]
    assert [m.seq_id for m in thread.list(turn_id="turn-1", order="desc", limit=2).messages] == [
        8,
        6,
    ]


def test_turn_reply_count_falls_back_when_another_turn_started(make_thread):
    thread = make_thread()
    thread.start_turn("a")
    thread.append([AssistantMessage(content="a1"), AssistantMessage(content="a2")], turn_id="a")
    thread.start_turn("b")
    thread.append(AssistantMessage(content="b1"), turn_id="b")
    thread.append(AssistantMessage(content="a3"), turn_id="a")
    late = thread.finish_turn("a", outcome="cancelled")
    assert (late.reply_count, late.first_sequence, late.last_sequence) == (3, 1, 4)
    assert thread.finish_turn("b").reply_count == 1
    with pytest.raises(errors.TurnNotFound):
        thread.finish_turn("never")
    assert thread.snapshot().turn.turn_id == "b"


@pytest.mark.parametrize(
    "part",
    [
        "meta",
        "window_side",
        "chunk_index",
        "large_index",
        "ids",
        "otids",
        "turns",
        "open_data",
        "open_manifest",
    ],
)
def test_wrong_type_key_is_refused_and_nothing_changes(make_thread, raw_client, part):
    thread = make_thread(**SMALL)
    thread.append([UserMessage(content=f"m{i}") for i in range(20)])
    key = getattr(thread.keys, part)
    raw_client.delete(key)
    if part.startswith("open_"):  # strings themselves: a hash is another type there
        raw_client.hset(key, "planted", "1")
    else:
        raw_client.set(key, "planted")
    before = {k: raw_client.dump(k) for k in thread.keys.fixed()}
    # Enough messages to cut a chunk, with an otid, a turn and an oversized one: every key is
    # written, so every key is checked (a write checks the keys it writes, before writing).
    batch = [UserMessage(content=f"b{i}", otid=f"o{i}") for i in range(6)] + [
        UserMessage(content="B" * 5000)
    ]
    with pytest.raises(errors.LayoutError, match=re.escape(key)):
        thread.append(batch, turn_id="t")
    assert before == {k: raw_client.dump(k) for k in thread.keys.fixed()}


def test_a_window_of_another_type_fails_reads_typed_and_writes_leave_it(make_thread, raw_client):
    # Layout 3 writes no window (only a thread from layout 2 has one, until it drains): a write
    # leaves a foreign key there alone, and a read that looks for a window names it.
    thread = make_thread(**SMALL)
    thread.append([UserMessage(content=f"m{i}") for i in range(20)])
    raw_client.set(thread.keys.window, "planted")
    thread.append(UserMessage(content="after"))
    assert raw_client.get(thread.keys.window) == b"planted"
    with pytest.raises(errors.LayoutError):
        thread.list(limit=5, order="desc")


@pytest.mark.parametrize(
    ("scripting", "flush"), [("eval", "script_flush"), ("functions", "function_flush")]
)
def test_script_flush_is_transparent(make_thread, raw_client, server_only, scripting, flush):
    thread = make_thread(scripting=scripting)
    thread.append(UserMessage(content="a"))
    getattr(raw_client, flush)()
    thread.append(UserMessage(content="b"))
    getattr(raw_client, flush)()
    assert [m.content for m in thread.list().messages] == ["a", "b"]


def test_delete_removes_every_key(make_thread, raw_client, namespace):
    thread = make_thread(**SMALL)
    thread.append([UserMessage(content="x" * 600) for _ in range(40)])
    thread.append(UserMessage(content="y" * 5000))
    assert raw_client.keys(f"{namespace}:*")
    thread.delete()
    assert raw_client.keys(f"{namespace}:*") == []
    assert thread.list().messages == []
