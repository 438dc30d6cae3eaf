"""context() looks at the thread's first record in its first round trip: when it is stored at the
start of a chunk and is no system message, no message leads the thread as its prompt and the
read of the thread's start (lua/read_range.lua) is not sent. Any other start is read as before,
and the context is the same either way (docs/HISTORY.md, "The system prompt")."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, StoreConfig, SystemMessage, UserMessage
from kvstore._engine.core import Eval, ThreadRef, context
from kvstore._engine.system_prompt import LEADING_SYSTEM_LIMIT
from kvstore._engine.views import context as history_context

from ..conftest import make_sync_store
from ..support.old_release import run_previous
from .test_page_reads import drive
from .test_tokens import users


def start_reads(requests) -> int:
    """How many reads of the thread's start the requests hold."""
    return sum(isinstance(r, Eval) and r.script.name == "read_range" for r in requests)


def leading(thread) -> list[str]:
    """The reference: the ids of the system messages the thread starts with, by a full read."""
    run = []
    for message in list(thread.iter())[:LEADING_SYSTEM_LIMIT]:
        if message.message_type != "system_message":
            break
        run.append(message.id)
    return run


@pytest.fixture
def sync_store(backend, namespace):
    config = StoreConfig(namespace=namespace, chunk_size=8, window_size=8)
    store = make_sync_store(backend, config)
    yield store, config
    store.close()


@pytest.mark.parametrize("count", [6, 60], ids=["open chunk", "closed chunk"])
def test_a_plain_first_message_costs_no_read_of_the_start(sync_store, count):
    """The first message in the open chunk (6 messages) or in the first closed chunk (60): the
    context takes the history's round trips only, and a later system message leads nothing."""
    store, config = sync_store
    thread = store.thread("t")
    thread.append(users(2), tokens=[10] * 2)
    thread.append(SystemMessage(content="a later note"), tokens=[10])
    thread.append(users(count - 3, 2), tokens=[10] * (count - 3))
    for budget in (30, 45, None):
        found, requests = drive(store, context(ThreadRef.of(config, "t"), budget))
        expected, planner = drive(store, history_context(ThreadRef.of(config, "t"), budget))
        assert found == expected
        assert len(requests) == len(planner) and start_reads(requests) == 0, budget
    assert thread.context(max_tokens=30)[0].content != "a later note"


def test_a_system_first_message_is_read_and_kept(sync_store):
    store, config = sync_store
    thread = store.thread("t")
    thread.append(SystemMessage(content="rules"), tokens=[5])
    thread.append(users(59), tokens=[10] * 59)
    found, requests = drive(store, context(ThreadRef.of(config, "t"), 30))
    assert start_reads(requests) == 1
    assert found[0].content == "rules" and len(found) == 3


# Each way a thread's start can look (its first messages, then what is done to them): what the
# first bytes cannot settle is read.
CASES = {
    "system first": ([SystemMessage(content="rules")], None),
    "user first": ([UserMessage(content="hi")], None),
    "many fields": ([UserMessage(content="hi", **{f"x_{i}": "v" for i in range(20)})], None),
    "system of many fields": (
        [SystemMessage(content="rules", **{f"x_{i}": "v" for i in range(20)})],
        None,
    ),
    "oversized user first": ([UserMessage(content="x" * 9000), SystemMessage(content="r")], None),
    "oversized system first": ([SystemMessage(content="x" * 9000)], None),
    "first turn removed": (
        [UserMessage(content="hi"), SystemMessage(content="r"), SystemMessage(content="s")],
        "remove",
    ),
    # Sequence 1 gone, its chunk's first record now a user message, an older system message in
    # a chunk of its own: the chunk's first line is no longer sequence 1.
    "first removed before an oversized system message": (
        [UserMessage(content="hi"), SystemMessage(content="x" * 9000), UserMessage(content="q")],
        "remove",
    ),
    "first replaced by a system message": ([UserMessage(content="hi")], "to system"),
    "system first replaced by a user message": ([SystemMessage(content="rules")], "to user"),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("length", [7, 60], ids=["open chunk", "closed chunk"])
def test_every_start_gives_the_context_a_full_read_gives(make_thread, name, length):
    """Sync and async, the start in the open chunk or in the first closed one: the context's
    leading system messages are the ones a full read finds, and the newest messages follow."""
    first, change = CASES[name]
    thread = make_thread(chunk_size=8, window_size=8, chunk_max_bytes=8192)
    thread.append(first[:1], turn_id="opening" if change == "remove" else None)
    if first[1:]:
        thread.append(first[1:])
    thread.append([AssistantMessage(content=f"a{i}") for i in range(length - len(first))])
    if change == "remove":
        thread.remove_turn("opening")
    elif change is not None:
        replacement = SystemMessage if change == "to system" else UserMessage
        thread.replace(thread.list(limit=1).messages[0].id, replacement(content="now"))
    run = leading(thread)
    rest = [m.id for m in thread.iter() if m.id not in run]
    for budget in (None, 10**6, 40):
        found = [m.id for m in thread.context(max_tokens=budget)]
        assert found[: len(run)] == run, budget
        if budget == 40:  # the newest that fit (none when the run fills it)
            assert found[len(run) :] == rest[len(rest) - len(found) + len(run) :]
        else:
            assert found[len(run) :] == rest


def test_a_close_landing_between_the_first_bytes_and_their_line_reads_the_start(sync_store):
    """The first record is read before the line that says it is sequence 1: a chunk closed in
    between shows another line, and the start is read (never the new open chunk's record taken
    for the thread's first)."""
    store, config = sync_store
    thread = store.thread("t")
    thread.append(SystemMessage(content="rules"), tokens=[5])
    thread.append(users(7), tokens=[10] * 7)  # the open chunk is full: the next append closes it
    ref = ThreadRef.of(config, "t")
    sent, landed = [], []

    def recording(operation):
        """`operation`, its requests kept in `sent` as they go (drive's `between` sees indexes)."""
        reply = None
        while True:
            try:
                request = operation.send(reply)
            except StopIteration as done:
                return done.value
            sent.append(request)
            reply = yield request

    def between(index, position):
        commands = sent[index].commands
        last_start_read = max((i for i, c in enumerate(commands) if c[0] == "GETRANGE"), default=-1)
        if not landed and position == last_start_read:
            assert commands[position][1] in (ref.keys.open_manifest, ref.keys.open_data)
            thread.append(users(1, 7), tokens=[10])  # closes the open chunk
            landed.append(position)

    found, _ = drive(store, recording(context(ref, 30)), between)
    assert landed
    assert found[0].content == "rules"


@pytest.mark.parametrize("first", ["SystemMessage", "UserMessage"])
def test_a_start_layout_2_left_is_read(backend, namespace, server, server_only, first):
    """A thread the previous release wrote (its start in a layout-2 window or hash chunk, the
    open chunk after it once a write made it layout 3): the first bytes settle nothing there."""
    config = dict(window_size=16, chunk_size=4, max_chunks_per_call=1)
    code = f"""
t = store.thread("t")
t.append({first}(content="rules"))
for i in range(30):
    t.append(UserMessage(content="old " + str(i)))
result = None
"""
    assert run_previous(server.url, {"namespace": namespace, **config}, code) is None
    store = make_sync_store(backend, StoreConfig(namespace=namespace, **config))
    thread = store.thread("t")
    thread.append(users(3), tokens=[10] * 3)
    run = leading(thread)
    assert len(run) == (first == "SystemMessage")
    newest = [m.id for m in thread.iter()][-3:]
    found = [m.id for m in thread.context(max_tokens=200)]
    assert found[: len(run)] == run and found[-3:] == newest and len(found) < 20
    store.close()


def test_a_handle_past_retention_reads_no_start_and_a_stale_hint_costs_only_a_read(
    backend, namespace
):
    """Once retention began the kept prompt answers: a handle's next contexts read no start. A
    thread deleted and written again under that handle (a system message first now) is read."""
    config = StoreConfig(namespace=namespace, chunk_size=4, window_size=8, retained_message_limit=4)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append(users(20), tokens=[10] * 20)
    thread.compact("so far", last_sequence=16, tokens=5)
    ref = ThreadRef.of(config, "t")

    def start_bytes(requests) -> int:
        return sum(c[0] == "GETRANGE" for r in requests for c in getattr(r, "commands", ()))

    _, requests = drive(store, context(ref, 30))
    assert start_bytes(requests) == 4
    again, requests = drive(store, context(ref, 30))
    assert start_bytes(requests) == 0 and again[0].summary == "so far"
    thread.delete()
    thread.append(SystemMessage(content="rules"), tokens=[5])
    thread.append(users(30), tokens=[10] * 30)
    found, requests = drive(store, context(ref, 30))
    assert found[0].content == "rules" and start_reads(requests) == 1
    store.close()
