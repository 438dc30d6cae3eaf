"""context()'s read ahead (kvstore/_engine/budget.py): a thread handle keeps the closed chunks its
last budget plan named, and its next plan reads them in its first round trip. A right guess
saves the second round trip; a wrong one (a chunk closed since, a compaction, a thread deleted
and written again, a guess naming chunks that are gone or never were, a write landing inside the
round trip) costs that round trip and never changes what context() returns."""

from __future__ import annotations

import pytest

from kvstore import StoreConfig, UserMessage
from kvstore._engine.budget import CONTEXT_HINT, MAX_AHEAD
from kvstore._engine.core import ThreadRef
from kvstore._engine.views import context as history_context  # context() but its system prompt

from ..conftest import make_sync_store
from .test_migration_2_to_3 import old_thread
from .test_page_reads import drive
from .test_tokens import users

CONFIG = dict(chunk_size=8, window_size=8)


@pytest.fixture
def chat(backend, namespace):
    """A sync store and config, and its thread "t" of 100 messages of 10 tokens each."""
    config = StoreConfig(namespace=namespace, **CONFIG)
    store = make_sync_store(backend, config)
    store.thread("t").append(users(100), tokens=[10] * 100)
    yield store, config
    store.close()


def fresh(store, config, budget):
    """The context as a new handle (no guess) reads it."""
    return drive(store, history_context(ThreadRef.of(config, "t"), budget))[0]


def test_a_handle_reads_the_chunks_its_last_plan_named_in_one_round_trip(chat):
    store, config = chat
    ref = ThreadRef.of(config, "t")
    # 5, 20 and 30 messages: the open chunk's 4, then one to four closed chunks of 8.
    for budget in (50, 200, 300):
        first, requests = drive(store, history_context(ref, budget))
        assert 1 <= len(requests) <= 2
        again, requests = drive(store, history_context(ref, budget))
        assert len(requests) == 1, requests
        assert again == first == fresh(store, config, budget)
        assert len(again) == budget // 10
    # A plan of more chunks than a guess holds keeps no guess: two round trips each time.
    wide = 10 * 8 * (MAX_AHEAD + 2)
    drive(store, history_context(ref, wide))
    assert CONTEXT_HINT not in ref.hints
    again, requests = drive(store, history_context(ref, wide))
    assert len(requests) == 2 and again == fresh(store, config, wide)


def test_a_wrong_guess_costs_a_round_trip_and_changes_nothing(chat):
    store, config = chat
    thread = store.thread("t")
    ref = ThreadRef.of(config, "t")
    budget = 250
    drive(store, history_context(ref, budget))
    # A chunk closed since: the plan names it, the guess does not.
    thread.append(users(8, 100), tokens=[10] * 8)
    found, requests = drive(store, history_context(ref, budget))
    assert len(requests) == 2 and found == fresh(store, config, budget)
    # A compaction: the summary's chunk joins the plan.
    thread.compact("so far", thread.stats().next_sequence - 12, tokens=5)
    found, requests = drive(store, history_context(ref, budget))
    assert found == fresh(store, config, budget) and found[0].summary == "so far"
    assert len(found) == 1 + 11
    # Deleted and written again: the guessed chunks' keys hold other messages now.
    thread.delete()
    thread.append([UserMessage(content=f"again {i}") for i in range(60)], tokens=[10] * 60)
    found = drive(store, history_context(ref, budget))[0]
    assert found == fresh(store, config, budget)
    assert [m.content for m in found] == [f"again {i}" for i in range(35, 60)]
    # A guess of chunks that never were, or are no chunk's first sequence.
    for guess in [(10**9,), (3, 5, 7, 9), (1, 2)]:
        ref.hints[CONTEXT_HINT] = guess
        assert drive(store, history_context(ref, budget))[0] == fresh(store, config, budget)


def test_a_write_inside_the_round_trip_reads_again(chat):
    store, config = chat
    thread = store.thread("t")
    ref = ThreadRef.of(config, "t")
    budget = 300
    drive(store, history_context(ref, budget))
    assert ref.hints.get(CONTEXT_HINT)
    wrote = []

    def between(request, position):
        # After the guessed chunks are read, before meta is read again: close a chunk.
        if request == 0 and position == 7 and not wrote:
            wrote.append(thread.append(users(8, 500), tokens=[10] * 8))

    found, requests = drive(store, history_context(ref, budget), between)
    assert wrote and len(requests) >= 2
    assert found == fresh(store, config, budget)
    assert found[-1].content == users(8, 500)[-1].content


def test_repeated_contexts_on_one_handle_match_a_fresh_handle(make_thread):
    """Sync and async: the handle's guesses across appends that close chunks, a compaction
    and the thread's deletion give what a new handle reads."""
    thread = make_thread("t", **CONFIG)
    thread.append(users(60), tokens=[10] * 60)
    for step in range(12):
        if step == 6:
            thread.compact("so far", thread.stats().next_sequence - 20, tokens=5)
        if step == 9:
            thread.delete()
        thread.append(users(5, 1000 + 5 * step), tokens=[10] * 5)
        for budget in (40, 170, 290):
            found = thread.context(max_tokens=budget)
            assert found == make_thread("t", **CONFIG).context(max_tokens=budget)


def test_a_window_left_by_layout_2_is_read_beside_the_guessed_chunks(
    backend, namespace, raw_client, server, server_only
):
    """A thread the previous release wrote keeps its window while writes drain it: a plan that
    reaches past the closed chunks into the window reads the window too, guessed chunks or not."""
    config = dict(window_size=200, chunk_size=4, max_chunks_per_call=1)
    old_thread(server, namespace, "t", 150, **config)
    store = make_sync_store(backend, StoreConfig(namespace=namespace, **config))
    thread = store.thread("t")
    for i in range(14):
        thread.append(UserMessage(content=f"new {i}"))
    assert raw_client.zcard(thread.keys.window) > 50  # still draining
    ref = ThreadRef.of(store.config, "t")
    expected = fresh(store, store.config, 700)
    assert any(m.content.startswith("message ") for m in expected)  # from the window
    drive(store, history_context(ref, 700))
    assert ref.hints.get(CONTEXT_HINT)
    assert drive(store, history_context(ref, 700))[0] == expected
    store.close()
