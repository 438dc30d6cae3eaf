"""context() keeps the system messages a thread starts with, counted against max_tokens, like
the summary (docs/HISTORY.md, "The system prompt"); every backend, sync and async."""

from __future__ import annotations

from kvstore import AssistantMessage, StoreConfig, SystemMessage, UserMessage
from kvstore._engine.core import Eval, ThreadRef, context
from kvstore._engine.views import context as history_context

from ..conftest import make_sync_store
from .test_page_reads import drive


def kinds(messages) -> list[str]:
    return [m.message_type for m in messages]


def test_a_small_budget_keeps_the_system_message(make_thread):
    thread = make_thread()
    thread.append(SystemMessage(content="You are terse."), tokens=[5])
    thread.append(UserMessage(content="hi"), tokens=[10])
    thread.append(AssistantMessage(content="hello"), tokens=[10])
    assert kinds(thread.context()) == ["system_message", "user_message", "assistant_message"]
    assert kinds(thread.context(max_tokens=25)) == kinds(thread.context())
    # 15 leaves 10 after the system message: the newest message only.
    assert kinds(thread.context(max_tokens=15)) == ["system_message", "assistant_message"]
    assert kinds(thread.context(max_tokens=14)) == ["system_message"]
    # The caller's counter counts the system message too.
    counts = {"system_message": 5, "user_message": 10, "assistant_message": 10}
    by_counter = thread.context(max_tokens=15, count_tokens=lambda m: counts[m.message_type])
    assert kinds(by_counter) == ["system_message", "assistant_message"]


def test_a_budget_too_small_for_the_system_message_keeps_it_alone(make_thread):
    """As a summary over the budget is kept alone: instructions are never dropped silently."""
    thread = make_thread()
    thread.append(
        [SystemMessage(content="rules"), SystemMessage(content="more rules")], tokens=[8, 8]
    )
    thread.append(UserMessage(content="hi"), tokens=[1])
    assert [m.content for m in thread.context(max_tokens=3)] == ["rules", "more rules"]
    assert kinds(thread.context(max_tokens=17)) == [
        "system_message",
        "system_message",
        "user_message",
    ]


def test_a_compaction_covering_the_system_message_keeps_it_before_the_summary(make_thread):
    thread = make_thread()
    thread.append(SystemMessage(content="You are terse."), tokens=[5])
    for i in range(4):
        thread.append(UserMessage(content=f"m{i}"), tokens=[10])
    thread.compact("what was said", last_sequence=3, tokens=5)
    assert kinds(thread.context()) == [
        "system_message",
        "summary_message",
        "user_message",
        "user_message",
    ]
    # 5 (system) + 5 (summary) + 10: the newest message after the summary.
    budgeted = thread.context(max_tokens=20)
    assert kinds(budgeted) == ["system_message", "summary_message", "user_message"]
    assert budgeted[-1].content == "m3"
    # A budget the system message fills: it and the summary, as the summary is kept alone.
    assert kinds(thread.context(max_tokens=5)) == ["system_message", "summary_message"]


def test_only_the_leading_system_messages_are_kept(make_thread):
    thread = make_thread()
    thread.append(UserMessage(content="first"), tokens=[1])
    thread.append(SystemMessage(content="a later system note"), tokens=[1])
    thread.append(UserMessage(content="last"), tokens=[1])
    assert [m.content for m in thread.context(max_tokens=1)] == ["last"]


def test_one_read_more_only_where_the_context_does_not_reach_the_start(backend, namespace):
    """The system messages are read in one more round trip (lua/read_range.lua), only when
    what context() read does not hold the thread's first message."""
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append(SystemMessage(content="rules"), tokens=[3])
    thread.append([UserMessage(content=f"m{i}") for i in range(40)], tokens=[1] * 40)
    ref = ThreadRef.of(config, "t")
    for budget, extra in ((None, 0), (10**6, 0), (10, 2)):
        found, requests = drive(store, context(ref, budget))
        _, planner = drive(store, history_context(ref, budget))
        # Cut: the start's read, then the history again with what the system messages leave.
        assert len(requests) == len(planner) * (2 if extra else 1) + (1 if extra else 0)
        assert found[0].content == "rules"
        if extra:
            assert [r.script.name for r in requests if isinstance(r, Eval)].count("read_range") == 1
            assert [m.content for m in found] == ["rules", *[f"m{i}" for i in range(33, 40)]]
    store.close()
