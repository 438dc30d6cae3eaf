"""Checked updates: with history_checks="strict", a write that would break the thread's tool-call
pairs is refused in the same atomic step, and nothing is written (docs/HISTORY.md, "Checked
updates"). Sync and async, on Valkey, Redis and the in-process tier."""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore import (
    ApprovalRequestMessage,
    ApprovalResponseMessage,
    AssistantMessage,
    MessageStore,
    StoreConfig,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
    errors,
)
from kvstore._engine.tool_pairs import batch_pairs, history_pairs, pair_ids
from kvstore.cli import backup
from kvstore.messages import ApprovalReturn, ToolReturn

from ..reliability.support import keyspace, keyspace_diff
from ..support.layout_check import check_layout

STRICT = dict(history_checks="strict")


def call(*call_ids: str) -> ToolCallMessage:
    calls = [{"name": "weather", "arguments": "{}", "tool_call_id": c} for c in call_ids]
    return ToolCallMessage(tool_call=calls[0], tool_calls=calls if len(calls) > 1 else None)


def answer(call_id: str, *more: str) -> ToolReturnMessage:
    returns = [
        ToolReturn(status="success", tool_call_id=c, tool_return="ok") for c in (call_id, *more)
    ]
    return ToolReturnMessage(
        status="success",
        tool_call_id=call_id,
        tool_return="4 °C",
        tool_returns=returns if more else None,
    )


def approval_request(call_id: str, message_id: str | None = None) -> ApprovalRequestMessage:
    extra = {"id": message_id} if message_id else {}
    return ApprovalRequestMessage(
        tool_call={"name": "pay", "arguments": "{}", "tool_call_id": call_id}, **extra
    )


def approval(
    call_id: str, request_id: str | None = None, approve: bool = True
) -> ApprovalResponseMessage:
    return ApprovalResponseMessage(
        approval_request_id=request_id,
        approvals=[ApprovalReturn(approve=approve, tool_call_id=call_id)],
    )


def open_pair_ids(raw_client, thread) -> set[str]:
    return {
        m.decode()
        for m in raw_client.zrange(thread.keys.pairs, 0, -1)
        if not m.startswith((b"m", b"o"))
    }


def intact(raw_client, thread, **config) -> None:
    """Every layout invariant holds (tests/support/layout_check.py), for the thread made with `config`."""
    check_layout(
        raw_client, thread.keys, StoreConfig(namespace=thread.keys.meta.split(":", 1)[0], **config)
    )


def refused_unchanged(raw_client, namespace, call, expected=errors.HistoryConflict) -> str:
    """Makes the call, which must raise `expected` and leave every key of the namespace as it was
    (DUMP and expiry); returns the error's text."""
    before = keyspace(raw_client, namespace)
    with pytest.raises(expected) as refused:
        call()
    assert keyspace_diff(before, keyspace(raw_client, namespace)) == []
    return str(refused.value)


# --- the tokens ---------------------------------------------------------------------------------


def test_what_each_message_opens_and_answers():
    assert pair_ids(call("c1", "c2")) == (["c:c1", "c:c2"], [])
    assert pair_ids(answer("c1", "c2")) == (
        [],
        ["c:c1", "c:c2"],
    )  # tool_call_id repeats its first return
    assert pair_ids(approval_request("c1", "message-r")) == (["c:c1", "p:c1", "a:message-r"], [])
    assert pair_ids(approval("c1", "message-r")) == ([], ["a:message-r", "p:c1"])
    given_result = ApprovalResponseMessage(
        approvals=[ToolReturn(status="success", tool_call_id="c1", tool_return="x")]
    )
    assert pair_ids(given_result) == ([], ["p:c1", "c:c1"])
    assert pair_ids(UserMessage(content="hi")) == ([], [])
    # Lengths are bytes, so ids in any script frame exactly.
    assert history_pairs(answer("é\t;:x")) == "-" + str(len("c:é\t;:x".encode())) + ":c:é\t;:x"
    assert batch_pairs([UserMessage(content="a"), AssistantMessage(content="b")]) == ""


# --- refusals -----------------------------------------------------------------------------------


def test_an_answer_to_no_open_call_is_refused_and_writes_nothing(
    make_thread, raw_client, namespace
):
    thread = make_thread("checked", **STRICT)
    thread.append([UserMessage(content="weather?"), call("c1")])
    assert thread.stats().history_checked
    text = refused_unchanged(raw_client, namespace, lambda: thread.append(answer("c-unknown")))
    assert "tool call c-unknown" in text and "not open" in text
    thread.append(answer("c1"))
    # A second return for the same call.
    assert "tool call c1" in refused_unchanged(
        raw_client, namespace, lambda: thread.append(answer("c1"))
    )
    # One return of several answering nothing refuses the message.
    thread.append(call("c2", "c3"))
    refused_unchanged(raw_client, namespace, lambda: thread.append(answer("c2", "c9")))
    thread.append(answer("c2", "c3"))
    assert open_pair_ids(raw_client, thread) == set()
    assert thread.stats().stored_messages == 5
    intact(raw_client, thread)


@pytest.mark.parametrize(
    "call_id", ["", "c\t1", "a;b:c", "c1\n-4:c:c1", "+9:", "\u00e9\u6f22\U0001f600", "x" * 5000]
)
def test_call_ids_of_any_text_pair_exactly(make_thread, raw_client, namespace, call_id):
    """An id is matched byte for byte, whatever it holds: framing characters, the pairs
    argument's own syntax, no text at all, or 5,000 characters."""
    thread = make_thread("odd-ids", **STRICT)
    thread.append(call(call_id))
    refused_unchanged(raw_client, namespace, lambda: thread.append(answer(call_id + "x")))
    refused_unchanged(
        raw_client,
        namespace,
        lambda: thread.append(answer(call_id[:-1])) if call_id else thread.append(answer("-")),
    )
    thread.append(answer(call_id))
    refused_unchanged(raw_client, namespace, lambda: thread.append(answer(call_id)))
    assert open_pair_ids(raw_client, thread) == set()


def test_approvals_answer_pending_requests_only(make_thread, raw_client, namespace):
    thread = make_thread("approvals", **STRICT)
    (request,) = thread.append(approval_request("pay-1"))
    refused_unchanged(
        raw_client, namespace, lambda: thread.append(approval("pay-1", "message-no-such-request"))
    )
    refused_unchanged(raw_client, namespace, lambda: thread.append(approval("pay-2", request.id)))
    thread.append(approval("pay-1", request.id))
    # The approval is answered, the call still waits for its result.
    assert open_pair_ids(raw_client, thread) == {"c:pay-1"}
    assert "approval request" in refused_unchanged(
        raw_client, namespace, lambda: thread.append(approval("pay-1", request.id))
    )
    thread.append(answer("pay-1"))
    assert open_pair_ids(raw_client, thread) == set()


def test_a_batch_is_checked_message_by_message_and_refused_whole(
    make_thread, raw_client, namespace
):
    thread = make_thread("batch", **STRICT)
    thread.append(UserMessage(content="go"))
    # A call and its return in one batch are fine; a return before its call is not.
    thread.append([call("b1"), AssistantMessage(content="running"), answer("b1")])
    text = refused_unchanged(
        raw_client,
        namespace,
        lambda: thread.append([UserMessage(content="x"), answer("b2"), call("b2")]),
    )
    assert text.startswith("message 1 ")
    refused_unchanged(
        raw_client, namespace, lambda: thread.append([call("b3"), answer("b3"), answer("b3")])
    )
    # The largest allowed batch: 250 calls and their returns.
    big = [m for i in range(250) for m in (call(f"x{i}"), answer(f"x{i}"))]
    assert len(thread.append(big)) == 500
    spoiled = [
        m for i in range(250) for m in (call(f"y{i}"), answer(f"y{i}" if i != 249 else "nope"))
    ]
    refused_unchanged(raw_client, namespace, lambda: thread.append(spoiled))
    assert thread.stats().stored_messages == 504
    intact(raw_client, thread)


def test_a_retried_append_is_a_replay_not_a_second_answer(make_thread):
    thread = make_thread("retry", **STRICT)
    thread.append(call("r1"))
    sent = [answer("r1"), AssistantMessage(content="done")]
    first = thread.append(sent)
    again = thread.append(sent)  # the same message objects: the same ids
    assert again.replayed and [m.seq_id for m in again] == [m.seq_id for m in first]
    by_otid = [answer("r1").model_copy(update={"otid": "o-1"})]
    with pytest.raises(errors.HistoryConflict):  # a new message answering the answered call
        thread.append(by_otid)


# --- which threads are checked ------------------------------------------------------------------


def test_only_threads_written_with_checks_from_their_first_message_are_checked(
    make_thread, raw_client
):
    old = make_thread("older")
    old.append([UserMessage(content="from before"), answer("never-made")])
    strict_old = make_thread("older", **STRICT)
    strict_old.append(answer("also-never-made"))  # not checked: its history is not known
    assert not strict_old.stats().history_checked and not raw_client.exists(strict_old.keys.pairs)

    thread = make_thread("mixed", **STRICT)
    thread.append(call("m1"))
    assert thread.stats().history_checked
    # A write without checks: what it added is not known, so the thread is not checked from then on.
    make_thread("mixed").append(AssistantMessage(content="unchecked writer"))
    assert not thread.stats().history_checked and not raw_client.exists(thread.keys.pairs)
    thread.append(answer("whatever"))


def test_checks_off_cost_nothing_and_write_no_state(make_thread, raw_client):
    thread = make_thread("off")
    thread.append([call("c1"), answer("c1"), answer("c1")])
    assert not raw_client.exists(thread.keys.pairs) and not thread.stats().history_checked


# --- state bounded by retention, replace and remove_turn ----------------------------------------


def test_retention_trims_the_state_with_the_messages(make_thread, raw_client):
    thread = make_thread("long", window_size=4, chunk_size=4, retained_message_limit=8, **STRICT)
    for i in range(40):
        thread.append([UserMessage(content=f"q{i}"), call(f"k{i}"), answer(f"k{i}")])
    thread.append(call("pending"))
    thread.compact("the past", 100)
    for i in range(30):  # each call's retention deletes a few chunks
        thread.append(UserMessage(content=f"after {i}"))
    stats = thread.stats()
    assert stats.deleted_before_sequence > 90 and stats.stored_messages < 60
    scores = raw_client.zrange(thread.keys.pairs, 0, -1, withscores=True)
    assert scores and min(score for _, score in scores) >= stats.deleted_before_sequence
    assert open_pair_ids(raw_client, thread) == {"c:pending"}
    thread.append(answer("pending"))
    intact(raw_client, thread, window_size=4, chunk_size=4, retained_message_limit=8)


def test_a_replacement_keeps_what_the_message_opens_and_answers(make_thread, raw_client, namespace):
    thread = make_thread("replace", window_size=2, chunk_size=2, **STRICT)
    user, tool_call, result = thread.append([UserMessage(content="q"), call("c1"), answer("c1")])
    thread.append(
        [UserMessage(content=f"roll {i}") for i in range(4)]
    )  # the call is in a chunk now
    thread.replace(tool_call.id, call("c1"))
    thread.replace(result.id, answer("c1").model_copy(update={"tool_return": "5 °C"}))
    thread.replace(user.id, UserMessage(content="q, reworded"))
    refused_unchanged(raw_client, namespace, lambda: thread.replace(tool_call.id, call("c2")))
    refused_unchanged(raw_client, namespace, lambda: thread.replace(user.id, answer("c1")))
    refused_unchanged(
        raw_client, namespace, lambda: thread.replace(result.id, UserMessage(content="no result"))
    )
    intact(raw_client, thread, window_size=2, chunk_size=2)


def test_removing_a_turn_keeps_the_pairs(make_thread, raw_client, namespace):
    thread = make_thread("turns", **STRICT)
    thread.append(call("early"))
    thread.start_turn("t1")
    thread.append([call("inner"), answer("inner"), answer("early")], turn_id="t1")
    thread.finish_turn("t1")
    thread.start_turn("t2")
    thread.append(call("late"), turn_id="t2")
    thread.finish_turn("t2")
    thread.append(answer("late"))
    # t2's call is answered after it: removing t2 would orphan that answer.
    assert "tool call late" in refused_unchanged(
        raw_client, namespace, lambda: thread.remove_turn("t2")
    )
    # t1 answered a call made before it: that call is open again, its own pair is gone.
    assert thread.remove_turn("t1") == 3
    assert open_pair_ids(raw_client, thread) == {"c:early"}
    thread.append(answer("early"))
    with pytest.raises(errors.HistoryConflict):
        thread.append(answer("inner"))
    intact(raw_client, thread)


def test_a_thread_checked_before_answers_kept_their_calls_is_removed_by_its_whole_state(
    make_thread, raw_client, namespace
):
    """A thread whose state was written before answers kept their calls ('o' members, meta
    checked 1) is planned from every record, as then: the same refusals, the same reopening."""
    thread = make_thread("older-state", **STRICT)
    thread.append(call("early"))
    thread.start_turn("t1")
    thread.append([call("inner"), answer("inner"), answer("early")], turn_id="t1")
    thread.finish_turn("t1")
    thread.start_turn("t2")
    thread.append(call("late"), turn_id="t2")
    thread.finish_turn("t2")
    thread.append(answer("late"))
    links = [m for m in raw_client.zrange(thread.keys.pairs, 0, -1) if m.startswith(b"o")]
    assert len(links) == 3
    raw_client.zrem(thread.keys.pairs, *links)
    raw_client.hset(thread.keys.meta, "checked", "1")
    assert thread.stats().history_checked
    assert "tool call late" in refused_unchanged(
        raw_client, namespace, lambda: thread.remove_turn("t2")
    )
    assert thread.remove_turn("t1") == 3
    assert open_pair_ids(raw_client, thread) == {"c:early"}
    thread.append(answer("early"))


def test_a_turn_larger_than_one_removal_step_is_removed_with_its_pairs(make_thread, raw_client):
    from kvstore._engine.operation import REMOVE_TURN_STEP

    thread = make_thread("big-turn", **STRICT)
    thread.start_turn("t")
    pairs = (REMOVE_TURN_STEP // 2) + 5
    for start in range(0, pairs, 100):
        thread.append(
            [
                m
                for i in range(start, min(pairs, start + 100))
                for m in (call(f"s{i}"), answer(f"s{i}"))
            ],
            turn_id="t",
        )
    thread.append(call("open-at-the-end"), turn_id="t")
    assert thread.remove_turn("t") == 2 * pairs + 1
    assert raw_client.zcard(thread.keys.pairs) == 0


# --- the property: the store accepts exactly what a model of open calls accepts -----------------

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.integers(0, 5)),
        st.tuples(st.just("answer"), st.integers(0, 5)),
        st.tuples(st.just("approve"), st.integers(0, 5)),
        st.tuples(st.just("user"), st.just(0)),
        st.tuples(st.just("batch"), st.integers(0, 5)),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
def test_the_store_refuses_exactly_the_answers_to_nothing_open(
    make_thread, raw_client, namespace, steps
):
    import uuid

    thread = make_thread(f"p-{uuid.uuid4().hex[:8]}", window_size=3, chunk_size=2, **STRICT)
    open_calls: set[str] = set()
    pending: set[str] = set()
    stored = 0
    for kind, n in steps:
        name = f"c{n}"
        if kind == "call":
            batch, accepted = [call(name)], True
            after = (open_calls | {name}, pending)
        elif kind == "approve":
            batch, accepted = [approval_request(name)], True
            after = (open_calls | {name}, pending | {name})
        elif kind == "answer":
            if name in pending:
                batch, accepted = [approval(name)], True
                after = (open_calls, pending - {name})
            else:
                batch, accepted = [answer(name)], name in open_calls
                after = (open_calls - {name}, pending)
        elif kind == "batch":
            batch, accepted = [call(name), answer(name), UserMessage(content="and")], True
            after = (open_calls - {name}, pending)
        else:
            batch, accepted, after = [UserMessage(content="hi")], True, (open_calls, pending)
        if accepted:
            thread.append(batch)
            open_calls, pending = after
            stored += len(batch)
        else:
            refused_unchanged(raw_client, namespace, lambda batch=batch: thread.append(batch))
        expected = {f"c:{c}" for c in open_calls} | {f"p:{c}" for c in pending}
        assert {t for t in open_pair_ids(raw_client, thread) if not t.startswith("a:")} == expected
    assert thread.stats().stored_messages == stored
    intact(raw_client, thread, window_size=3, chunk_size=2)


# --- restore and fork ---------------------------------------------------------------------------


def test_a_fork_by_a_strict_store_is_checked_with_the_calls_open_at_its_fork_point(
    make_thread, raw_client, namespace
):
    source = make_thread("source", window_size=4, chunk_size=2, **STRICT)
    source.append([UserMessage(content="q"), call("f1"), answer("f1"), call("f2")])
    (fork_point,) = source.append(call("f3"))
    source.append(answer("f2"))
    fork = source.fork("forked", at=fork_point.id)
    assert fork.stats().history_checked
    assert open_pair_ids(raw_client, fork) == {"c:f2", "c:f3"}
    refused_unchanged(raw_client, namespace, lambda: fork.append(answer("f1")))
    fork.append(answer("f2"))


def export_text(store, thread_id: str) -> str:
    out = io.StringIO()
    backup.export(store, thread_id, out, progress_out=io.StringIO())
    return out.getvalue()


def restore_text(store, thread_id: str, text: str) -> None:
    backup.import_lines(
        store, thread_id, io.StringIO(text), backup.ImportProgress(), progress_out=io.StringIO()
    )


def test_a_restore_by_a_strict_store_builds_the_open_calls_and_refuses_nothing(
    server_only, server, raw_client, namespace
):
    source_store = MessageStore.from_url(
        server.url, StoreConfig(namespace=namespace, window_size=4, chunk_size=2)
    )
    target = MessageStore.from_url(
        server.url, StoreConfig(namespace=namespace, window_size=4, chunk_size=2, **STRICT)
    )
    source = source_store.thread("source")
    source.append(
        [UserMessage(content="q"), call("f1"), answer("f1"), call("f2"), call("f3"), answer("f2")]
    )
    # An answer naming a call the thread never held: a backup holds what it holds.
    source.append(answer("ghost"))
    restore_text(target, "restored", export_text(source_store, "source"))
    restored = target.thread("restored")
    assert restored.stats().history_checked and restored.stats().stored_messages == 7
    assert open_pair_ids(raw_client, restored) == {"c:f3"}
    refused_unchanged(raw_client, namespace, lambda: restored.append(answer("f2")))
    restored.append(answer("f3"))
    intact(raw_client, restored, window_size=4, chunk_size=2)
    # A restore by a store without checks leaves the thread unchecked.
    restore_text(source_store, "plain", export_text(source_store, "source"))
    assert not source_store.thread("plain").stats().history_checked
    source_store.close()
    target.close()


def test_a_call_resent_by_redis_py_is_a_replay_not_a_second_answer(make_thread):
    """redis-py sends a timed-out command again as it was: the answer it carries was stored by
    the first run, and the second run is a replay (checked before the history is)."""
    from kvstore._engine import core as _core
    from kvstore._engine.executor import send_request

    thread = make_thread("resent", **STRICT)
    thread.append(call("r1"))
    inner = getattr(thread, "_thread", thread)
    request = next(_core.append(inner._ref, [answer("r1"), AssistantMessage(content="done")], None))

    def execute():
        result = send_request(inner._store, request)
        return thread._loop.run_until_complete(result) if hasattr(result, "__await__") else result

    assert [int(x) for x in execute()] == [1, 2]
    assert int(execute()[0]) == 0  # a replay: nothing stored again, nothing refused
    assert thread.stats().stored_messages == 3


# --- bounded work -------------------------------------------------------------------------------

# Shadows redis.call in one script run, counting every element the script's commands reply; the
# count goes to a key the test reads. The script's own logic is left as it is.
COUNTING = """
local __call = redis.call
local redis = setmetatable({call = function(...)
  local reply = __call(...)
  if type(reply) == 'table' then __call('INCRBY', COUNTER, #reply) end
  return reply
end}, {__index = redis})
"""


def removal_reads(
    raw_client, config: StoreConfig, thread_id: str, turn_id: str
) -> tuple[int, list]:
    """Runs lua/remove_turn.lua as the store sends it, returning the elements its commands read
    and its reply."""
    from kvstore._engine.core import ThreadRef
    from kvstore._engine.operation import REMOVE_TURN_STEP
    from kvstore._engine.scripts import SCRIPTS

    ref = ThreadRef.of(config, thread_id)
    counter = f"{config.namespace}:elements-read"
    body = SCRIPTS["remove_turn"].source.split("\n", 1)[1]
    raw_client.delete(counter)
    reply = raw_client.eval(
        COUNTING.replace("COUNTER", repr(counter)) + body,
        len(ref.script_keys),
        *ref.script_keys,
        *SCRIPTS["remove_turn"].args(
            limits=ref.limits(), turn_id=turn_id, max_messages=REMOVE_TURN_STEP
        ),
    )
    return int(raw_client.get(counter) or 0), reply


def test_remove_turn_on_a_checked_thread_reads_what_the_turn_holds_not_the_thread(
    server_only, backend, raw_client, namespace
):
    """The removal's reads of the pairs state are bounded by the turn, whatever the thread's
    length: a turn of 4 messages costs as much after 40 earlier messages as after 2,000."""
    from ..conftest import make_sync_store

    reads = []
    for thread_id, earlier_pairs in (("short", 20), ("long", 1000)):
        config = StoreConfig(namespace=namespace, **STRICT)
        store = make_sync_store(backend, config)
        thread = store.thread(thread_id)
        for start in range(0, earlier_pairs, 100):
            thread.append(
                [
                    m
                    for i in range(start, start + 100 if earlier_pairs > 100 else earlier_pairs)
                    for m in (call(f"e{i}"), answer(f"e{i}"))
                ]
            )
        thread.append(call("before-the-turn"))
        thread.start_turn("t")
        thread.append(
            [call("x"), answer("x"), answer("before-the-turn"), AssistantMessage(content="done")],
            turn_id="t",
        )
        thread.finish_turn("t")
        read, reply = removal_reads(raw_client, config, thread_id, "t")
        assert [int(v) for v in reply] == [4, 0]
        assert open_pair_ids(raw_client, thread) == {"c:before-the-turn"}
        reads.append(read)
        store.close()
    assert reads[0] == reads[1], reads


def test_a_call_answered_in_a_removed_turn_reopens_without_moving_a_reused_open_call(
    make_thread, raw_client
):
    """[1 call x] [turn: 2 return x] [3 call x, still open]: removing the turn opens the first
    call again, and the pair id stays where its open use put it (3), so retention of message 1
    does not close the call message 3 made."""
    thread = make_thread("reused", **STRICT)
    thread.append(call("x"))
    thread.start_turn("t")
    thread.append(answer("x"), turn_id="t")
    thread.finish_turn("t")
    thread.append(call("x"))
    assert thread.remove_turn("t") == 1
    assert raw_client.zscore(thread.keys.pairs, "c:x") == 3
    thread.append(answer("x"))
    intact(raw_client, thread)


TURN_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["call", "answer", "user", "turn"]), st.integers(0, 3), st.booleans()
    ),
    min_size=1,
    max_size=20,
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=TURN_STEPS, removed=st.integers(0, 5))
def test_removing_a_turn_by_its_own_state_decides_as_reading_the_whole_state(
    make_thread, raw_client, namespace, steps, removed
):
    """The bounded plan (the turn's scores, its answers' links) refuses and reopens exactly as
    the plan from every record does, on twin threads (one marked as checked before links)."""
    import uuid

    twins = [
        make_thread(f"twin-{uuid.uuid4().hex[:8]}", window_size=3, chunk_size=2, **STRICT)
        for _ in range(2)
    ]
    open_calls: set[str] = set()
    turns: list[str] = []
    for kind, n, in_turn in steps:
        name = f"c{n}"
        if kind == "call" and name not in open_calls:  # a call id is made again once answered
            batch, open_calls = [call(name)], open_calls | {name}
        elif kind == "answer" and name in open_calls:
            batch, open_calls = [answer(name)], open_calls - {name}
        elif kind == "turn":
            turns.append(f"t{len(turns)}")
            for thread in twins:
                thread.start_turn(turns[-1])
            continue
        else:
            batch = [UserMessage(content="hi")]
        turn_id = turns[-1] if in_turn and turns else None
        for thread in twins:
            thread.append([m.model_copy() for m in batch], turn_id=turn_id)
    links = [m for m in raw_client.zrange(twins[1].keys.pairs, 0, -1) if m.startswith(b"o")]
    if links:
        raw_client.zrem(twins[1].keys.pairs, *links)
    raw_client.hset(twins[1].keys.meta, "checked", "1")
    if not turns:
        return
    turn_id = turns[removed % len(turns)]
    outcomes = []
    for thread in twins:
        try:
            outcomes.append(("removed", thread.remove_turn(turn_id)))
        except errors.HistoryConflict:
            outcomes.append(("refused", None))
        outcomes.append(open_pair_ids(raw_client, thread))
    assert outcomes[:2] == outcomes[2:]
