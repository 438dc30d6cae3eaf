"""A history a model can be given: tool-call pairs never split by context() or a compaction,
context by token budget, and forks (docs/HISTORY.md)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore import (
    ApprovalRequestMessage,
    ApprovalResponseMessage,
    AssistantMessage,
    StoreConfig,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
    errors,
)
from kvstore._engine import backup as backup_module
from kvstore._engine.tokens import estimated_tokens
from kvstore._engine.tool_pairs import answered_ids, opened_ids, orphans

from ..support.layout_check import check_layout


def call(call_id: str) -> ToolCallMessage:
    return ToolCallMessage(
        tool_call={"name": "weather", "arguments": "{}", "tool_call_id": call_id}
    )


def answer(call_id: str) -> ToolReturnMessage:
    return ToolReturnMessage(status="success", tool_call_id=call_id, tool_return="4 °C")


def kinds(messages) -> list[str]:
    return [m.message_type for m in messages]


def users(n: int, tag: str = "u") -> list[UserMessage]:
    return [UserMessage(content=f"{tag}{i}") for i in range(n)]


# --- compaction and the summary boundary -----------------------------------------------------


def test_a_compaction_inside_a_pair_moves_back_before_the_call(make_thread):
    thread = make_thread()
    thread.append(users(5))  # 1..5
    thread.append(call("c1"))  # 6
    thread.append(AssistantMessage(content="checking"))  # 7
    thread.append(answer("c1"))  # 8
    thread.append(AssistantMessage(content="done"))  # 9
    thread.compact("the user said hello five times", 7)
    assert thread.stats().summary_last_sequence == 5
    context = thread.context()
    assert kinds(context) == [
        "summary_message",
        "tool_call_message",
        "assistant_message",
        "tool_return_message",
        "assistant_message",
    ]
    # The same last_sequence again is a retry: the summary already stored comes back.
    again = thread.compact("the user said hello five times", 7)
    assert again.id == context[0].id and thread.stats().stored_messages == 10


def test_a_compaction_outside_any_pair_stays_where_it_was_asked(make_thread):
    thread = make_thread()
    thread.append([*users(3), call("c1"), answer("c1"), *users(2, "v")])
    thread.compact("summary", 5)
    assert thread.stats().summary_last_sequence == 5
    assert kinds(thread.context()) == ["summary_message", "user_message", "user_message"]


def test_a_pair_whose_call_is_the_first_message_cannot_be_summarized_half(make_thread, raw_client):
    thread = make_thread()
    thread.append([call("c1"), answer("c1")])
    before = {
        k: raw_client.dump(k)
        for k in raw_client.scan_iter(match=thread.keys.meta.rsplit(":", 1)[0] + "*")
    }
    with pytest.raises(errors.InvalidSummaryRange, match="first message"):
        thread.compact("summary", 1)
    after = {
        k: raw_client.dump(k)
        for k in raw_client.scan_iter(match=thread.keys.meta.rsplit(":", 1)[0] + "*")
    }
    assert before == after


def test_context_brings_back_a_call_an_older_summary_covers(make_thread, raw_client):
    thread = make_thread(retained_message_limit=None)
    thread.append([*users(4), call("c1")])  # 1..5
    thread.compact("summary", 4)
    thread.append([answer("c1"), AssistantMessage(content="done")])  # 7, 8 (the summary is 6)
    # A summary stored before boundaries moved: it covers the call but not its answer.
    raw_client.hset(thread.keys.meta, "summary_last", 5)
    assert kinds(thread.context()) == [
        "summary_message",
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert kinds(thread.context(max_tokens=10_000)) == kinds(thread.context())


def test_context_leaves_out_an_answer_whose_call_is_gone(make_thread):
    thread = make_thread()
    thread.append([*users(2), answer("never-called"), AssistantMessage(content="done"), call("c2")])
    # The answer names no call in the thread; the newest call waits for its answer.
    assert kinds(thread.context()) == [
        "user_message",
        "user_message",
        "assistant_message",
        "tool_call_message",
    ]
    assert len(list(thread.iter())) == 5  # nothing is deleted: only the model input leaves it out


def test_approvals_pair_like_calls(make_thread):
    thread = make_thread()
    request = ApprovalRequestMessage(
        tool_call={"name": "pay", "arguments": "{}", "tool_call_id": "p1"}
    )
    thread.append([UserMessage(content="pay the bill"), request])
    thread.append(ApprovalResponseMessage(approval_request_id=request.id, approve=True))
    thread.append(answer("p1"))
    assert kinds(thread.context()) == [
        "user_message",
        "approval_request_message",
        "approval_response_message",
        "tool_return_message",
    ]
    tokens = [estimated_tokens(m) for m in thread.context()]
    # A budget that cuts the request away leaves out both of its answers.
    assert kinds(thread.context(max_tokens=sum(tokens[2:]))) == []


# --- token budgets ---------------------------------------------------------------------------


def test_a_budget_keeps_the_newest_messages_that_fit(make_thread):
    thread = make_thread()
    thread.append(users(30))
    everything = thread.context()
    sizes = [estimated_tokens(m) for m in everything]
    budget = sum(sizes[-7:]) + sizes[-8] - 1
    assert thread.context(max_tokens=budget) == everything[-7:]
    assert thread.context(max_tokens=sum(sizes)) == everything
    assert thread.context(max_tokens=1) == []
    # The caller's counter: one token per message.
    assert thread.context(max_tokens=12, count_tokens=lambda m: 1) == everything[-12:]


def test_the_summary_is_always_given_and_counted(make_thread):
    thread = make_thread()
    thread.append(users(10))
    summary = thread.compact("x" * 400, 5)
    assert thread.context(max_tokens=1) == [summary]
    rest = thread.context()[1:]
    fits = estimated_tokens(summary) + sum(estimated_tokens(m) for m in rest[-2:])
    assert thread.context(max_tokens=fits) == [summary, *rest[-2:]]


def test_a_budget_reads_pages_newest_first_across_chunks(make_thread):
    thread = make_thread(window_size=8, chunk_size=4)
    thread.append(users(450))
    full = thread.context()
    assert thread.context(max_tokens=350, count_tokens=lambda m: 1) == full[-350:]


def test_a_counted_budget_after_a_summary_keeps_the_newest_messages(make_thread):
    thread = make_thread(window_size=8, chunk_size=4)
    thread.append(users(200))
    summary = thread.compact("s", 20)
    full = thread.context()
    # More than a page follows the summary: the budget keeps the newest, not those next to it.
    assert thread.context(max_tokens=31, count_tokens=lambda m: 1) == [summary, *full[-30:]]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "10"])
def test_a_bad_budget_is_refused(make_thread, bad):
    thread = make_thread()
    with pytest.raises(errors.InvalidCursor):
        thread.context(max_tokens=bad)


def test_a_bad_counter_result_is_refused(make_thread):
    thread = make_thread()
    thread.append(users(2))
    with pytest.raises(errors.InvalidMessage, match="token counter"):
        thread.context(max_tokens=10, count_tokens=lambda m: -1)


# --- the property: whatever the history, context() holds whole pairs ---------------------------

steps = st.lists(
    st.one_of(
        st.just(("user",)),
        st.tuples(st.just("call"), st.integers(0, 5)),
        st.tuples(st.just("answer"), st.integers(0, 5)),
        st.tuples(st.just("compact"), st.integers(1, 40)),
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=steps, budget=st.integers(1, 600))
def test_every_context_holds_whole_pairs(make_thread, plan, budget):
    thread = make_thread(window_size=4, chunk_size=2, retained_message_limit=3)
    for step in plan:
        if step[0] == "user":
            thread.append(UserMessage(content="hi"))
        elif step[0] == "call":
            thread.append(call(f"c{step[1]}"))
        elif step[0] == "answer":
            thread.append(answer(f"c{step[1]}"))
        else:
            last = thread.stats().next_sequence - 1
            summary_last = thread.stats().summary_last_sequence or 0
            with contextlib.suppress(errors.InvalidSummaryRange):
                thread.compact("s", max(summary_last + 1, min(step[1], last)))
    full = thread.context()
    cut = thread.context(max_tokens=budget)
    for context in (full, cut):
        body = [m for m in context if m.message_type != "summary_message"]
        assert orphans(body) == []
        sequences = [m.seq_id for m in body]
        assert sequences == sorted(set(sequences))
    # The budgeted context is the full one's newest part (pairs cut at its edge left out).
    full_body = [m.id for m in full if m.message_type != "summary_message"]
    cut_body = [m.id for m in cut if m.message_type != "summary_message"]
    assert cut_body == [i for i in full_body if i in set(cut_body)]
    if cut_body:
        assert full_body.index(cut_body[0]) <= full_body.index(cut_body[-1])
    assert sum(estimated_tokens(m) for m in cut if m.message_type != "summary_message") <= max(
        0, budget - sum(estimated_tokens(m) for m in cut if m.message_type == "summary_message")
    )


def test_the_pair_rules_on_their_own():
    c, r = call("a"), answer("a")
    assert opened_ids(c) == ("a",) and answered_ids(r) == ("a",)
    assert orphans([r, c]) == [r] and orphans([c, r]) == []
    assert orphans([r], opened=["a"]) == []


# --- forks -----------------------------------------------------------------------------------


def thread_keys_dump(raw_client, thread):
    prefix = thread.keys.meta.rsplit(":", 1)[0]
    return {k: raw_client.dump(k) for k in raw_client.scan_iter(match=prefix + "*")}


def test_a_fork_holds_the_history_up_to_the_message(make_thread, raw_client):
    thread = make_thread(window_size=8, chunk_size=4)
    stored = thread.append(users(60))
    thread.append(users(20, "later"))
    fork = thread.fork("thread-2", at=stored[41].id)
    assert fork.stats().forked_from == "thread-1" and fork.stats().fork_sequence == 42
    assert thread.stats().forked_from is None
    got = list(fork.iter())
    assert got == [m for m in thread.iter() if m.seq_id <= 42]
    check_layout(
        raw_client,
        fork.keys,
        StoreConfig(namespace=fork.keys.meta.split(":", 1)[0], window_size=8, chunk_size=4),
    )
    nxt = fork.append(UserMessage(content="Actually, Bergen."))[0]
    assert nxt.seq_id == 43
    assert thread.stats().stored_messages == 80  # the source is untouched
    # Forking again is a no-op that returns the same thread.
    assert fork.stats().stored_messages == 43
    assert thread.fork("thread-2", at=42).stats().stored_messages == 43


def test_a_fork_carries_the_summary_retention_and_turns(make_thread):
    thread = make_thread(window_size=4, chunk_size=2, retained_message_limit=4)
    thread.append(users(20))
    thread.compact("the first twenty", 20)  # 21
    thread.start_turn("turn-1")
    thread.append(AssistantMessage(content="one"), turn_id="turn-1")  # 22
    thread.append(AssistantMessage(content="two"), turn_id="turn-1")  # 23
    thread.finish_turn("turn-1")
    fork = thread.fork("thread-2", at=22)
    stats, source = fork.stats(), thread.stats()
    assert stats.deleted_before_sequence == source.deleted_before_sequence is not None
    assert stats.summary_last_sequence == 20
    assert [m.seq_id for m in fork.context()] == [21, 22]
    assert fork.snapshot().turn.outcome == "open"  # the turn went on after the fork point
    fork.append(AssistantMessage(content="another"), turn_id="turn-1")
    result = fork.finish_turn("turn-1")
    assert (result.reply_count, result.first_sequence, result.last_sequence) == (2, 22, 23)
    # A fork point before the summary's own message carries no summary.
    early = thread.fork("thread-3", at=20)
    assert early.stats().summary_last_sequence is None and early.snapshot().turn is None


def test_an_interrupted_fork_is_finished_by_running_it_again(make_thread, monkeypatch):
    thread = make_thread(window_size=8, chunk_size=4)
    thread.append(users(250))
    real = backup_module.restore_run
    calls = []

    def failing(target, run, *born):
        calls.append(len(run))
        if len(calls) == 2:
            raise errors.ConnectionFailed("the connection dropped")
        return (yield from real(target, run, *born))

    monkeypatch.setattr("kvstore._engine.fork.restore_run", failing)
    with pytest.raises(errors.ConnectionFailed):
        thread.fork("thread-2", at=200)
    monkeypatch.setattr("kvstore._engine.fork.restore_run", real)
    half = make_thread("thread-2")
    assert half.stats().forked_from is None and 0 < half.stats().stored_messages < 200
    fork = thread.fork("thread-2", at=200)
    assert list(fork.iter()) == list(thread.iter())[:200]
    assert fork.stats().fork_sequence == 200


def test_a_fork_into_a_thread_with_other_messages_writes_nothing(make_thread, raw_client):
    thread = make_thread()
    thread.append(users(5))
    other = make_thread("thread-2")
    other.append(users(3, "mine"))
    before = thread_keys_dump(raw_client, other)
    with pytest.raises(errors.RestoreConflict):
        thread.fork("thread-2", at=3)
    assert thread_keys_dump(raw_client, other) == before


@pytest.mark.parametrize("at", ["message-nope", 99, 0, "", None, True])
def test_a_fork_at_no_stored_message_writes_nothing(make_thread, raw_client, at):
    thread = make_thread()
    thread.append(users(5))
    target = make_thread("thread-2")
    with pytest.raises((errors.MessageNotFound, errors.InvalidCursor)):
        thread.fork("thread-2", at=at)
    assert thread_keys_dump(raw_client, target) == {}
    with pytest.raises(errors.InvalidCursor):
        thread.fork("thread-1", at=2)


def test_an_async_fork_cancelled_at_any_point_is_finished_by_running_it_again(
    server, server_only, namespace
):
    import asyncio

    from kvstore import AsyncMessageStore

    async def scenario() -> None:
        store = AsyncMessageStore.from_url(
            server.url, StoreConfig(namespace=namespace, window_size=8, chunk_size=4)
        )
        try:
            source = store.thread("source")
            for start in range(0, 1000, 250):
                await source.append(users(250, f"u{start}-"))
            expected = [m async for m in source.iter()][:900]
            await source.fork("fork-warm", at=900)  # connections open, scripts loaded
            times = []
            for n in range(3):  # the median of three: one slow call does not set the shares
                started = asyncio.get_running_loop().time()
                await source.fork(f"fork-timed-{n}", at=900)
                times.append(asyncio.get_running_loop().time() - started)
            took = sorted(times)[1]
            cut_midway = 0
            # A loaded machine may shift every cut past the copy: sweep again (at most 3 times)
            # until one lands inside it; every fork cut anywhere must still finish whole.
            for sweep in range(3):
                for attempt, share in enumerate(i / 40 for i in range(1, 40)):
                    timeout = took * share
                    target = f"fork-{sweep}-{attempt}"
                    try:
                        await asyncio.wait_for(source.fork(target, at=900), timeout)
                    except TimeoutError:
                        half = await store.thread(target).stats()
                        cut_midway += half.forked_from is None and 0 < half.stored_messages < 900
                    fork = await source.fork(target, at=900)
                    assert [m async for m in fork.iter()] == expected
                    assert (await fork.stats()).fork_sequence == 900
                if cut_midway:
                    break
            assert cut_midway, "no cancellation landed inside the copy"
        finally:
            await store.close()

    asyncio.run(scenario())
