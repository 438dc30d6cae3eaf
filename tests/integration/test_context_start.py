"""context() looks at the thread's start in its first round trip (kvstore/_engine/system_start.py):
when sequence 1 is stored at the start of a chunk and is no system message, no message leads the
thread as its prompt and no read of the start is sent; when it is a system message, the chunk is
read whole once and the handle keeps the run, read fresh in the first round trip from then on.
Any other start is read as before (lua/read_range.lua), and the context is the same either way
(docs/HISTORY.md, "The system prompt")."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, StoreConfig, SystemMessage, UserMessage
from kvstore._engine.core import Batch, Eval, ThreadRef, context
from kvstore._engine.system_prompt import LEADING_SYSTEM_LIMIT
from kvstore._engine.views import context as history_context

from ..conftest import make_sync_store
from ..support.old_release import run_previous
from .test_page_reads import drive
from .test_tokens import users


def start_reads(requests) -> int:
    """How many reads of the thread's start the requests hold: lua/read_range.lua, or one
    atomic read of the chunk holding sequence 1 (MGET of chunk:1's strings or the open chunk's)."""
    return sum(
        (isinstance(r, Eval) and r.script.name == "read_range")
        or (
            isinstance(r, Batch)
            and len(r.commands) == 1
            and r.commands[0][0] == "MGET"
            and r.commands[0][1].endswith((":chunk:1:m", ":open:m"))
        )
        for r in requests
    )


def leading(thread) -> list[str]:
    """The reference: the ids of the system messages the thread starts with, by a full read."""
    run = []
    for message in list(thread.iter())[:LEADING_SYSTEM_LIMIT]:
        if message.message_type != "system_message":
            break
        run.append(message.id)
    return run


def landing(store, operation, before, write):
    """Drives `operation` as drive() does, its pipelines a command at a time, and runs `write`
    once, just before the first command `before(commands, position)` picks; returns the
    operation's result (the write must have landed)."""
    sent, landed = [], []

    def recording():
        reply = None
        while True:
            try:
                request = operation.send(reply)
            except StopIteration as done:
                return done.value
            sent.append(request)
            reply = yield request

    def between(index, position):
        if not landed and before(sent[index].commands, position):
            write()
            landed.append(position)

    found, _ = drive(store, recording(), between)
    assert landed
    return found


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
    # Sequence 2 in a chunk of its own: the first chunk alone does not hold the run and what
    # ends it.
    "an oversized user message second": (
        [SystemMessage(content="rules"), UserMessage(content="x" * 9000)],
        None,
    ),
    "an oversized system message second": (
        [SystemMessage(content="rules"), SystemMessage(content="x" * 9000)],
        None,
    ),
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

    def last_start_read(commands, position) -> bool:
        starts = [i for i, c in enumerate(commands) if c[0] == "GETRANGE"]
        if position != max(starts, default=-1):
            return False
        assert commands[position][1] in (ref.keys.open_manifest, ref.keys.open_data)
        return True

    # The append closes the open chunk.
    found = landing(store, context(ref, 30), last_start_read, lambda: thread.append(users(1, 7)))
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


def prompt_chat(store, length=60):
    thread = store.thread("t")
    thread.append([SystemMessage(content="rules"), SystemMessage(content="more")], tokens=[5, 5])
    thread.append(users(length), tokens=[10] * length)
    return thread


def test_a_handle_keeps_the_run_and_reads_it_in_its_first_round_trip(sync_store):
    """A system prompt first: the chunk holding it is read whole once; from then on the run is
    read fresh beside the history, which is planned with what the run leaves: one round trip."""
    store, config = sync_store
    prompt_chat(store)
    ref = ThreadRef.of(config, "t")
    for budget in (40, 60, 110):
        first, requests = drive(store, context(ref, budget))
        again, requests = drive(store, context(ref, budget))
        assert len(requests) == 1 and start_reads(requests) == 0, budget
        fresh, _ = drive(store, context(ThreadRef.of(config, "t"), budget))
        assert again == first == fresh
        assert [m.content for m in again[:2]] == ["rules", "more"]
        assert len(again) == 2 + (budget - 10) // 10


# Writes that change a kept run, or what settles it: (name, what is done).
CHANGES = [
    (
        "a run message rewritten, same size",
        lambda t, ids: t.replace(ids[0], SystemMessage(content="RULES")),
    ),
    (
        "a run message longer",
        lambda t, ids: t.replace(ids[1], SystemMessage(content="more, longer")),
    ),
    ("a run message a user's now", lambda t, ids: t.replace(ids[1], UserMessage(content="more"))),
    ("the next message a system one", lambda t, ids: t.replace(ids[2], SystemMessage(content="x"))),
    ("the first turn removed", lambda t, ids: t.remove_turn("opening")),
    (
        "compacted, retention begun",
        lambda t, ids: t.compact("so far", t.stats().next_sequence - 3, tokens=3),
    ),
    ("the open chunk closed", lambda t, ids: t.append(users(20, 100), tokens=[10] * 20)),
]


@pytest.mark.parametrize("change", [c[1] for c in CHANGES], ids=[c[0] for c in CHANGES])
@pytest.mark.parametrize("length", [5, 60], ids=["open chunk", "closed chunk"])
def test_a_kept_run_that_changed_is_read_again(backend, namespace, change, length):
    """Whatever changed, the handle that keeps the run gives what a new handle gives, on this
    read and the next."""
    config = StoreConfig(namespace=namespace, chunk_size=8, window_size=8, retained_message_limit=8)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append(SystemMessage(content="rules"), tokens=[5], turn_id="opening")
    thread.append(SystemMessage(content="more"), tokens=[5])
    thread.append(users(length), tokens=[10] * length)
    ids = [m.id for m in thread.list(limit=3).messages]
    ref = ThreadRef.of(config, "t")
    for budget in (40, None):
        drive(store, context(ref, budget))
        drive(store, context(ref, budget))
    change(thread, ids)
    for budget in (40, 3, 10**6, None, 40):
        kept, _ = drive(store, context(ref, budget))
        fresh, _ = drive(store, context(ThreadRef.of(config, "t"), budget))
        assert kept == fresh, budget
    assert [m.id for m in kept[: len(leading(thread))]] == leading(thread)
    store.close()


def test_a_thread_written_again_under_a_kept_run_is_read(sync_store):
    store, config = sync_store
    prompt_chat(store)
    ref = ThreadRef.of(config, "t")
    drive(store, context(ref, 40))
    store.thread("t").delete()
    thread = store.thread("t")
    thread.append(SystemMessage(content="other rules, of another size"), tokens=[5])
    thread.append(users(60), tokens=[10] * 60)
    found, _ = drive(store, context(ref, 40))
    assert [m.content for m in found][:1] == ["other rules, of another size"]
    assert found == drive(store, context(ThreadRef.of(config, "t"), 40))[0]


@pytest.mark.parametrize("rewritten", ["r", "the rule, rewritten longer"])
def test_a_rewrite_between_the_runs_records_and_its_lines_reads_the_start(
    backend, namespace, rewritten
):
    """The run's records are read before its manifest lines: a message of it rewritten in
    between shows other lines, and the start is read again (never the lines of one state cut
    over the records of another). The run is 16 long, so no record after it is looked at."""
    config = StoreConfig(namespace=namespace, chunk_size=32, window_size=32)
    store = make_sync_store(backend, config)
    thread = store.thread("t")
    thread.append([SystemMessage(content=f"rule {i}") for i in range(16)], tokens=[2] * 16)
    thread.append(users(40), tokens=[10] * 40)
    last = thread.list(limit=16).messages[-1].id
    ref = ThreadRef.of(config, "t")
    drive(store, context(ref, 80))
    assert ref.hints["context_start"].next_line == b""  # the run kept, 16 long

    def between_the_runs_reads(commands, position) -> bool:
        starts = [i for i, c in enumerate(commands) if c[0] == "GETRANGE"]
        return len(starts) == 2 and position == starts[1]

    rewrite = lambda: thread.replace(last, SystemMessage(content=rewritten))  # noqa: E731
    found = landing(store, context(ref, 80), between_the_runs_reads, rewrite)
    assert [m.content for m in found[:16]] == [f"rule {i}" for i in range(15)] + [rewritten]
    assert found == drive(store, context(ThreadRef.of(config, "t"), 80))[0]
    store.close()
