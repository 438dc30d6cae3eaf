"""context()'s read ahead (kvstore/_engine/budget.py): a thread handle keeps the closed chunks its
last budget plan named, and its next plan reads them in its first round trip. A right guess
saves the second round trip; a wrong one (a chunk closed since, a compaction, a thread deleted
and written again, a guess naming chunks that are gone or never were, a write landing inside the
round trip) costs that round trip and never changes what context() returns."""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import pytest

from kvstore import StoreConfig, SystemMessage, UserMessage
from kvstore._engine.budget import CONTEXT_HINT, MAX_AHEAD
from kvstore._engine.core import ThreadRef
from kvstore._engine.executor import KEPT_THREADS, record
from kvstore._engine.views import context as history_context  # context() but its system prompt

from ..conftest import make_async_store, make_sync_store
from .test_migration_2_to_3 import old_thread
from .test_page_reads import drive
from .test_tokens import users

CONFIG = dict(chunk_size=8, window_size=8)


class Chat(NamedTuple):
    store: object
    config: StoreConfig
    thread: object  # the public handle, for writes
    ref: ThreadRef  # the handle whose guesses the reads keep

    def context(self, budget, between=None):
        """The context through `ref` (its guess), and the requests it sent."""
        return drive(self.store, history_context(self.ref, budget), between)

    def fresh(self, budget):
        """The context as a new handle (no guess) reads it."""
        return drive(self.store, history_context(ThreadRef.of(self.config, "t"), budget))[0]


@pytest.fixture
def chat(backend, namespace):
    """A sync store's thread "t" of 100 messages of 10 tokens each."""
    config = StoreConfig(namespace=namespace, **CONFIG)
    store = make_sync_store(backend, config)
    store.thread("t").append(users(100), tokens=[10] * 100)
    yield Chat(store, config, store.thread("t"), ThreadRef.of(config, "t"))
    store.close()


def test_a_handle_reads_the_chunks_its_last_plan_named_in_one_round_trip(chat):
    # 5, 20 and 30 messages: the open chunk's 4, then one to four closed chunks of 8.
    for budget in (50, 200, 300):
        first, requests = chat.context(budget)
        assert 1 <= len(requests) <= 2
        again, requests = chat.context(budget)
        assert len(requests) == 1, requests
        assert again == first == chat.fresh(budget)
        assert len(again) == budget // 10
    # A plan of more chunks than a guess holds keeps no guess: two round trips each time.
    wide = 10 * 8 * (MAX_AHEAD + 2)
    chat.context(wide)
    assert CONTEXT_HINT not in chat.ref.hints
    again, requests = chat.context(wide)
    assert len(requests) == 2 and again == chat.fresh(wide)


def test_a_wrong_guess_costs_a_round_trip_and_changes_nothing(chat):
    thread, ref, budget = chat.thread, chat.ref, 250
    chat.context(budget)
    # A chunk closed since: the plan names it, the guess does not.
    thread.append(users(8, 100), tokens=[10] * 8)
    found, requests = chat.context(budget)
    assert len(requests) == 2 and found == chat.fresh(budget)
    # A compaction: the summary's chunk joins the plan.
    thread.compact("so far", thread.stats().next_sequence - 12, tokens=5)
    found, requests = chat.context(budget)
    assert found == chat.fresh(budget) and found[0].summary == "so far"
    assert len(found) == 1 + 11
    # Deleted and written again: the guessed chunks' keys hold other messages now.
    thread.delete()
    thread.append([UserMessage(content=f"again {i}") for i in range(60)], tokens=[10] * 60)
    found = chat.context(budget)[0]
    assert found == chat.fresh(budget)
    assert [m.content for m in found] == [f"again {i}" for i in range(35, 60)]
    # A guess of chunks that never were, or are no chunk's first sequence.
    for guess in [(10**9,), (3, 5, 7, 9), (1, 2)]:
        ref.hints[CONTEXT_HINT] = guess
        assert chat.context(budget)[0] == chat.fresh(budget)


def test_a_write_inside_the_round_trip_reads_again(chat):
    budget = 300
    chat.context(budget)
    guess = chat.ref.hints[CONTEXT_HINT]
    assert len(guess) == 4
    wrote = []

    def between(request, position):
        # Right after the guessed chunks are read (the six reads before them, then theirs),
        # before meta is read again: a chunk closes.
        if request == 0 and position == 6 + len(guess) and not wrote:
            wrote.append(chat.thread.append(users(8, 500), tokens=[10] * 8))

    found, requests = chat.context(budget, between)
    assert wrote and len(requests) >= 2
    assert found == chat.fresh(budget)
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
    chat = Chat(store, store.config, thread, ThreadRef.of(store.config, "t"))
    expected = chat.fresh(700)
    assert any(m.content.startswith("message ") for m in expected)  # from the window
    chat.context(700)
    assert chat.ref.hints.get(CONTEXT_HINT)
    assert chat.context(700)[0] == expected
    store.close()


def test_a_stores_handles_of_one_thread_share_what_their_reads_learnt(backend, namespace):
    """A backend that takes a new handle per request (``store.thread(id)``) still reads ahead:
    a store's handles of a thread share their hints, sync and async; a thread of the same id
    under an owner is another thread, and what is kept is bounded."""
    config = StoreConfig(namespace=namespace, **CONFIG)
    store = make_sync_store(backend, config)
    store.thread("t").append(SystemMessage(content="rules"), tokens=[5])
    store.thread("t").append(users(100), tokens=[10] * 100)
    requests: list = []
    for read in (
        lambda: store.thread("t").context(max_tokens=205),
        lambda: store.thread("t").list(limit=10, order="desc"),
    ):
        first = read()
        record(store, requests.append)
        assert read() == first
        record(store, None)
        assert len(requests) == 1, requests
        requests.clear()
    assert store.thread("t", owner="o")._ref.hints is not store.thread("t")._ref.hints
    for i in range(KEPT_THREADS + 1):
        store.thread(f"t{i}")
    assert len(store._refs) <= KEPT_THREADS

    async def from_async() -> int:
        astore = make_async_store(backend, config)
        await astore.thread("t").context(max_tokens=205)
        record(astore, requests.append)
        found = await astore.thread("t").context(max_tokens=205)
        record(astore, None)
        await astore.close()
        assert [m.content for m in found[:1]] == ["rules"]
        return len(requests)

    assert asyncio.run(from_async()) == 1
    store.close()
