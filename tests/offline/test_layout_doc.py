"""docs/LAYOUT.md names every key kvstore/_engine/layout/keys.py makes and every field the scripts write
into a thread's meta hash and its chunk hashes: a new key or field that the page does not name
fails here, so the page stays true to the code."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from kvstore._engine.layout.keys import ThreadKeys
from kvstore._engine.scripts import SCRIPT_NAMES, build_source

LAYOUT = Path(__file__).resolve().parents[2] / "docs" / "LAYOUT.md"

# The start of a call that writes a hash: its command and key expression.
HASH_WRITE = re.compile(r"redis\.p?call\(\s*'(HSET|HSETNX|HINCRBY|HDEL)'\s*,\s*([\w.]+)\s*,")
LITERAL = re.compile(r"^'([A-Za-z_]+)'$")


def documented() -> set[str]:
    """Every `name` in backticks on a table row of docs/LAYOUT.md."""
    rows = [
        line for line in LAYOUT.read_text(encoding="utf-8").splitlines() if line.startswith("|")
    ]
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row)}


def arguments(text: str) -> list[str]:
    """The arguments from the start of `text` to the call's closing parenthesis (a call may span
    lines), split at depth 0: calls inside keep their commas."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == ")" and depth == 0:
            break
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        depth += {"(": 1, "{": 1, ")": -1, "}": -1}.get(char, 0)
        current += char
    parts.append(current.strip())
    return parts


def fields_written(key_pattern: str) -> set[str]:
    """The literal field names the scripts write into (or delete from) hashes whose key
    expression matches `key_pattern`: HSET's every other argument, HINCRBY's first, HDEL's all."""
    fields = set()
    for name in SCRIPT_NAMES:
        source = build_source(name)
        for call in HASH_WRITE.finditer(source):
            command, key = call.groups()
            if not re.search(key_pattern, key):
                continue
            args = arguments(source[call.end() :])
            positions = {"HSET": args[0::2], "HSETNX": args[:1], "HINCRBY": args[:1], "HDEL": args}[
                command
            ]
            fields |= {m.group(1) for a in positions if (m := LITERAL.match(a))}
    return fields


def test_every_key_of_a_thread_is_documented() -> None:
    keys = ThreadKeys.of("ns", "t")
    parts = {getattr(keys, f.name).split("}:", 1)[1] for f in dataclasses.fields(keys)}
    names = documented()
    missing = sorted(p for p in parts if p not in names and f"{p}<first>" not in names)
    assert not missing, f"keys that docs/LAYOUT.md's key table does not name: {missing}"


def test_every_meta_field_the_scripts_write_is_documented() -> None:
    fields = fields_written(r"^keys\.meta$")
    # The scan finds the fields the store path writes, so an empty or tiny set means it broke.
    assert {
        "last_seq",
        "stored",
        "media",
        "gen",
        "turn_id",
        "summary_last",
        "deleting",
        "legacy_scan",
    } <= fields
    missing = sorted(fields - documented())
    assert not missing, (
        f"meta fields the scripts write that docs/LAYOUT.md does not name: {missing}"
    )


def test_every_chunk_field_the_scripts_write_is_documented() -> None:
    fields = fields_written(r"chunk")
    assert {"d", "_m"} <= fields
    missing = sorted(fields - documented())
    assert not missing, (
        f"chunk fields the scripts write that docs/LAYOUT.md does not name: {missing}"
    )
