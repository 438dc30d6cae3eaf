"""An owner's totals against its threads' own counts after every kind of write, sync and async,
on each server: retries that store nothing, retention after a compaction, a turn removed, a
replace either way, forks and deletes (docs/OWNERS.md, "What moves the directory")."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, UserMessage

from ..support.owners import stores, totals_match


@pytest.fixture
def make_store(backend, mode, namespace):
    yield from stores(backend, mode, namespace)


def test_the_totals_are_the_sum_of_the_threads_after_every_write(make_store):
    store = make_store(chunk_size=2, window_size=2, retained_message_limit=2)
    chat = store.thread("chat", owner="ann")
    batch = [UserMessage(content=f"m{i} " + "x" * 40, otid=f"o{i}") for i in range(20)]
    stored = chat.append(batch)
    counts = totals_match(store, "ann")
    chat.append(batch)  # a retry: the same ids
    chat.append([UserMessage(content=m.content, otid=m.otid) for m in batch])  # the same otids
    assert totals_match(store, "ann") == counts
    chat.compact("the first fifteen", last_sequence=stored[14].seq_id)
    assert chat.stats().deleted_before_sequence  # retention deleted what the summary covers
    totals_match(store, "ann")
    chat.start_turn("t1")
    chat.append([AssistantMessage(content=f"a{i}") for i in range(5)], turn_id="t1")
    chat.finish_turn("t1")
    totals_match(store, "ann")
    assert chat.remove_turn("t1") == 5
    totals_match(store, "ann")
    last = chat.list(limit=1, order="desc").messages[-1]
    chat.replace(last.id, UserMessage(content="longer " * 30))
    totals_match(store, "ann")
    chat.replace(last.id, UserMessage(content="short"))
    totals_match(store, "ann")
    fork = chat.fork("fork", at=last.id)
    fork.append(UserMessage(content="the fork goes on"))
    assert totals_match(store, "ann")[0] == 2
    chat.delete()
    assert totals_match(store, "ann")[0] == 1
    fork.delete()
    assert totals_match(store, "ann") == (0, 0, 0, 0)


@pytest.mark.parametrize("mode", ["sync"])
def test_counts_past_ten_to_the_fourteen_tokens_stay_exact(make_store, server_only):
    """A thread may hold up to 2**52 tokens (docs/LAYOUT.md, "Number bounds"): its directory
    record keeps every digit past 10**14 (where Lua's own number format turns to exponents),
    so the next write reads it back and the owner's totals stay the thread's."""
    store = make_store(max_batch_messages=500)
    chat = store.thread("chat", owner="ann")
    per_message, batch = 2**31, 500
    while chat.stats().tokens <= 10**14:
        chat.append([UserMessage(content="x") for _ in range(batch)], tokens=[per_message] * batch)
    chat.append(UserMessage(content="one more"), tokens=7)
    stats = chat.stats()
    assert stats.tokens > 10**14 and stats.tokens % 10 == 7
    totals_match(store, "ann")
    assert chat.info().tokens == stats.tokens
    chat.delete()
    usage = store.owner_usage("ann")
    assert (usage.threads, usage.messages, usage.stored_bytes, usage.tokens) == (0, 0, 0, 0)
