"""Rules of the Lua sources a server would only break at run time, on one kind of server."""

from __future__ import annotations

import re
from pathlib import Path

LUA = Path(__file__).resolve().parents[2] / "lua"

# A name, a length or a field negated inside a command's arguments: `-n` of 0 is -0, written
# "-0", which Redis refuses as an integer (Valkey takes it). lua/includes/numbers.lua: `0 - n`.
NEGATED_ARGUMENT = re.compile(r"redis\.p?call\((?:[^()]|\([^()]*\))*?,\s*-\s*[#A-Za-z_(]")


def test_no_command_takes_a_negated_count():
    found = [
        f"{path.relative_to(LUA)}:{number}: {line.strip()}"
        for path in sorted(LUA.rglob("*.lua"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if not line.lstrip().startswith("--") and NEGATED_ARGUMENT.search(line)
    ]
    assert found == []


def test_the_rule_sees_a_negated_count():
    for line in (
        "redis.call('HINCRBY', keys.meta, 'tokens', -tokens)",
        "redis.call('HINCRBY', keys.meta, 'stored', -#ids)",
        "redis.pcall('HINCRBY', k, 'media', - contents.media)",
        "redis.call('HINCRBY', key(a, b), 'x', -(a + b))",
    ):
        assert NEGATED_ARGUMENT.search(line), line
    for line in (
        "redis.call('HINCRBY', keys.meta, 'tokens', 0 - tokens)",
        "redis.call('ZRANGE', key, 0, -1)",
        "redis.call('ZRANGE', key, '-inf', '+inf')",
    ):
        assert not NEGATED_ARGUMENT.search(line), line
