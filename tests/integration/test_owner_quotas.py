"""An owner's quotas on every write path, sync and async, on each server: a write that would pass
one is refused before it writes (the keyspace is what it was), and a retry of a stored append,
which writes nothing, is answered as the replay it is, at a quota's very edge too
(docs/OWNERS.md, "Quotas")."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, UserMessage, errors

from ..support.owners import early_in_a_minute, keyspace, stores, totals_match


@pytest.fixture
def make_store(backend, mode, namespace):
    yield from stores(backend, mode, namespace)


def refused_unchanged(raw_client, namespace, calls, expected):
    before = keyspace(raw_client, namespace)
    for call in calls:
        with pytest.raises(expected):
            call()
    assert keyspace(raw_client, namespace) == before


def test_a_retried_append_at_the_edge_of_a_quota_is_a_replay(make_store, raw_client, namespace):
    store = make_store()
    early_in_a_minute(raw_client)
    store.set_owner_quota("ann", messages_per_minute=3)
    chat = store.thread("chat", owner="ann")
    batch = [UserMessage(content=f"m{i}", otid=f"o{i}") for i in range(3)]
    first = chat.append(batch)
    usage = store.owner_usage("ann")
    before = keyspace(raw_client, namespace)
    again = chat.append(batch)  # the same ids: a retry after a lost reply
    assert again.replayed and [m.id for m in again] == [m.id for m in first]
    other_process = [UserMessage(content=f"m{i}", otid=f"o{i}") for i in range(3)]
    assert chat.append(other_process).replayed  # new ids, the same otids: a replay too
    assert keyspace(raw_client, namespace) == before
    assert store.owner_usage("ann") == usage
    with pytest.raises(errors.QuotaExceeded, match="a minute"):
        chat.append(UserMessage(content="a fourth"))
    # The byte quota: a replay brings no bytes.
    store.set_owner_quota("ann", stored_bytes=usage.stored_bytes, messages_per_minute=None)
    before = keyspace(raw_client, namespace)
    assert chat.append(batch).replayed
    with pytest.raises(errors.StorageQuotaExceeded):
        chat.append(UserMessage(content="more"))
    assert keyspace(raw_client, namespace) == before
    totals_match(store, "ann")


def test_the_thread_quota_refuses_every_write_that_makes_a_thread(
    make_store, raw_client, namespace
):
    store = make_store()
    store.set_owner_quota("ann", threads=1)
    chat = store.thread("chat", owner="ann")
    stored = chat.append([UserMessage(content=f"m{i}") for i in range(3)])
    new = [store.thread(f"new-{i}", owner="ann") for i in range(6)]
    calls = [
        lambda: new[0].append(UserMessage(content="hi")),
        lambda: new[1].set_info(title="a second chat"),
        lambda: new[2].start_turn("t1"),
        lambda: new[3].hold_turn("t1"),
        lambda: chat.fork("new-4", at=stored[-1].id),
        lambda: new[5].append([UserMessage(content=f"b{i}") for i in range(500)]),
    ]
    refused_unchanged(raw_client, namespace, calls, errors.QuotaExceeded)
    # A write that makes no thread is not refused by it.
    chat.append(AssistantMessage(content="still writes"))
    new[0].delete()
    assert new[0].remove_turn("t1") == 0
    assert store.owner_usage("ann").threads == 1
    totals_match(store, "ann")


def test_the_byte_quota_refuses_every_write_that_would_pass_it(make_store, raw_client, namespace):
    store = make_store(chunk_size=4, window_size=4)
    chat = store.thread("chat", owner="ann")
    stored = chat.append([UserMessage(content=f"m{i} " + "x" * 200) for i in range(6)])
    used = store.owner_usage("ann").stored_bytes
    store.set_owner_quota("ann", stored_bytes=used + 300)
    calls = [
        lambda: chat.append(UserMessage(content="y" * 400)),
        lambda: chat.append([UserMessage(content=f"b{i}") for i in range(500)]),
        lambda: chat.replace(stored[0].id, UserMessage(content="longer " * 80)),
        lambda: chat.compact("a summary " * 60, last_sequence=stored[3].seq_id),
        lambda: chat.fork("copy", at=stored[-1].id),
        lambda: store.thread("other", owner="ann").append(UserMessage(content="z" * 400)),
    ]
    refused_unchanged(raw_client, namespace, calls, errors.StorageQuotaExceeded)
    chat.append(UserMessage(content="fits"))
    assert store.owner_usage("ann").stored_bytes <= used + 300
    totals_match(store, "ann")


def test_the_rate_quota_refuses_a_batch_past_it_whole(make_store, raw_client, namespace):
    store = make_store()
    early_in_a_minute(raw_client)
    store.set_owner_quota("ann", messages_per_minute=10)
    chat = store.thread("chat", owner="ann")
    chat.append([UserMessage(content=f"m{i}") for i in range(7)])
    calls = [
        lambda: chat.append([UserMessage(content=f"b{i}") for i in range(4)]),
        lambda: store.thread("other", owner="ann").append(
            [UserMessage(content=f"c{i}") for i in range(500)]
        ),
    ]
    refused_unchanged(raw_client, namespace, calls, errors.QuotaExceeded)
    chat.append([UserMessage(content=f"d{i}") for i in range(3)])
    assert store.owner_usage("ann").messages == 10


def test_a_fork_the_byte_quota_refuses_midway_leaves_no_thread(
    make_store, raw_client, namespace, monkeypatch
):
    monkeypatch.setattr("kvstore._engine.fork.RESTORE_RUN", 4)  # a run of 4 messages a call
    store = make_store()
    source = store.thread("source", owner="ann")
    stored = source.append([UserMessage(content=f"m{i} " + "x" * 200) for i in range(16)])
    used = store.owner_usage("ann").stored_bytes
    store.set_owner_quota("ann", stored_bytes=used + used // 2)  # room for half a copy
    before = keyspace(raw_client, namespace)
    with pytest.raises(errors.StorageQuotaExceeded):
        source.fork("copy", at=stored[-1].id)
    assert keyspace(raw_client, namespace) == before
    assert store.thread("copy", owner="ann").info() is None
    # Half the history fits: that fork is made whole.
    half = source.fork("half", at=stored[5].id)
    assert half.info().messages == half.stats().stored_messages == 6
    totals_match(store, "ann")


def test_a_refused_fork_keeps_a_target_that_was_there_before_it(
    make_store, raw_client, namespace, monkeypatch
):
    """A thread listed by set_info, or with a turn started, holds what the fork did not write:
    a fork its quota refuses takes none of it away (only a target the fork made is deleted)."""
    monkeypatch.setattr("kvstore._engine.fork.RESTORE_RUN", 4)
    store = make_store()
    source = store.thread("source", owner="ann")
    stored = source.append([UserMessage(content=f"m{i} " + "x" * 200) for i in range(16)])
    draft = store.thread("draft", owner="ann")
    draft.set_info(title="My draft", metadata={"model": "small"})
    started = store.thread("started", owner="ann")
    started.start_turn("turn-1")
    used = store.owner_usage("ann").stored_bytes
    store.set_owner_quota("ann", stored_bytes=used + used // 2)  # room for half a copy
    for target in (draft, started):
        with pytest.raises(errors.StorageQuotaExceeded):
            source.fork(target.thread_id, at=stored[-1].id)
    info = draft.info()
    assert info is not None and (info.title, info.metadata) == ("My draft", {"model": "small"})
    turn = started.snapshot().turn
    assert turn is not None and (turn.turn_id, turn.outcome) == ("turn-1", "open")
    assert {"draft", "started"} <= {t.thread_id for t in store.threads("ann").threads}
    totals_match(store, "ann")
    # What the refused fork copied stays: run again once the quota allows, it finishes.
    store.set_owner_quota("ann", stored_bytes=10 * used)
    source.fork("draft", at=stored[-1].id)
    assert [m.seq_id for m in draft.list(limit=50).messages] == list(range(1, 17))
    assert draft.info().title == "My draft"
    totals_match(store, "ann")


def dumps(raw_client, namespace):
    return {key: raw_client.dump(key) for key in raw_client.scan_iter(match=f"{namespace}:*")}


def test_a_call_that_writes_nothing_leaves_every_dump_as_it_was(make_store, raw_client, namespace):
    """Byte for byte, not only by contents: a small owner's hashes are listpacks, whose DUMP a
    read does not reorder (a hash table that just grew is rehashed a step by each command)."""
    store = make_store()
    chat = store.thread("chat", owner="ann")
    batch = [UserMessage(content="hello")]
    chat.append(batch)  # the owner's first write makes its hashes
    before = dumps(raw_client, namespace)
    assert chat.append(batch).replayed
    store.threads("ann")
    store.owner_usage("ann")
    chat.info()
    assert dumps(raw_client, namespace) == before
    store.set_owner_quota("ann", threads=1)
    before = dumps(raw_client, namespace)
    with pytest.raises(errors.QuotaExceeded):
        store.thread("other", owner="ann").set_info(title="a second chat")
    assert dumps(raw_client, namespace) == before
