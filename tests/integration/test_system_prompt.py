"""context() keeps the system messages a thread starts with, counted against max_tokens, like
the summary (docs/HISTORY.md, "The system prompt"); every backend, sync and async."""

from __future__ import annotations

import io
import json

import pytest

from kvstore import AssistantMessage, StoreConfig, SystemMessage, UserMessage, errors
from kvstore._engine.backup import BackedUpMessage, BackupState, restore_state
from kvstore._engine.core import Eval, ThreadRef, context
from kvstore._engine.views import context as history_context
from kvstore.cli import backup

from ..conftest import make_sync_store
from ..support.layout_check import check_layout
from .test_context_start import start_reads
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
    """The system messages are read in one more round trip (the chunk holding them), only when
    what context() read does not hold the thread's first message."""
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append(SystemMessage(content="rules"), tokens=[3])
    thread.append([UserMessage(content=f"m{i}") for i in range(40)], tokens=[1] * 40)
    for budget, extra in ((None, 0), (10**6, 0), (10, 2)):
        # New handles: no guess of the last plan's chunks (budget.py) in either count.
        found, requests = drive(store, context(ThreadRef.of(config, "t"), budget))
        _, planner = drive(store, history_context(ThreadRef.of(config, "t"), budget))
        # Cut: the start's read, then the history again with what the system messages leave
        # (its plan may find the chunks it needs read ahead: one round trip).
        if extra:
            assert len(planner) + 1 < len(requests) <= len(planner) * 2 + 1
        else:
            assert len(requests) == len(planner)
        assert found[0].content == "rules"
        if extra:
            assert start_reads(requests) == 1
            assert [m.content for m in found] == ["rules", *[f"m{i}" for i in range(33, 40)]]
    store.close()


def test_retention_past_the_start_keeps_the_system_messages(make_thread):
    """Retention deletes the chunks a compaction covers; the leading system messages among them
    stay in every context(), budgeted or not, and the history pages still start after them."""
    thread = make_thread(window_size=8, chunk_size=4, retained_message_limit=4)
    thread.append([SystemMessage(content="rules"), SystemMessage(content="more")], tokens=[3, 3])
    thread.append([UserMessage(content=f"m{i}") for i in range(40)], tokens=[1] * 40)
    thread.compact("what was said", last_sequence=36, tokens=2)
    assert thread.stats().deleted_before_sequence is not None
    expected = ["rules", "more", "what was said", "m34", "m35", "m36", "m37", "m38", "m39"]
    assert [getattr(m, "content", None) or m.summary for m in thread.context()] == expected
    budgeted = thread.context(max_tokens=10)
    assert [getattr(m, "content", None) or m.summary for m in budgeted] == [
        "rules",
        "more",
        "what was said",
        "m38",
        "m39",
    ]
    assert all(m.message_type != "system_message" for m in thread.list(limit=50).messages)


def contents(messages) -> list[str]:
    return [getattr(m, "content", None) or m.summary for m in messages]


def test_a_prompt_across_chunks_is_kept_as_retention_reaches_each(backend, namespace, raw_client):
    """Six system messages in chunks of four: a compaction whose retention deletes the first
    chunk only keeps the run open, and what is kept and what is still stored read as one
    prompt; the next compaction (one chunk a call) keeps the rest."""
    config = StoreConfig(
        namespace=namespace,
        window_size=8,
        chunk_size=4,
        retained_message_limit=4,
        max_chunks_per_call=1,
    )
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([SystemMessage(content=f"rule {i}") for i in range(6)], tokens=[2] * 6)
    thread.append([UserMessage(content=f"m{i}") for i in range(30)], tokens=[1] * 30)
    rules = [f"rule {i}" for i in range(6)]
    thread.compact("early", last_sequence=4, tokens=1)
    keys = ThreadRef.of(config, "t").keys
    assert thread.stats().deleted_before_sequence == 5
    assert raw_client.hget(keys.meta, "prompt") == b"open"
    assert contents(thread.context())[:7] == [*rules, "early"]
    assert contents(thread.context(max_tokens=14)) == [*rules, "early", "m29"]
    thread.compact("so far", last_sequence=32, tokens=1)
    assert thread.stats().deleted_before_sequence > 6
    assert raw_client.hget(keys.meta, "prompt") == b"closed"
    # The earlier summary is a message after the range the new one covers.
    after = ["m26", "m27", "m28", "m29", "early"]
    assert contents(thread.context()) == [*rules, "so far", *after]
    assert contents(thread.context(max_tokens=14)) == [*rules, "so far", "early"]
    store.close()


def test_a_run_ended_before_retention_keeps_only_the_leading_messages(
    backend, namespace, raw_client
):
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4, retained_message_limit=4)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append(SystemMessage(content="rules"))
    thread.append(UserMessage(content="hi"))
    thread.append(SystemMessage(content="a later note"))
    thread.append([UserMessage(content=f"m{i}") for i in range(20)])
    thread.compact("so far", last_sequence=19)
    assert contents(thread.context()) == ["rules", "so far", "m16", "m17", "m18", "m19"]
    keys = ThreadRef.of(config, "t").keys
    assert raw_client.hget(keys.meta, "prompt") == b"closed"
    assert raw_client.get(keys.prompt_data).count(b"system_message") == 1
    store.close()


def test_a_thread_starting_without_a_system_message_keeps_no_prompt(backend, namespace, raw_client):
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4, retained_message_limit=4)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([UserMessage(content=f"m{i}") for i in range(20)])
    thread.compact("so far", last_sequence=16)
    keys = ThreadRef.of(config, "t").keys
    assert raw_client.exists(keys.prompt_manifest, keys.prompt_data) == 0
    assert contents(thread.context())[0] == "so far"
    store.close()


def test_an_oversized_system_message_is_kept(backend, namespace):
    config = StoreConfig(
        namespace=namespace,
        window_size=8,
        chunk_size=4,
        chunk_max_bytes=4096,
        retained_message_limit=4,
    )
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    big = "x" * 10_000
    thread.append([SystemMessage(content=big), SystemMessage(content="short")])
    thread.append([UserMessage(content=f"m{i}") for i in range(20)])
    thread.compact("so far", last_sequence=18)
    assert thread.stats().deleted_before_sequence is not None
    assert contents(thread.context())[:3] == [big, "short", "so far"]
    store.close()


def test_the_kept_prompt_goes_with_the_thread_and_keeps_its_deadline(
    backend, namespace, raw_client
):
    config = StoreConfig(
        namespace=namespace, window_size=8, chunk_size=4, retained_message_limit=4, thread_ttl=3600
    )
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append(SystemMessage(content="rules"))
    thread.append([UserMessage(content=f"m{i}") for i in range(20)])
    thread.compact("so far", last_sequence=16)
    keys = ThreadRef.of(config, "t").keys
    deadline = raw_client.pexpiretime(keys.meta)
    assert deadline > 0
    assert raw_client.pexpiretime(keys.prompt_manifest) == deadline
    assert raw_client.pexpiretime(keys.prompt_data) == deadline
    thread.delete()
    assert raw_client.keys(f"{namespace}*") == []
    store.close()


def prompt_thread(store, thread_id: str = "t"):
    thread = store.thread(thread_id)
    thread.append([SystemMessage(content="rules"), SystemMessage(content="more")], tokens=[3, 3])
    thread.append([UserMessage(content=f"m{i}") for i in range(20)], tokens=[1] * 20)
    thread.compact("so far", last_sequence=18, tokens=2)
    assert thread.stats().deleted_before_sequence is not None
    return thread


def test_a_fork_past_retention_keeps_the_prompt(backend, namespace, raw_client):
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4, retained_message_limit=4)
    store = make_sync_store(backend, config)
    source = prompt_thread(store)
    fork = source.fork("f", source.stats().next_sequence - 1)  # at the summary
    assert contents(fork.context()) == ["rules", "more", "so far", "m16", "m17", "m18", "m19"]
    assert contents(fork.context(max_tokens=9)) == ["rules", "more", "so far", "m19"]
    check_layout(raw_client, fork.keys, config)
    fork.delete()
    assert raw_client.keys(f"{namespace}:{{f}}*") == []
    store.close()


def test_an_export_and_import_past_retention_keeps_the_prompt(backend, namespace, raw_client):
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4, retained_message_limit=4)
    store = make_sync_store(backend, config)
    source = prompt_thread(store)
    out = io.StringIO()
    backup.export(store, "t", out, progress_out=io.StringIO())
    header = json.loads(out.getvalue().splitlines()[0])
    assert header["prompt"]["state"] == "closed"
    assert [m["message"]["content"] for m in header["prompt"]["messages"]] == ["rules", "more"]
    progress = backup.ImportProgress()
    backup.import_lines(
        store, "r", io.StringIO(out.getvalue()), progress, progress_out=io.StringIO()
    )
    restored = store.thread("r")
    assert contents(restored.context()) == contents(source.context())
    assert [m.to_dict() for m in restored.context(max_tokens=9)] == [
        m.to_dict() for m in source.context(max_tokens=9)
    ]
    check_layout(raw_client, restored.keys, config)
    store.close()


def test_a_restore_with_a_prompt_it_cannot_hold_is_refused_before_the_socket(backend, namespace):
    config = StoreConfig(namespace=namespace)
    store = make_sync_store(backend, config)
    ref = ThreadRef.of(config, "t")
    state = BackupState(last_seq=5, deleted_before=3, prompt_state="open")
    requests = []
    store._on_request = requests.append
    for prompt in (
        [BackedUpMessage(3, None, SystemMessage(content="at deleted_before"))],
        [
            BackedUpMessage(2, None, SystemMessage(content="b")),
            BackedUpMessage(1, None, SystemMessage(content="a")),
        ],
    ):
        state.prompt = prompt
        with pytest.raises(errors.InvalidMessage):
            store.run(restore_state(ref, state))
    state.prompt, state.prompt_state = [BackedUpMessage(1, None, SystemMessage(content="a"))], ""
    with pytest.raises(errors.InvalidMessage):
        store.run(restore_state(ref, state))
    assert requests == []
    store.close()


def test_past_retention_the_prompt_costs_no_round_trip_of_its_own(backend, namespace):
    """Once retention passed the thread's start (and the run of system messages ended), the
    kept prompt is read in the history's first round trip: no request more than the history's,
    with or without a prompt kept (with one and a budget, the history is read again for what
    the prompt leaves, as before)."""
    config = StoreConfig(namespace=namespace, window_size=8, chunk_size=4, retained_message_limit=4)
    store = make_sync_store(backend, config)
    prompt_thread(store, "p")
    plain = store.thread("n")
    plain.append([UserMessage(content=f"m{i}") for i in range(20)], tokens=[1] * 20)
    plain.compact("so far", last_sequence=16, tokens=2)
    for thread_id, system in (("n", 0), ("p", 2)):
        for budget in (None, 10**6, 9):
            # New handles: no guess of the last plan's chunks (budget.py) in either count.
            found, requests = drive(store, context(ThreadRef.of(config, thread_id), budget))
            _, planner = drive(store, history_context(ThreadRef.of(config, thread_id), budget))
            if system and budget is not None:
                # Read again for what the prompt leaves (its plan may find its chunks read
                # ahead: one round trip).
                assert len(planner) < len(requests) <= 2 * len(planner), (thread_id, budget)
            else:
                assert len(requests) == len(planner), (thread_id, budget)
            assert not [
                r for r in requests if isinstance(r, Eval) and r.script.name == "read_range"
            ]
            assert [m.content for m in found[:system]] == ["rules", "more"][:system]
    store.close()


def test_a_removed_turn_leaves_the_kept_prompt(make_thread):
    """remove_turn removes a turn's messages wherever they are stored: the ones retention kept
    aside as the prompt too. The prompt's other messages stay."""
    thread = make_thread(chunk_size=2, retained_message_limit=2)
    thread.append([SystemMessage(content="secret")], turn_id="turn-1")
    thread.append([SystemMessage(content="rules")], turn_id="turn-2")
    thread.append([UserMessage(content=f"m{i}") for i in range(6)])
    thread.compact("so far", last_sequence=7)
    assert thread.stats().deleted_before_sequence is not None
    assert contents(thread.context())[:2] == ["secret", "rules"]
    stored = thread.stats()
    assert thread.remove_turn("turn-1") == 1  # the kept message counts as removed
    assert thread.remove_turn("turn-1") == 0
    assert contents(thread.context()) == ["rules", "so far", "m5"]
    assert contents(thread.context(max_tokens=1)) == ["rules", "so far"]
    assert "secret" not in contents(thread.fork("copy", at=9).context())
    # Retention had taken them from the history already: the counts do not move again.
    after = thread.stats()
    assert (after.stored_messages, after.tokens) == (stored.stored_messages, stored.tokens)
    thread.remove_turn("turn-2")
    assert contents(thread.context()) == ["so far", "m5"]


def test_removing_every_kept_prompt_message_leaves_no_prompt_keys(backend, namespace, raw_client):
    config = StoreConfig(namespace=namespace, chunk_size=2, retained_message_limit=2)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([SystemMessage(content="a"), SystemMessage(content="b")], turn_id="turn-1")
    thread.append([UserMessage(content=f"m{i}") for i in range(6)])
    thread.compact("so far", last_sequence=7)
    keys = ThreadRef.of(config, "t").keys
    assert raw_client.exists(keys.chunk_prefix + "prompt:m")
    events = len(raw_client.xrange(keys.events))
    assert thread.remove_turn("turn-1") == 2
    # One event tells the watchers, as for any removal.
    (last,) = raw_client.xrange(keys.events)[events:]
    assert (last[1][b"k"], last[1][b"t"], last[1][b"n"]) == (b"turn_removed", b"turn-1", b"2")
    assert not raw_client.exists(keys.chunk_prefix + "prompt:m", keys.chunk_prefix + "prompt:d")
    assert contents(thread.context()) == ["so far", "m5"]
    check_layout(raw_client, keys, config)
    buffer = io.StringIO()
    backup.export(store, "t", buffer, progress_out=io.StringIO())
    assert '"a"' not in buffer.getvalue() and '"b"' not in buffer.getvalue()
    store.close()
