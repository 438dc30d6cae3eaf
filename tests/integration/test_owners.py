"""Threads that belong to an owner (docs/OWNERS.md), sync and async, on each server: the listing
by activity and by creation, titles and metadata, counts that follow every write, quotas
refused before any write, and the erasure (nothing of the owner left, by a keyspace scan)."""

from __future__ import annotations

import time

import pytest

from kvstore import AssistantMessage, UserMessage, errors
from kvstore._engine.layout.keys import OwnerKeys

from ..support.owners import early_in_a_minute, keyspace, listed, owner_keys, stores


@pytest.fixture
def make_store(backend, mode, namespace):
    yield from stores(backend, mode, namespace)


def test_listing_follows_activity_and_creation(make_store):
    store = make_store()
    for i in range(5):
        store.thread(f"chat-{i}", owner="ann").append(UserMessage(content=f"hello {i}"))
        time.sleep(0.003)  # distinct milliseconds, so the order is the writes' order
    assert listed(store, "ann") == [f"chat-{i}" for i in (4, 3, 2, 1, 0)]
    store.thread("chat-1", owner="ann").append(AssistantMessage(content="back"))
    assert listed(store, "ann") == [f"chat-{i}" for i in (1, 4, 3, 2, 0)]
    assert listed(store, "ann", order="created") == [f"chat-{i}" for i in (4, 3, 2, 1, 0)]
    # A write that stores nothing (a replay) is no activity.
    store.thread("chat-0", owner="ann").append(UserMessage(content="x", otid="o-1"))
    time.sleep(0.003)
    store.thread("chat-2", owner="ann").append(UserMessage(content="y"))
    store.thread("chat-0", owner="ann").append(UserMessage(content="x", otid="o-1"))
    assert listed(store, "ann")[:2] == ["chat-2", "chat-0"]
    # Another owner, and the same id without an owner, are other threads.
    store.thread("chat-1", owner="bob").append(UserMessage(content="bob's"))
    store.thread("chat-1").append(UserMessage(content="nobody's"))
    assert listed(store, "bob") == ["chat-1"]
    assert store.thread("chat-1", owner="ann").stats().stored_messages == 2
    assert store.thread("chat-1").stats().stored_messages == 1


def test_a_thread_moving_while_paging_is_never_listed_twice(make_store):
    store = make_store()
    for i in range(6):
        store.thread(f"c{i}", owner="ann").append(UserMessage(content="m"))
        time.sleep(0.003)
    first = store.threads("ann", limit=3)
    assert [t.thread_id for t in first.threads] == ["c5", "c4", "c3"]
    store.thread("c1", owner="ann").append(UserMessage(content="moves up"))
    store.thread("c4", owner="ann").append(UserMessage(content="moves up too"))
    rest = listed_after(store, "ann", first.next_cursor)
    seen = [t.thread_id for t in first.threads] + rest
    assert len(seen) == len(set(seen))
    assert rest == ["c2", "c0"]  # c1 moved above the cursor: the next listing has it first
    assert [t.thread_id for t in store.threads("ann", limit=2).threads] == ["c4", "c1"]


def listed_after(store, owner: str, cursor: str) -> list[str]:
    ids = []
    while cursor:
        page = store.threads(owner, limit=2, after=cursor)
        ids += [t.thread_id for t in page.threads]
        cursor = page.next_cursor
    return ids


@pytest.mark.parametrize("order", ["recent", "created"])
def test_a_page_ending_the_listing_in_its_cursors_own_score_has_no_cursor(
    make_store, raw_client, namespace, order
):
    """Threads written in the same millisecond share a score: a page filled among the cursor's
    ties, whose last thread is the index's last, ends the listing as any last page does."""
    store = make_store()
    ids = [f"t{i}" for i in range(4)]
    for thread_id in ids:
        store.thread(thread_id, owner="ann").append(UserMessage(content="x"))
    index = getattr(OwnerKeys.of(namespace, "ann"), order)
    raw_client.zadd(index, {thread_id: 1_800_000_000_000 for thread_id in ids}, xx=True)
    first = store.threads("ann", order=order, limit=2)
    second = store.threads("ann", order=order, after=first.next_cursor, limit=2)
    assert [t.thread_id for t in first.threads + second.threads] == ["t3", "t2", "t1", "t0"]
    assert first.next_cursor is not None and second.next_cursor is None
    # One thread below the tie: the page filled in the tie goes on to it.
    store.thread("t9", owner="ann").append(UserMessage(content="x"))
    raw_client.zadd(index, {"t9": 1_700_000_000_000}, xx=True)
    second = store.threads("ann", order=order, after=first.next_cursor, limit=2)
    assert second.next_cursor is not None
    third = store.threads("ann", order=order, after=second.next_cursor, limit=2)
    assert [t.thread_id for t in third.threads] == ["t9"] and third.next_cursor is None


@pytest.mark.parametrize("order", ["recent", "created"])
@pytest.mark.parametrize("limit", [16, 20])
def test_a_page_filled_by_the_last_thread_of_a_full_batch_has_no_cursor(
    make_store, raw_client, namespace, order, limit
):
    """The script reads the index in batches of the page's size (at least 16): a page filled by
    the last thread of a whole batch ends the listing only when nothing follows that batch,
    after the cursor's own score (ties) and below it."""
    store = make_store()
    ids = [f"t{i:02d}" for i in range(2 * limit)]
    for thread_id in ids[:limit]:
        store.thread(thread_id, owner="ann").set_info(title=thread_id)
    only = store.threads("ann", order=order, limit=limit)
    assert len(only.threads) == limit and only.next_cursor is None
    for thread_id in ids[limit:]:
        store.thread(thread_id, owner="ann").set_info(title=thread_id)
    for tied in (False, True):
        if tied:  # every thread in one millisecond: the second page reads the cursor's score
            index = getattr(OwnerKeys.of(namespace, "ann"), order)
            raw_client.zadd(index, dict.fromkeys(ids, 1_800_000_000_000), xx=True)
        first = store.threads("ann", order=order, limit=limit)
        second = store.threads("ann", order=order, after=first.next_cursor, limit=limit)
        pages = [t.thread_id for t in first.threads + second.threads]
        assert sorted(pages) == ids and len(set(pages)) == len(ids)
        assert first.next_cursor is not None and second.next_cursor is None, tied


def test_a_streamed_reply_and_a_takeover_are_activity(make_store):
    """docs/OWNERS.md, "What moves the directory": a chat a reply streams into (publish) or a
    worker takes over stays at the top; set_info does not move it."""
    store = make_store()
    chat = store.thread("chat", owner="ann")
    chat.append(UserMessage(content="hi"))
    lease = chat.hold_turn("turn-1")
    for step in ("publish", "takeover", "title"):
        time.sleep(0.003)
        store.thread("other", owner="ann").append(UserMessage(content="now me"))
        before = chat.info().last_activity_at
        time.sleep(0.003)
        if step == "publish":
            chat.publish(lease, "Hel")
        elif step == "takeover":
            lease = chat.hold_turn("turn-1")
        else:
            chat.set_info(title="Hello")
        moved = chat.info().last_activity_at > before
        assert moved == (step != "title"), step
        assert listed(store, "ann")[0] == ("chat" if moved else "other"), step


def test_titles_and_metadata(make_store, raw_client, namespace):
    store = make_store()
    chat = store.thread("chat", owner="ann")
    assert chat.info() is None
    assert chat.set_info(title="Weather", metadata={"model": "small", "topic": "oslo"}) is True
    info = chat.info()
    assert (info.title, info.metadata, info.messages) == (
        "Weather",
        {"model": "small", "topic": "oslo"},
        0,
    )
    assert listed(store, "ann") == ["chat"]  # listed before its first message
    chat.append(UserMessage(content="and tomorrow?"))
    assert chat.set_info(title="Weather in Oslo") is False
    info = chat.info()
    assert (info.title, info.metadata["topic"], info.messages) == ("Weather in Oslo", "oslo", 1)
    other = store.thread("other", owner="ann")
    other.set_info(metadata={"model": "large"})
    assert listed(store, "ann", where={"model": "large"}) == ["other"]
    assert listed(store, "ann", where={"model": "small"}) == ["chat"]
    assert listed(store, "ann", where={"absent": "x"}) == []
    chat.set_info(title="", metadata={})
    assert (chat.info().title, chat.info().metadata) == (None, {})
    # Bad input: typed, and nothing written.
    before = keyspace(raw_client, namespace)
    for title, metadata in (
        ("x" * 201, None),
        (None, {f"k{i}": "v" for i in range(17)}),
        (None, {"k": 1}),
        (None, {"": "v"}),
        (None, {"k": "v" * 513}),
        (7, None),
    ):
        with pytest.raises(errors.InvalidMessage):
            chat.set_info(title=title, metadata=metadata)
    with pytest.raises(errors.InvalidMessage):
        store.thread("plain").set_info(title="no owner")
    with pytest.raises(errors.InvalidOwnerId):
        store.thread("chat", owner="bad owner")
    with pytest.raises(errors.InvalidOwnerId):
        store.threads("{ann}")
    with pytest.raises(errors.InvalidCursor):
        store.threads("ann", after="created:1:chat")  # a cursor of the other order
    assert keyspace(raw_client, namespace) == before


def test_stats_and_snapshot_carry_the_directory_entry(make_store):
    """stats() and snapshot() read an owned thread's title, metadata and times in the round trip
    that reads its counts; a thread without an owner, or not listed, has none."""
    store = make_store()
    chat = store.thread("chat", owner="ann")
    stats = chat.stats()
    assert (stats.owner, stats.title, stats.metadata, stats.created_at) == ("ann", None, {}, None)
    chat.set_info(title="Weather", metadata={"model": "small"})
    chat.append(UserMessage(content="and tomorrow?"))
    first = chat.stats()
    info = chat.info()
    assert (first.owner, first.title, first.metadata) == ("ann", "Weather", {"model": "small"})
    assert (first.created_at, first.last_activity_at) == (info.created_at, info.last_activity_at)
    assert first.created_at <= first.last_activity_at and first.stored_messages == 1
    time.sleep(0.005)
    chat.append(AssistantMessage(content="sunny"))
    snapshot = chat.snapshot()
    assert snapshot.stats.title == "Weather" and snapshot.stats.stored_messages == 2
    assert snapshot.stats.created_at == first.created_at
    assert snapshot.stats.last_activity_at > first.last_activity_at
    plain = store.thread("chat")
    plain.append(UserMessage(content="no owner"))
    for unowned in (plain.stats(), plain.snapshot().stats):
        assert (unowned.owner, unowned.title, unowned.created_at) == (None, None, None)
    chat.delete()
    gone = chat.stats()
    assert (gone.owner, gone.title, gone.last_activity_at, gone.stored_messages) == (
        "ann",
        None,
        None,
        0,
    )


def test_a_malformed_directory_entry_is_a_record_error(make_store, raw_client, namespace):
    """The listing reads what the directory holds straight when it is what the scripts write,
    and names anything else: counts that are not numbers, info that is not the JSON object,
    a score with a fraction (read as its whole ms)."""
    store = make_store()
    store.thread("a", owner="ann").append(UserMessage(content="hi"))
    keys = OwnerKeys.of(namespace, "ann")
    raw_client.zadd(keys.recent, {"a": 1700000000000.5})
    (info,) = store.threads("ann").threads
    assert (info.thread_id, info.last_activity_at, info.messages) == ("a", 1700000000000, 1)
    record = raw_client.hget(keys.usage, "t:a")
    for field, key, value in (
        ("t:a", keys.usage, b"many:1:1:0:"),
        ("t:a", keys.usage, b"1:1"),
        ("a", keys.info, b"[1, 2]"),
        ("a", keys.info, b'{"title": 7}'),
    ):
        raw_client.hset(key, field, value)
        with pytest.raises(errors.RecordError):
            store.threads("ann")
        raw_client.hset(keys.usage, "t:a", record)
        raw_client.hdel(keys.info, "a")
    assert [t.thread_id for t in store.threads("ann").threads] == ["a"]


def test_counts_follow_every_write(make_store):
    store = make_store(chunk_size=4, window_size=4, retained_message_limit=6)
    chat = store.thread("chat", owner="ann")
    chat.start_turn("t1")
    chat.append([UserMessage(content=f"m{i} " + "x" * 50) for i in range(5)], turn_id="t1")
    chat.finish_turn("t1")
    stored = chat.append([AssistantMessage(content=f"a{i}") for i in range(6)])
    chat.replace(stored[0].id, AssistantMessage(content="longer " * 40))
    chat.compact("summary", last_sequence=stored[2].seq_id)
    chat.remove_turn("t1")
    other = store.thread("other", owner="ann")
    other.append(UserMessage(content="hi"))
    for thread in (chat, other):
        stats, info = thread.stats(), thread.info()
        assert (info.messages, info.stored_bytes, info.tokens) == (
            stats.stored_messages,
            stats.stored_bytes,
            stats.tokens,
        )
    usage = store.owner_usage("ann")
    infos = store.threads("ann").threads
    assert usage.threads == 2
    assert usage.messages == sum(i.messages for i in infos)
    assert usage.stored_bytes == sum(i.stored_bytes for i in infos)
    assert usage.tokens == sum(i.tokens for i in infos)
    fork = chat.fork("chat-fork", at=stored[-1].id)
    assert fork.owner == "ann" and fork.info().messages == fork.stats().stored_messages
    chat.delete()
    assert chat.info() is None
    assert sorted(listed(store, "ann")) == ["chat-fork", "other"]
    assert store.owner_usage("ann").messages == other.info().messages + fork.info().messages


def test_quotas_refuse_before_writing(make_store, raw_client, namespace):
    store = make_store()
    early_in_a_minute(raw_client)  # the rate's window is the server's minute
    usage = store.set_owner_quota("ann", threads=2, stored_bytes=2_000, messages_per_minute=8)
    assert (usage.max_threads, usage.max_bytes, usage.max_messages_per_minute) == (2, 2_000, 8)
    a, b, c = (store.thread(name, owner="ann") for name in "abc")
    a.append(UserMessage(content="one"))
    b.set_info(title="second")
    before = keyspace(raw_client, namespace)
    with pytest.raises(errors.QuotaExceeded) as refused:
        c.append(UserMessage(content="a third thread"))
    assert refused.value.http_status == 429
    with pytest.raises(errors.QuotaExceeded):
        c.set_info(title="a third thread")
    with pytest.raises(errors.StorageQuotaExceeded) as too_big:
        a.append(UserMessage(content="x" * 2_100))
    assert too_big.value.http_status == 413
    assert keyspace(raw_client, namespace) == before
    a.append([UserMessage(content=f"r{i}") for i in range(7)])  # 8 this minute: at the quota
    with pytest.raises(errors.QuotaExceeded, match="a minute"):
        b.append(UserMessage(content="the ninth"))
    store.set_owner_quota("ann", threads=3)  # the others removed: None is no quota
    c.append([UserMessage(content=f"c{i}") for i in range(20)])
    usage = store.owner_usage("ann")
    assert (usage.threads, usage.messages) == (3, 28)
    assert (usage.max_bytes, usage.max_messages_per_minute) == (None, None)
    with pytest.raises(errors.ConfigError):
        store.set_owner_quota("ann", threads=0)


def test_erasure_leaves_nothing_of_the_owner(make_store, raw_client, namespace):
    store = make_store(chunk_size=4, window_size=4)
    messages = 0
    for i in range(20):
        thread = store.thread(f"chat-{i}", owner="ann")
        count = 1 + i % 7
        thread.append([UserMessage(content=f"m{j} " + "x" * 300) for j in range(count)])
        messages += count
    store.thread("titled", owner="ann").set_info(title="no message yet")
    keep = store.thread("chat-1", owner="bob")
    keep.append(UserMessage(content="bob stays"))
    store.thread("chat-1").append(UserMessage(content="no owner stays"))
    receipt = store.erase_owner("ann")
    assert (receipt.threads, receipt.messages) == (21, messages)
    assert owner_keys(raw_client, namespace, "ann") == []
    assert store.threads("ann").threads == []
    assert store.owner_usage("ann").threads == 0
    assert keep.stats().stored_messages == 1
    assert store.thread("chat-1").stats().stored_messages == 1
    again = store.erase_owner("ann")
    assert (again.threads, again.messages) == (0, 0)
    store.thread("chat-0", owner="ann").append(UserMessage(content="a new life"))
    assert listed(store, "ann") == ["chat-0"]
