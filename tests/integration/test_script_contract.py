"""Each script's header against what the client sends: real operations on a real server, every
script call they make recorded and checked against the KEYS and ARGV its header states
(tests/support/script_headers.py reads the headers)."""

from __future__ import annotations

import dataclasses
import io
import re
from collections import defaultdict
from importlib import resources
from typing import Any

import pytest

from kvstore import AssistantMessage, MessageStore, StoreConfig, UserMessage
from kvstore._engine.core import Batch, Eval, ThreadRef
from kvstore._engine.executor import record
from kvstore._engine.keys import ThreadKeys
from kvstore._engine.scripts import SCRIPT_NAMES, SCRIPTS
from kvstore.cli import backup as cli_backup

from ..support.script_headers import call_mismatches, header_problems, read_header, script_header
from .test_migration import write_layout_1

# Small sizes, so a few messages make chunks, an oversized chunk and retention; one chunk per
# call, so a compaction that deletes one goes on with the retain script.
SMALL = dict(
    window_size=4,
    chunk_size=2,
    chunk_max_bytes=2048,
    max_chunks_per_call=1,
    retained_message_limit=2,
    thread_ttl=3600,
)


class Recorder(MessageStore):
    """A store that keeps every script call its operations send (a refused one too)."""

    def __init__(self, client: Any, config: StoreConfig) -> None:
        super().__init__(client, config)
        self.calls: list[Eval] = []
        record(self, self._keep)

    def _keep(self, request: Eval | Batch) -> None:
        if isinstance(request, Eval):
            self.calls.append(request)


def run_every_script(store: Recorder, raw_client) -> None:
    """Operations that make every script run, most of them in more than one shape."""
    thread = store.thread("contract")
    thread.start_turn("t1")
    stored = []
    for i in range(5):
        stored += thread.append(
            UserMessage(content=f"m{i} " + "x" * 300, otid=f"o{i}"), turn_id="t1"
        )
    stored += thread.append([AssistantMessage(content="a"), UserMessage(content="b", otid="ob")])
    stored += thread.append(UserMessage(content="B" * 3000), turn_id="t1")  # its own chunk
    thread.append(UserMessage(content="again", otid="o1"))  # a replay, read back by sequence
    thread.finish_turn("t1", "completed")
    for turn_id, outcome in (("t3", "steered"), ("t4", "cancelled"), ("t5", "failed")):
        thread.start_turn(turn_id)
        thread.finish_turn(turn_id, outcome)
    thread.start_turn("t2")
    thread.append([AssistantMessage(content=f"r{i}") for i in range(3)], turn_id="t2")
    # Pages with each kind of bound, walked both ways, of the thread and of a turn.
    for turn_id in (None, "t1"):
        thread.list(after=stored[0].id, limit=2, turn_id=turn_id)
        thread.list(after=stored[0].id, order="desc", limit=2, turn_id=turn_id)
        thread.list(before=stored[5].id, limit=2, turn_id=turn_id)
        thread.list(after=1, before=stored[-1].seq_id, limit=3, turn_id=turn_id)
    thread.get(stored[2].id)
    thread.get_by_otid("o3")
    thread.compact("the first eight", last_sequence=8)  # deletes a chunk, then retain goes on
    thread.replace(stored[-1].id, UserMessage(content="replaced"))
    thread.remove_turn("t2")
    lease = thread.hold_turn("held")  # start_turn's 'hold'
    thread.publish(lease, "a delta")
    thread.append(AssistantMessage(content="held"), turn_id=lease)
    thread.finish_turn(lease)
    thread.snapshot()
    thread.context()
    # The consistent reads (lua/read_range.lua) that page walks and context fall back on.
    from kvstore._engine.reads import read_range

    ref = ThreadRef.of(store.config, "contract")
    store.run(read_range(ref, ("summary", ""), ("", ""), "down", 0, 50, 5))
    oldest, *_, newest = thread.list(limit=3).messages
    store.run(read_range(ref, ("seq", "2"), ("id", newest.id), "up", 3))
    store.run(read_range(ref, ("id", oldest.id), ("seq", "99"), "down", 2))
    store.run(read_range(ref, ("", ""), ("", ""), "up"))
    store.run(read_range(ref, ("", ""), ("", ""), "down", 201, extras="snapshot"))
    # A backup of it restored into another thread: restore and restore_state.
    backup = io.StringIO()
    cli_backup.export(store, "contract", backup, progress_out=io.StringIO())
    cli_backup.import_lines(
        store, "contract-restored", io.StringIO(backup.getvalue()), progress_out=io.StringIO()
    )
    thread.delete()

    # A delete() cut short after its first call (it tombstones the thread and removes no chunk):
    # the next write finishes it (mode 'continue') and is sent again.
    interrupted = store.thread("contract-deleting")
    interrupted.append([UserMessage(content=f"d{i}") for i in range(8)])
    ref = ThreadRef.of(store.config, "contract-deleting")
    assert store.run(iter_once(Eval(SCRIPTS["delete"], ref.script_keys, (0, "start", 0, 0)))) == 0
    interrupted.append(UserMessage(content="after"))

    legacy = store.thread("contract-legacy")
    write_layout_1(raw_client, legacy.keys, 12)
    # A layout-1 thread's pages are planned by page_plan, sequence cursors too (on layout 2
    # they are planned with native reads).
    assert [m.seq_id for m in legacy.list(after=2, before=9, limit=3).messages] == [3, 4, 5]
    legacy.append(UserMessage(content="new"))  # refused until the scan is done: migrate, again
    legacy.migrate()


def iter_once(request: Eval):
    """An operation of one request, returning its reply."""
    return (yield request)


def test_every_call_matches_its_script_header(server_only, server, raw_client, namespace):
    store = Recorder(raw_client, StoreConfig(namespace=namespace, **SMALL))
    run_every_script(store, raw_client)
    ref = ThreadRef.of(store.config, "contract")
    headers = {name: script_header(name) for name in SCRIPT_NAMES}
    mismatches: dict[str, set[str]] = defaultdict(set)
    for request in store.calls:
        name = request.script.name
        mismatches[name] |= set(
            call_mismatches(headers[name], list(request.keys), list(request.args))
        )
        if request.keys[0].endswith("{contract}:meta"):
            assert tuple(request.keys) == ref.script_keys, name
    assert {name: sorted(found) for name, found in mismatches.items() if found} == {}
    assert sorted(set(SCRIPT_NAMES) - {request.script.name for request in store.calls}) == []
    # Each value a header lists was sent, so each was checked (and none is stale).
    sent: dict[tuple[str, int], set[Any]] = defaultdict(set)
    for request in store.calls:
        for position, value in enumerate(request.args, 1):
            sent[request.script.name, position].add(value)
    never_sent = [
        f"{name} ARGV[{entry.first}] {value!r}"
        for name, header in headers.items()
        for entry in header.argv
        for kind in entry.kinds
        if kind.values and entry.last == entry.first
        for value in kind.values
        if value not in sent[name, entry.first]
    ]
    assert never_sent == []


# The headers themselves, without a server.


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_header_is_a_contract(name):
    header = script_header(name)
    assert header_problems(header) == []
    # Every script takes the same twelve keys (includes/thread.lua: thread_keys).
    assert [(e.first, e.last) for e in header.keys] == [(1, 12)]


def test_the_twelve_keys_are_the_thread_keys_in_order():
    source = (
        resources.files("kvstore.lua").joinpath("includes/thread.lua").read_text(encoding="utf-8")
    )
    named = {int(i): name for name, i in re.findall(r"(\w+) = KEYS\[(\d+)\]", source)}
    fields = [field.name for field in dataclasses.fields(ThreadKeys)]
    assert [named[i] for i in sorted(named)] == fields
    keys = ThreadKeys.of("kv", "t")
    assert ThreadRef.of(StoreConfig(), "t").script_keys == tuple(getattr(keys, f) for f in fields)


# The check itself: a header that says something else than what is sent is caught.

WRONG = """#!lua
--- A script whose header is wrong in every way the check knows.
---
--- KEYS[1..10]  the thread's keys
--- ARGV[1..10]  limits (int): read_limits
--- ARGV[11]     turn_id (bytes)
--- ARGV[12]     outcome (str: 'completed' | 'failed')
--- ARGV[13]     count (int)
--- ARGV[14..]   ARGV[13] times: id (str), record (bytes)
---
--- Reply: 1
--- Errors: KVS_WRONGTYPE
local x = 1
"""


def test_the_check_reads_a_header():
    header = read_header(WRONG)
    assert header_problems(header) == [] and header.errors == ("KVS_WRONGTYPE",)
    assert [(e.first, e.last, [k.name for k in e.kinds], e.times) for e in header.argv] == [
        (1, 10, ["int"], None),
        (11, 11, ["bytes"], None),
        (12, 12, ["str"], None),
        (13, 13, ["int"], None),
        (14, None, ["str", "bytes"], 13),
    ]


def test_the_check_finds_each_kind_of_mismatch():
    header = read_header(WRONG)
    limits = [1] * 10
    assert call_mismatches(header, ["k"] * 10, [*limits, b"t", "failed", 1, "id", b"r"]) == []
    assert call_mismatches(header, ["k"] * 9, [*limits, b"t", "failed", 1, "id", b"r"]) == [
        "9 keys sent, the header says 10"
    ]
    assert call_mismatches(header, ["k"] * 10, [*limits, "t", "failed", 1, "id", b"r"]) == [
        "ARGV[11] 't' is a str, the header says bytes"
    ]
    assert call_mismatches(header, ["k"] * 10, [*limits, b"t", "steered", 1, "id", b"r"]) == [
        "ARGV[12] 'steered' is not one of 'completed' | 'failed'"
    ]
    assert call_mismatches(header, ["k"] * 10, [*limits, b"t", "failed", 2, "id", b"r"]) == [
        "ARGV[14..]: 1 groups sent, ARGV[13] says 2"
    ]
    assert call_mismatches(header, ["k"] * 10, [*limits, b"t", "failed", 1, "id"]) == [
        "ARGV[14..]: 14 arguments sent, not whole groups of 2 there"
    ]
    assert call_mismatches(
        header, ["k"] * 10, [*limits[:9], "0", b"t", "failed", 1, "id", b"r"]
    ) == ["ARGV[10] '0' is a str, the header says int"]


def test_the_check_finds_arguments_the_header_does_not_describe():
    header = read_header(
        WRONG.replace("--- ARGV[14..]   ARGV[13] times: id (str), record (bytes)\n", "")
    )
    assert call_mismatches(header, ["k"] * 10, [*[1] * 10, b"t", "failed", 1, "id", b"r"]) == [
        "15 arguments sent, the header describes 13"
    ]


def test_the_check_finds_a_malformed_header():
    gap = read_header(WRONG.replace("--- ARGV[13]     count (int)\n", ""))
    assert header_problems(gap) == ["ARGV[14..] does not follow ARGV[12]"]
    no_kind = read_header(WRONG.replace("turn_id (bytes)", "turn_id"))
    assert header_problems(no_kind) == ["ARGV[11] names no kind"]
    no_errors = read_header(WRONG.replace("--- Errors: KVS_WRONGTYPE\n", ""))
    assert header_problems(no_errors) == ["0 Errors lines, not one"]
