"""Each script's header against what the client sends and what the script reads: real
operations on a real server, every script call they make recorded and checked against the KEYS
and arguments its header states (tests/support/script_headers.py reads the headers); the encoder
(Script.args) and the Lua prologue that names ARGV, both built from the same header, checked to
agree with it and with each other."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections import defaultdict
from importlib import resources
from typing import Any

import pytest

from kvstore import AssistantMessage, MessageStore, StoreConfig, UserMessage
from kvstore._engine import scripts as _scripts
from kvstore._engine.core import Batch, Eval, ThreadRef
from kvstore._engine.executor import record
from kvstore._engine.layout.keys import OwnerKeys, ThreadKeys
from kvstore._engine.script_args import LIMIT_NAMES, ScriptArgsError
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
    thread.renew_turn(lease)  # renew_turn, with a lease and without
    thread.expire_turn()
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
    start = SCRIPTS["delete"].args(max_chunks=0, mode="start", events_len=0, events_age_ms=0)
    assert store.run(iter_once(Eval(SCRIPTS["delete"], ref.script_keys, start))) == 0
    interrupted.append(UserMessage(content="after"))

    legacy = store.thread("contract-legacy")
    write_layout_1(raw_client, legacy.keys, 12)
    # A layout-1 thread's pages are planned by page_plan, sequence cursors too (on layout 2
    # they are planned with native reads).
    assert [m.seq_id for m in legacy.list(after=2, before=9, limit=3).messages] == [3, 4, 5]
    legacy.append(UserMessage(content="new"))  # refused until the scan is done: migrate, again
    legacy.migrate()

    # An owner's threads: its own scripts, and thread scripts with the owner's four keys after.
    owned = store.thread("contract-owned", owner="contract-owner")
    owned.set_info(title="a title", metadata={"k": "v"})
    owned.append([UserMessage(content="o1"), UserMessage(content="o2")])
    store.set_owner_quota("contract-owner", threads=5, stored_bytes=10**6, messages_per_minute=100)
    first = store.threads("contract-owner", limit=1, where={"k": "v"})
    store.threads("contract-owner", order="created", after=first.next_cursor)
    store.owner_usage("contract-owner")
    store.erase_owner("contract-owner")


def iter_once(request: Eval):
    """An operation of one request, returning its reply."""
    return (yield request)


def test_every_call_matches_its_script_header(server_only, server, raw_client, namespace):
    store = Recorder(raw_client, StoreConfig(namespace=namespace, **SMALL))
    run_every_script(store, raw_client)
    ref = ThreadRef.of(store.config, "contract")
    headers = {name: script_header(name) for name in SCRIPT_NAMES}
    mismatches: dict[str, set[str]] = defaultdict(set)
    owner_keys = OwnerKeys.of(namespace, "contract-owner").script_keys()
    for request in store.calls:
        name = request.script.name
        keys = list(request.keys)
        if len(keys) == 18:  # an owned thread: its fourteen keys, then its owner's four
            assert tuple(keys[14:]) == owner_keys, name
            keys = keys[:14]
        mismatches[name] |= set(call_mismatches(headers[name], keys, list(request.args)))
        if request.keys[0].endswith("{contract}:meta"):
            assert tuple(request.keys) == ref.script_keys, name
    assert {name: sorted(found) for name, found in mismatches.items() if found} == {}
    assert sorted(set(SCRIPT_NAMES) - {request.script.name for request in store.calls}) == []
    # Each call is what the encoder makes of its arguments by name, and each value a header
    # lists was sent, so each was checked (and none is stale).
    sent: dict[tuple[str, str], set[Any]] = defaultdict(set)
    for request in store.calls:
        script = request.script
        named = script.arguments.decode(request.args)
        assert script.args(**named) == tuple(request.args), script.name
        for name, value in named.items():
            sent[script.name, name].add(value if not isinstance(value, list) else None)
    never_sent = [
        f"{name} {arg.name} {value!r}"
        for name, header in headers.items()
        for arg in header.argv
        if arg.values
        for value in arg.values
        if value not in sent[name, arg.name]
    ]
    assert never_sent == []


def test_the_lua_prologue_names_what_the_encoder_sends(server_only, raw_client):
    """Each script's prologue, run on the server with arguments the encoder made, reads each
    argument under its name, with its kind: the header, the encoder and the decoder agree."""
    for name in SCRIPT_NAMES:
        script = SCRIPTS[name]
        values = {arg.name: _sample(arg, i) for i, arg in enumerate(script.arguments.args)}
        reads_limits = any(arg.kind == "limits" for arg in script.arguments.args)
        lua = "\n".join(
            (
                _scripts._read("includes/args") if reads_limits else "",
                script.arguments.lua_prologue(),
                "return cjson.encode(args)",
            )
        )
        decoded = json.loads(raw_client.eval(lua, 0, *script.args(**values)))
        assert decoded == {
            arg.name: _as_lua(arg, values[arg.name]) for arg in script.arguments.args
        }, name


def _sample(arg, i: int) -> Any:
    """A value of the argument's kind (distinct per argument)."""
    if arg.kind == "limits":
        numbers = (4, 2, 2048, 1, 4096, 1000, 500, -1, 0, 7, 8, 1, 9000)
        return ":".join(map(str, numbers))
    if arg.kind == "group":
        return [
            tuple(_sample(field, 10 * row + k) for k, field in enumerate(arg.fields))
            for row in range(2)
        ]
    if arg.values:
        return arg.values[i % len(arg.values)]
    return {"int": 100 + i, "str": f"s{i}", "bytes": f"b{i}".encode()}[arg.kind]


def _as_lua(arg, value: Any) -> Any:
    """What the prologue reads for a value, as cjson gives it back."""
    if arg.kind == "limits":
        limits = dict(zip(LIMIT_NAMES, map(int, value.split(":")), strict=True))
        return {**limits, "strict_history": limits["strict_history"] == 1}
    if arg.kind == "group":
        columns: dict[str, Any] = {"n": len(value)}
        for k, field in enumerate(arg.fields):
            columns[field.name] = [_as_lua(field, row[k]) for row in value]
        return columns
    return value.decode() if isinstance(value, bytes) else value


def test_the_encoder_refuses_a_missing_or_unknown_name():
    limits = ThreadRef.of(StoreConfig(), "t").limits()
    assert SCRIPTS["retain"].args(limits=limits) == (limits,)
    with pytest.raises(ScriptArgsError, match=r"missing \['limits'\], not declared \['limit'\]"):
        SCRIPTS["retain"].args(limit=limits)
    with pytest.raises(ScriptArgsError, match=r"missing \['outcome'\]"):
        SCRIPTS["finish_turn"].args(limits=limits, turn_id="t", lease=0)
    with pytest.raises(ScriptArgsError, match="a row of targets has 2 values, not 1"):
        SCRIPTS["locate"].args(kind="seq", targets=[("1", "2")])


# The headers themselves, without a server.


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_header_is_a_contract(name):
    header = script_header(name)
    assert header_problems(header) == []
    # Every thread script takes the same fourteen keys (includes/layout.lua: thread_keys), an
    # owner's script its owner's four (includes/owner.lua).
    assert header.keys == (((1, 4),) if name.startswith("owner_") else ((1, 14),))


def test_the_fourteen_keys_are_the_thread_keys_in_order():
    source = (
        resources.files("kvstore.lua").joinpath("includes/layout.lua").read_text(encoding="utf-8")
    )
    named = {int(i): name for name, i in re.findall(r"(\w+) = KEYS\[(\d+)\]", source)}
    fields = [field.name for field in dataclasses.fields(ThreadKeys)]
    assert [named[i] for i in sorted(named)] == fields
    keys = ThreadKeys.of("kv", "t")
    assert ThreadRef.of(StoreConfig(), "t").script_keys == tuple(getattr(keys, f) for f in fields)


def test_the_direct_append_reads_its_keys_and_arguments_where_the_header_puts_them():
    """lua/includes/append_direct.lua runs before append's prologue and reads KEYS and ARGV by
    position (direct.KEY, direct.AT): those positions are the thread keys' and the header's."""
    read = resources.files("kvstore.lua").joinpath
    source = read("includes/append_direct.lua").read_text(encoding="utf-8")
    layout = read("includes/layout.lua").read_text(encoding="utf-8")

    def table(name: str) -> dict[str, int]:
        found = re.search(rf"^direct\.{name} = \{{([^}}]*)\}}", source, re.MULTILINE)
        assert found, name
        return {k: int(v) for k, v in re.findall(r"(\w+) = (\d+)", found.group(1))}

    thread_keys = {name: int(i) for name, i in re.findall(r"(\w+) = KEYS\[(\d+)\]", layout)}
    assert table("KEY") == {name: thread_keys[name] for name in table("KEY")}
    args = SCRIPTS["append"].arguments.args
    group = args[-1]
    expected = {arg.name: at for at, arg in enumerate(args[:-1], 1)}
    expected |= {group.name: len(args), "width": len(group.fields)}
    assert table("AT") == expected
    # Within a message's row the path reads id, otid, media, tokens and record at +0 .. +4.
    assert [field.name for field in group.fields] == ["id", "otid", "media", "tokens", "record"]


# The check itself: a header that says something else than what is sent is caught.

WRONG = """#!lua
--- A script whose header is wrong in every way the check knows.
---
--- KEYS[1..10]  the thread's keys
--- ARGV limits (limits): read_limits
--- ARGV turn_id (bytes)
--- ARGV outcome (str: 'completed' | 'failed')
--- ARGV count (int)
--- ARGV messages[] id (str), record (bytes): what
---      goes on
---
--- Reply: 1
--- Errors: KVS_WRONGTYPE
local x = 1
"""

LIMITS = ThreadRef.of(StoreConfig(), "t").limits()


def test_the_check_reads_a_header():
    header = read_header(WRONG)
    assert header_problems(header) == [] and header.errors == ("KVS_WRONGTYPE",)
    assert [(a.name, a.kind, a.values) for a in header.argv] == [
        ("limits", "limits", None),
        ("turn_id", "bytes", None),
        ("outcome", "str", ("completed", "failed")),
        ("count", "int", None),
        ("messages", "group", None),
    ]
    assert [(f.name, f.kind) for f in header.argv[-1].fields] == [
        ("id", "str"),
        ("record", "bytes"),
    ]


def test_the_check_finds_each_kind_of_mismatch():
    header = read_header(WRONG)
    sent = [LIMITS, b"t", "failed", 1, "id", b"r"]
    assert call_mismatches(header, ["k"] * 10, sent) == []
    assert call_mismatches(header, ["k"] * 9, sent) == ["9 keys sent, the header says 10"]
    assert call_mismatches(header, ["k"] * 10, [LIMITS, "t", "failed", 1, "id", b"r"]) == [
        "turn_id 't' is a str, the header says bytes"
    ]
    assert call_mismatches(header, ["k"] * 10, [LIMITS, b"t", "steered", 1, "id", b"r"]) == [
        "outcome 'steered' is not one of 'completed' | 'failed'"
    ]
    assert call_mismatches(header, ["k"] * 10, [LIMITS, b"t", "failed", 1, "id"]) == [
        "messages[]: 1 values sent, not rows of 2"
    ]
    assert call_mismatches(header, ["k"] * 10, [LIMITS, b"t", "failed", 1, "id", "r"]) == [
        "messages[1].record 'r' is a str, the header says bytes"
    ]
    assert call_mismatches(header, ["k"] * 10, ["0", b"t", "failed", 1]) == [
        "limits: 1 values sent, not 13"
    ]
    assert call_mismatches(header, ["k"] * 10, [(1, 2), b"t", "failed", 1]) == [
        "limits: (1, 2) is not the limits' key"
    ]
    lying = "x" + LIMITS[LIMITS.index(":") :]
    assert call_mismatches(header, ["k"] * 10, [lying, b"t", "failed", 1]) == [
        "limits.window_size 'x' is a str, the header says int"
    ]


def test_the_check_finds_arguments_the_header_does_not_describe():
    header = read_header(WRONG.replace("--- ARGV messages[] id (str), record (bytes): what\n", ""))
    assert call_mismatches(header, ["k"] * 10, [LIMITS, b"t", "failed", 1, "id", b"r"]) == [
        "6 arguments sent, the header describes 4"
    ]
    assert call_mismatches(header, ["k"] * 10, [LIMITS, b"t", "failed"]) == [
        "count: not sent (3 arguments)"
    ]


def test_the_check_finds_a_malformed_header():
    twice = read_header(WRONG.replace("--- ARGV count (int)", "--- ARGV outcome (int)"))
    assert header_problems(twice) == ["argument outcome declared twice"]
    group_first = read_header(
        WRONG.replace("--- ARGV limits (limits): read_limits\n", "").replace(
            "---      goes on\n", "---      goes on\n--- ARGV limits (limits)\n"
        )
    )
    assert header_problems(group_first) == ["group messages[] is not the last argument"]
    with pytest.raises(ScriptArgsError, match=r"unreadable argument entry .--- ARGV turn_id."):
        read_header(WRONG.replace("turn_id (bytes)", "turn_id"))
    no_errors = read_header(WRONG.replace("--- Errors: KVS_WRONGTYPE\n", ""))
    assert header_problems(no_errors) == ["0 Errors lines, not one"]
    gap = read_header(WRONG.replace("KEYS[1..10]", "KEYS[2..10]"))
    assert header_problems(gap) == ["KEYS[2..10] does not follow KEYS[0]"]


def test_the_limits_are_named_alike_in_python_and_lua():
    source = resources.files("kvstore.lua").joinpath("includes/args.lua").read_text("utf-8")
    names = re.search(r"LIMIT_NAMES = \{([^}]*)\}", source).group(1)
    assert tuple(re.findall(r"'(\w+)'", names)) == LIMIT_NAMES
