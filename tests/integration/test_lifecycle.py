"""Compaction and retention, bounded state, the inline media budget, replace, remove_turn, TTL."""

from __future__ import annotations

import base64
import multiprocessing
import time

import pytest

from kvstore import AssistantMessage, MessageStore, StoreConfig, SummaryMessage, UserMessage, errors
from kvstore.messages import ImageContent, TextContent, inline_media_bytes

from ..support.layout_check import check_layout, read_layout, to_hash_chunk

SMALL = dict(window_size=8, chunk_size=4, chunk_max_bytes=4096)
MiB = 1024 * 1024


def fill(thread, count: int, size: int = 200, turn_prefix: str | None = None):
    stored = []
    for i in range(count):
        turn = f"{turn_prefix}{i // 2}" if turn_prefix else None
        stored += thread.append(UserMessage(content=f"m{i} " + "x" * size), turn_id=turn)
    return stored


# ------------------------------------------------------------------------------- retention


def test_nothing_is_deleted_without_a_summary(make_thread, raw_client, namespace):
    thread = make_thread(retained_message_limit=10, **SMALL)
    stored = fill(thread, 80)
    layout = check_layout(
        raw_client,
        thread.keys,
        StoreConfig(namespace=namespace, retained_message_limit=10, **SMALL),
    )
    assert layout.all_sequences() == [m.seq_id for m in stored]
    assert thread.stats().deleted_before_sequence is None
    assert thread.context() == stored


def test_retention_deletes_only_what_the_summary_covers_and_keeps_the_limit(
    make_thread, raw_client, namespace
):
    config = StoreConfig(namespace=namespace, retained_message_limit=20, **SMALL)
    thread = make_thread(retained_message_limit=20, **SMALL)
    stored = fill(thread, 100)
    summary = thread.compact("the first sixty messages", last_sequence=60)
    assert isinstance(summary, SummaryMessage) and summary.seq_id == 101
    layout = check_layout(raw_client, thread.keys, config)
    kept = layout.all_sequences()
    deleted = sorted(set(range(1, 102)) - set(kept))
    assert deleted, "retention deleted nothing"
    assert max(deleted) <= 60  # only what the summary covers
    assert deleted == list(range(1, deleted[-1] + 1))  # oldest first, no holes
    assert len(kept) >= 20
    # The next chunk is not deletable: it reaches past the summary, or deleting it would keep
    # fewer than the limit.
    first = min(layout.chunks)
    last = max(layout.chunks[first])
    assert last > 60 or len(kept) - len(layout.chunks[first]) < 20
    stats = thread.stats()
    assert stats.deleted_before_sequence == deleted[-1] + 1 == min(kept)
    assert stats.summary_last_sequence == 60
    # Pages carry deleted_before_sequence; a cursor below it pages from the oldest kept message.
    page = thread.list(limit=5)
    assert page.deleted_before_sequence == min(kept)
    assert [m.seq_id for m in page.messages] == kept[:5]
    assert [m.seq_id for m in thread.list(after=1, limit=3).messages] == kept[:3]
    assert thread.list(limit=3, order="desc").deleted_before_sequence == min(kept)
    # Deleted messages are gone everywhere, and their ids with them.
    with pytest.raises(errors.MessageNotFound):
        thread.get(stored[0].id)
    assert raw_client.hget(thread.keys.ids, stored[0].id) is None
    # The model input is the summary and everything after its last sequence, in order.
    context = thread.context()
    assert context[0] == summary
    assert [m.seq_id for m in context[1:]] == list(range(61, 101))
    assert thread.snapshot().summary == summary


def test_retention_keeps_everything_when_the_limit_is_none(make_thread):
    thread = make_thread(retained_message_limit=None, **SMALL)
    fill(thread, 60)
    thread.compact("all", last_sequence=60)
    assert thread.stats().stored_messages == 61
    assert thread.stats().deleted_before_sequence is None


def test_summaries_only_move_forward(make_thread):
    thread = make_thread(**SMALL)
    fill(thread, 10)
    thread.compact("s1", last_sequence=8)
    with pytest.raises(errors.InvalidSummaryRange, match="before the current summary"):
        thread.compact("s0", last_sequence=5)
    with pytest.raises(errors.InvalidSummaryRange, match="not a stored sequence"):
        thread.compact("s2", last_sequence=500)


def test_context_warns_when_messages_were_deleted_without_a_summary(
    make_thread, raw_client, caplog
):
    thread = make_thread()
    fill(thread, 3)
    raw_client.hset(thread.keys.meta, "deleted_before", 2)
    with caplog.at_level("WARNING", logger="kvstore"):
        thread.context()
    assert "no summary" in caplog.text


def test_bounded_state_over_2000_turns(make_thread, raw_client, namespace, server_only):
    """User + assistant message per turn, compaction every 10 turns, retained limit 100."""
    limit, window, chunk = 100, 64, 32
    thread = make_thread(retained_message_limit=limit, window_size=window, chunk_size=chunk)
    samples = {}
    total_bytes = 0
    for turn in range(1, 2001):
        turn_id = f"turn-{turn}"
        user = thread.append(
            UserMessage(content=f"question {turn} " + "q" * 500, otid=f"u{turn}"), turn_id=turn_id
        )
        thread.start_turn(turn_id)
        reply = thread.append(
            AssistantMessage(content=f"answer {turn} " + "a" * 900, otid=f"a{turn}"),
            turn_id=turn_id,
        )
        thread.finish_turn(turn_id)
        total_bytes += len(user[0].to_json()) + len(reply[0].to_json())
        if turn % 10 == 0:
            thread.compact(f"summary up to turn {turn}", last_sequence=reply[0].seq_id)
        if turn in (500, 1000, 1500, 2000):
            keys = list(raw_client.scan_iter(match=f"{namespace}:*", count=1000))
            memory = sum(raw_client.memory_usage(k, samples=0) for k in keys)
            stats = thread.stats()
            samples[turn] = (memory, stats.stored_messages)
    # stored messages <= limit + window + one chunk (+ the summaries, which are messages too)
    bound = limit + window + chunk
    for turn, (_memory, stored) in samples.items():
        assert stored <= bound, (turn, stored, bound)
    per_message = [memory / stored for memory, stored in samples.values()]
    mean = sum(per_message) / len(per_message)
    assert all(abs(p - mean) <= 0.10 * mean for p in per_message), per_message
    memories = [memory for memory, _ in samples.values()]
    assert memories[-1] <= max(memories[:2]) * 1.10, memories  # no upward trend
    assert raw_client.hlen(thread.keys.turns) <= bound  # turn records are trimmed too
    assert total_bytes > 3_000_000
    print(
        f"\nbounded state: {[(t, m, s) for t, (m, s) in samples.items()]} total stored {total_bytes} bytes"
    )
    check_layout(
        raw_client, thread.keys, StoreConfig(namespace=namespace, retained_message_limit=limit)
    )


# ------------------------------------------------------------------------------------ media


def image(decoded_bytes: int, fill_byte: bytes = b"\x89") -> ImageContent:
    data = base64.b64encode(fill_byte * decoded_bytes).decode()
    return ImageContent(source={"type": "base64", "data": data, "media_type": "image/png"})


def test_seven_3_mib_images_all_append_and_the_thread_stays_within_20_mib(
    make_thread, raw_client, namespace
):
    thread = make_thread(max_message_bytes=16 * MiB)
    results = []
    for i in range(7):
        results += thread.append(
            UserMessage(content=[TextContent(text=f"picture {i}"), image(3 * MiB)])
        )
    media = [inline_media_bytes(m) for m in results]
    assert media[:6] == [3 * MiB] * 6
    assert media[6] == 0
    assert "removed" in results[6].content[1].text and "image/png" in results[6].content[1].text
    assert thread.stats().media_bytes == 18 * MiB <= 20 * MiB
    # History is never changed, and the stored seventh message is the stripped one.
    assert thread.get(results[6].id) == results[6]
    assert inline_media_bytes(thread.get(results[0].id)) == 3 * MiB


def _image_worker(url: str, namespace: str, worker: int) -> None:
    thread = MessageStore.from_url(url, StoreConfig(namespace=namespace)).thread("media-race")
    for i in range(5):
        thread.append(UserMessage(content=[TextContent(text=f"w{worker} {i}"), image(3 * MiB)]))


def test_two_processes_racing_with_images_never_pass_the_budget(
    server, raw_client, namespace, server_only
):
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_image_worker, args=(server.url, namespace, w)) for w in range(2)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join(120)
        assert process.exitcode == 0
    thread = MessageStore.from_url(server.url, StoreConfig(namespace=namespace)).thread(
        "media-race"
    )
    messages = list(thread.iter())
    assert len(messages) == 10
    total = sum(inline_media_bytes(m) for m in messages)
    assert total == thread.stats().media_bytes == 18 * MiB
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace))


def test_an_image_over_the_part_limit_is_refused_before_the_socket(namespace):
    thread = MessageStore.from_url(
        "redis://127.0.0.1:1/0", StoreConfig(namespace=namespace)
    ).thread("t")
    with pytest.raises(errors.InlineMediaTooLarge, match="content"):
        thread.append(UserMessage(content=[image(6 * MiB)]))


# ---------------------------------------------------------------------------------- replace


def test_replace_in_the_open_chunk_a_chunk_and_an_oversized_chunk(
    make_thread, raw_client, namespace
):
    config = StoreConfig(namespace=namespace, **SMALL)
    thread = make_thread(**SMALL)
    stored = fill(thread, 20, size=100)
    stored += thread.append(UserMessage(content="B" * 6000))
    stored += fill(thread, 3, size=100)
    layout = read_layout(raw_client, thread.keys)
    in_chunk = stored[0]
    in_open = stored[-1]  # layout 2's window message: the open chunk's in layout 3
    oversized = stored[20]
    assert in_chunk.seq_id in layout.chunks[1] and in_open.seq_id in layout.open
    for original in (in_chunk, in_open, oversized):
        new = thread.replace(original.id, AssistantMessage(content=f"replaced {original.seq_id}"))
        assert (new.id, new.seq_id, new.message_type) == (
            original.id,
            original.seq_id,
            "assistant_message",
        )
        assert thread.get(original.id) == new
        check_layout(raw_client, thread.keys, config)
    assert [m.seq_id for m in thread.iter()] == [m.seq_id for m in stored]
    # An open-chunk message whose replacement is oversized moves into its own chunk.
    grown = thread.replace(stored[-2].id, UserMessage(content="G" * 6000))
    assert grown.seq_id in read_layout(raw_client, thread.keys).large
    check_layout(raw_client, thread.keys, config)
    # A chunk message may not grow its chunk past the cap.
    with pytest.raises(errors.MessageTooLarge, match="chunk_max_bytes"):
        thread.replace(stored[1].id, UserMessage(content="C" * 4000))
    with pytest.raises(errors.MessageNotFound):
        thread.replace("message-nope", UserMessage(content="x"))
    assert thread.stats().stored_messages == len(stored)


# ------------------------------------------------------------------------------ remove_turn


def test_remove_turn_retracts_its_messages_everywhere(make_thread, raw_client, namespace):
    config = StoreConfig(namespace=namespace, **SMALL)
    thread = make_thread(**SMALL)
    stored = []
    for turn in range(12):
        stored += thread.append(
            UserMessage(content=f"q{turn}", otid=f"q{turn}"), turn_id=f"t{turn}"
        )
        stored += thread.append(
            [AssistantMessage(content=f"a{turn}.{i}") for i in range(2)], turn_id=f"t{turn}"
        )
    stored += thread.append(UserMessage(content="B" * 5000), turn_id="t3")  # an oversized one
    assert thread.remove_turn("t3") == 4
    assert thread.remove_turn("t11") == 3  # in the open chunk
    assert thread.remove_turn("t11") == 0
    kept = [
        m
        for m in stored
        if m.content not in ("q3", "a3.0", "a3.1", "q11", "a11.0", "a11.1")
        and not str(m.content).startswith("B")
    ]
    assert list(thread.iter()) == kept
    assert thread.list(turn_id="t3").messages == []
    check_layout(raw_client, thread.keys, config)
    # The removed otids may be used again.
    assert thread.append(UserMessage(content="again", otid="q3"))[0].seq_id == stored[-1].seq_id + 1
    # Pages still cross the holes exactly.
    sequences = [m.seq_id for m in list(thread.iter())]
    for limit in (1, 3, 7):
        assert [m.seq_id for m in thread.list(after=5, limit=limit).messages] == [
            s for s in sequences if s > 5
        ][:limit]
        newer = [s for s in reversed(sequences) if s > 30]
        assert [
            m.seq_id for m in thread.list(before=30, limit=limit, order="desc").messages
        ] == newer[-limit:]


def test_finish_turn_failed_is_visible_to_readers(make_thread):
    thread = make_thread()
    thread.start_turn("t1")
    thread.append(AssistantMessage(content="partial"), turn_id="t1")
    result = thread.finish_turn("t1", outcome="failed")
    assert result.outcome == "failed" and result.reply_count == 1
    turn = thread.snapshot().turn
    assert (turn.turn_id, turn.outcome) == ("t1", "failed")


# -------------------------------------------------------------------------------------- TTL


def _expiry_times(client, namespace):
    return {k: client.pexpiretime(k) for k in client.scan_iter(match=f"{namespace}:*", count=1000)}


def test_thread_ttl_expires_every_key_together_and_writes_refresh_it(
    make_thread, raw_client, namespace
):
    thread = make_thread(thread_ttl=1, **SMALL)
    fill(thread, 30)
    thread.append(UserMessage(content="B" * 6000))
    thread.start_turn("t")
    times = _expiry_times(raw_client, namespace)
    assert len(times) > 9 and len(set(times.values())) == 1 and min(times.values()) > 0
    time.sleep(0.7)
    thread.append(UserMessage(content="keep alive"))
    refreshed = _expiry_times(raw_client, namespace)
    assert len(set(refreshed.values())) == 1
    assert next(iter(refreshed.values())) > next(iter(times.values()))
    time.sleep(1.0)
    assert raw_client.exists(*refreshed) == len(refreshed)  # still alive: the write refreshed it
    time.sleep(1.2)
    assert list(raw_client.scan_iter(match=f"{namespace}:*")) == []


# ----------------------------------------------------------------------------------- delete


def test_delete_in_bounded_steps(make_thread, raw_client, namespace, monkeypatch):
    from kvstore._engine import operation as _requests

    # Where the delete steps read it: core only re-exports it.
    monkeypatch.setattr(_requests, "DELETE_STEP", 3)
    thread = make_thread(**SMALL)
    fill(thread, 80)
    assert raw_client.zcard(thread.keys.chunk_index) > 3
    thread.delete()
    assert list(raw_client.scan_iter(match=f"{namespace}:*")) == []


def test_retention_around_oversized_messages_deletes_only_whole_prefixes(
    make_thread, raw_client, namespace
):
    """An oversized message lives in its own chunk, beside the window: retention takes it with
    the normal chunk whose range holds it, and never while an older message is still kept."""
    config = dict(window_size=4, chunk_size=3, chunk_max_bytes=1500, retained_message_limit=2)
    thread = make_thread(**config)
    sizes = [120, 120, 600, 5, 600, 5, 1700, 600, 5, 1700, 5, 5, 5, 5, 5, 5]
    for size in sizes:
        thread.append(UserMessage(content="x" * size))
    for last_sequence in (3, 7, 8, 12, 16):
        thread.compact(f"up to {last_sequence}", last_sequence=last_sequence)
        layout = check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **config))
        kept = layout.all_sequences()
        deleted_before = thread.stats().deleted_before_sequence or 1
        assert kept[0] >= deleted_before, (kept, deleted_before)
        assert set(range(deleted_before, kept[-1] + 1)) == set(kept), (kept, deleted_before)
        assert all(s <= last_sequence for s in range(1, deleted_before))
        assert [m.seq_id for m in thread.iter()] == kept


# ------------------------------------------------------------------ edits on layout 3's chunks


def test_replace_in_the_open_chunk_in_place_or_into_its_own_chunk(
    make_thread, raw_client, namespace
):
    config = StoreConfig(namespace=namespace, **SMALL)
    thread = make_thread(**SMALL)
    stored = fill(thread, 7, size=200)  # a chunk closed at 1..4, the open chunk 5..7
    layout = check_layout(raw_client, thread.keys, config)
    assert sorted(layout.open) == [5, 6, 7] and list(layout.chunks) == [1]
    # In place: the open chunk's record and its meta sums change, nothing moves; gen moves
    # (what a reader of the message gets changed).
    gen = int(raw_client.hget(thread.keys.meta, "gen"))
    thread.replace(stored[5].id, AssistantMessage(content="replaced 6"))
    layout = check_layout(raw_client, thread.keys, config)
    assert b"replaced 6" in layout.open[6] and sorted(layout.open) == [5, 6, 7]
    assert int(raw_client.hget(thread.keys.meta, "gen")) == gen + 1
    # Past chunk_max_bytes: its own chunk, as an oversized append.
    thread.replace(stored[6].id, UserMessage(content="G" * 6000))
    layout = check_layout(raw_client, thread.keys, config)
    assert sorted(layout.open) == [5, 6] and list(layout.large) == [7]
    # Within chunk_max_bytes but growing the open chunk past it: its own chunk too.
    thread.replace(stored[4].id, UserMessage(content="H" * 3900))
    layout = check_layout(raw_client, thread.keys, config)
    assert sorted(layout.open) == [6] and sorted(layout.large) == [5, 7]
    assert raw_client.hget(thread.keys.meta, "open_first") == b"6"
    # Alone in the open chunk, a message may outgrow the cap in place.
    thread.replace(stored[5].id, UserMessage(content="I" * 6000))
    layout = check_layout(raw_client, thread.keys, config)
    assert sorted(layout.open) == [6] and b"I" * 6000 in layout.open[6]
    # The chunks closed after it start at the open chunk's first sequence left (6, not 5,
    # which is an oversized chunk's now): no chunk key is written twice.
    stored += fill(thread, 9, size=200)
    layout = check_layout(raw_client, thread.keys, config)
    assert 6 in layout.chunks and layout.chunks[6].keys() == {6}
    assert layout.all_sequences() == [m.seq_id for m in stored]


def test_replace_in_closed_chunks_of_either_kind(make_thread, raw_client, namespace):
    config = StoreConfig(namespace=namespace, **SMALL)
    thread = make_thread(**SMALL)
    stored = fill(thread, 4, size=100)
    stored += thread.append(UserMessage(content="B" * 6000))  # an oversized chunk, 5
    stored += fill(thread, 8, size=100)
    layout = check_layout(raw_client, thread.keys, config)
    assert sorted(layout.chunks) == [1, 6] and list(layout.large) == [5]
    # A thread migrated from layout 2 keeps its chunks as hashes: edits write them back as such.
    to_hash_chunk(raw_client, thread.keys, 1)
    to_hash_chunk(raw_client, thread.keys, 5)
    for original in (stored[1], stored[4], stored[6]):
        thread.replace(original.id, AssistantMessage(content=f"replaced {original.seq_id}"))
        layout = check_layout(raw_client, thread.keys, config)
        record = {**layout.large, **layout.chunks[1], **layout.chunks[6]}[original.seq_id]
        assert f"replaced {original.seq_id}".encode() in record
    assert layout.hash_chunks == {1, 5}
    # A closed chunk's message may not grow its chunk past the cap, in either kind.
    for original in (stored[2], stored[7]):
        with pytest.raises(errors.MessageTooLarge, match="chunk_max_bytes"):
            thread.replace(original.id, UserMessage(content="C" * 4000))
    assert check_layout(raw_client, thread.keys, config).all_sequences() == list(range(1, 14))


def test_remove_turn_from_the_open_chunk_and_closed_chunks_of_either_kind(
    make_thread, raw_client, namespace
):
    config = StoreConfig(namespace=namespace, **SMALL)
    thread = make_thread(**SMALL)
    stored = fill(thread, 14, size=100, turn_prefix="t")  # turns t0..t6, two messages each
    stored += thread.append(UserMessage(content="B" * 5000), turn_id="t1")  # 15, oversized
    stored += fill(thread, 2, size=100, turn_prefix="u")  # 16, 17: turn u0
    layout = check_layout(raw_client, thread.keys, config)
    assert sorted(layout.chunks) == [1, 5, 9] and sorted(layout.open) == [13, 14, 16, 17]
    to_hash_chunk(raw_client, thread.keys, 1)
    to_hash_chunk(raw_client, thread.keys, 15)
    raw_client.hdel(thread.keys.meta, "tokens")  # as before counts existed: summed again
    assert thread.remove_turn("t1") == 3  # 3, 4 in a hash chunk, 15 oversized
    assert thread.remove_turn("t6") == 2  # 13, 14: the open chunk's first two
    layout = check_layout(raw_client, thread.keys, config)
    assert layout.hash_chunks == {1} and sorted(layout.chunks[1]) == [1, 2]
    assert sorted(layout.open) == [16, 17]
    assert raw_client.hget(thread.keys.meta, "open_first") == b"16"
    assert thread.remove_turn("u0") == 2  # the open chunk left empty: its keys go
    layout = check_layout(raw_client, thread.keys, config)
    assert not layout.open and not raw_client.exists(thread.keys.open_data)
    assert thread.remove_turn("t2") == 2  # 5, 6 of a closed chunk's strings
    layout = check_layout(raw_client, thread.keys, config)
    kept = [m.seq_id for m in stored if m.seq_id not in (3, 4, 5, 6, 13, 14, 15, 16, 17)]
    assert layout.all_sequences() == kept
    # The next appends start a new open chunk.
    stored = fill(thread, 3, size=100)
    layout = check_layout(raw_client, thread.keys, config)
    assert sorted(layout.open) == [18, 19, 20]


def test_retention_keeps_an_oversized_chunk_newer_than_an_open_chunk_message(
    make_thread, raw_client, namespace
):
    config = StoreConfig(namespace=namespace, retained_message_limit=0, **SMALL)
    thread = make_thread(retained_message_limit=0, **SMALL)
    stored = fill(thread, 2, size=100)  # the open chunk: 1, 2
    stored += thread.append(UserMessage(content="B" * 5000))  # 3, its own chunk
    stored += fill(thread, 1, size=100)  # 4 joins the open chunk
    thread.compact("the first three", last_sequence=3)
    layout = check_layout(raw_client, thread.keys, config)
    # The oversized chunk is the oldest chunk, but the open chunk holds older messages.
    assert list(layout.large) == [3] and sorted(layout.open)[:2] == [1, 2]
    assert thread.stats().deleted_before_sequence is None
