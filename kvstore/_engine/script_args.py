"""The named arguments of the Lua scripts: read once from each script's header, encoded into ARGV
by name in Python (:meth:`ScriptArgs.encode`) and decoded from ARGV by name in Lua (the prologue
:meth:`ScriptArgs.lua_prologue` writes, which every script runs before its body).

A script's header declares its arguments in order, one entry each (docs/LAYOUT.md, "Script
headers"):

    --- ARGV limits (limits): the store's limits
    --- ARGV turn_id (str): '' for none
    --- ARGV outcome (str: 'completed' | 'failed')
    --- ARGV messages[] id (str), otid (str): '' for none, record (bytes)

An entry goes on over the lines that follow it with `---` and two or more spaces. The kinds are
`int` (a number in Lua), `str` and `bytes` (strings in Lua), `str: 'a' | 'b'` (one of those
values) and `limits`: the store's limits, LIMIT_NAMES' values joined by ':' (lua/includes/args.lua,
read_limits). An entry `name[]` is a group repeated over every argument left (so it comes last):
its fields' names and kinds, one row per repetition; Lua reads it as one list per field and `n`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# The store's limits as the scripts take them: one argument, these values in this order joined by
# ':' (lua/includes/args.lua: LIMIT_NAMES, read_limits; kvstore/_engine/operation.py: ThreadRef.of).
LIMIT_NAMES = (
    "window_size",
    "chunk_size",
    "chunk_max_bytes",
    "max_move_chunks",
    "max_move_bytes",
    "max_message_bytes",
    "max_media",
    "retained_limit",
    "ttl_ms",
    "events_len",
    "events_age_ms",
    "strict_history",
    "turn_lease_ms",
)

_ENTRY = re.compile(r"^--- ARGV (\w+)(\[\])?\s+(.*)$")
_GOES_ON = re.compile(r"^---\s{2,}(\S.*)$")
_KIND = r"\((int|str|bytes|limits)(?:: ([^)]*))?\)"
_SCALAR = re.compile(rf"^{_KIND}")
_FIELD = re.compile(rf"(\w+) {_KIND}")
_VALUE = re.compile(r"'([^']*)'")


class ScriptArgsError(TypeError):
    """A script call names an argument its script does not declare, or leaves one out (a bug of
    the caller, refused before anything is sent)."""


@dataclass(frozen=True, slots=True)
class Arg:
    name: str
    kind: str  # int | str | bytes | limits | group
    values: tuple[str, ...] | None = None  # the values a str may take, or None for any
    fields: tuple[Arg, ...] = ()  # a group's, in order
    text: str = ""


def _kind_of(name: str, kind: str, values: str) -> Arg:
    return Arg(name, kind, tuple(_VALUE.findall(values)) if values else None)


def read_args(text: str) -> tuple[Arg, ...]:
    """The ARGV entries of a script's header (its comment lines up to its first include or code
    line), in order."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.split("\n")[1:]:
        if not line.startswith("---") or line.startswith("--- @include"):
            break
        goes_on = _GOES_ON.match(line)
        if line.startswith("--- ARGV "):
            current = [line]
            blocks.append(current)
        elif goes_on and current is not None:
            current.append(goes_on.group(1))
        else:
            current = None
    entries = []
    for block in blocks:
        entry = _ENTRY.match(" ".join(block))
        if entry is None:
            raise ScriptArgsError(f"unreadable argument entry {block[0]!r}")
        name, group, rest = entry.groups()
        if group:
            fields = tuple(_kind_of(*found) for found in _FIELD.findall(rest))
            entries.append(Arg(name, "group", None, fields, rest))
            continue
        kind = _SCALAR.match(rest)
        if kind is None:
            raise ScriptArgsError(f"argument {name} names no kind: {rest!r}")
        entries.append(Arg(name, kind.group(1), _kind_of(name, *kind.groups()).values, (), rest))
    return tuple(entries)


def arg_problems(args: tuple[Arg, ...]) -> list[str]:
    """What makes a script's arguments unusable, whatever is sent."""
    names = [arg.name for arg in args]
    return sorted(
        {f"argument {name} declared twice" for name in names if names.count(name) > 1}
        | {
            f"group {arg.name}[] is not the last argument"
            for arg in args[:-1]
            if arg.kind == "group"
        }
        | {f"group {a.name}[] names no field" for a in args if a.kind == "group" and not a.fields}
    )


@dataclass(frozen=True, slots=True)
class ScriptArgs:
    """One script's arguments, as its header declares them."""

    script: str
    args: tuple[Arg, ...]
    names: frozenset[str]

    @classmethod
    def of(cls, script: str, text: str) -> ScriptArgs:
        args = read_args(text)
        problems = arg_problems(args)
        if problems:
            raise ScriptArgsError(f"{script}.lua: {'; '.join(problems)}")
        return cls(script, args, frozenset(a.name for a in args))

    def encode(self, values: dict[str, Any]) -> tuple[Any, ...]:
        """ARGV from the arguments by name: a group is a sequence of rows (tuples of its fields),
        the limits the key ThreadRef.limits() gives. A name missing or not declared is refused."""
        if values.keys() != self.names:
            missing = sorted(self.names - values.keys())
            unknown = sorted(values.keys() - self.names)
            raise ScriptArgsError(
                f"{self.script}.lua: arguments missing {missing}, not declared {unknown}"
            )
        argv: list[Any] = []
        for arg in self.args:
            value = values[arg.name]
            if arg.kind == "group":
                width = len(arg.fields)
                for row in value:
                    if len(row) != width:
                        raise ScriptArgsError(
                            f"{self.script}.lua: a row of {arg.name} has {len(row)} values,"
                            f" not {width}"
                        )
                    argv += row
            elif arg.kind == "limits":
                if not isinstance(value, str) or len(value.split(":")) != len(LIMIT_NAMES):
                    raise ScriptArgsError(f"{self.script}.lua: limits {value!r} are not the key")
                argv.append(value)
            else:
                argv.append(value)
        return tuple(argv)

    def decode(self, argv: Sequence[Any]) -> dict[str, Any]:
        """The arguments by name from ARGV, as the Lua prologue reads them (a group as a list of
        rows, the limits as their key); for checks and tests."""
        named: dict[str, Any] = {}
        at = 0
        for arg in self.args:
            if arg.kind == "group":
                width = len(arg.fields)
                rest = list(argv[at:])
                named[arg.name] = [tuple(rest[i : i + width]) for i in range(0, len(rest), width)]
                at = len(argv)
            elif arg.kind == "limits":
                named[arg.name] = argv[at]
                at += 1
            else:
                named[arg.name] = argv[at] if at < len(argv) else None
                at += 1
        return named

    def lua_prologue(self) -> str:
        """The Lua that names ARGV: `local args = {...}` (one line, so that the body's line numbers
        move by one at most); an int becomes a number, a group one list per field and `n`."""
        items, at = [], 1
        for arg in self.args:
            if arg.kind == "limits":
                items.append(f"{arg.name} = read_limits(ARGV, {at})")
                at += 1
            elif arg.kind != "group":
                items.append(f"{arg.name} = {_lua_value(arg, f'ARGV[{at}]')}")
                at += 1
        line = f"local args = {{{', '.join(items)}}}"
        group = self.args[-1] if self.args and self.args[-1].kind == "group" else None
        if group is None:
            return line
        width = len(group.fields)
        lists = ", ".join(f"{f.name} = {{}}" for f in group.fields)
        reads = "; ".join(
            f"g.{f.name}[i] = {_lua_value(f, f'ARGV[b + {k}]')}"
            for k, f in enumerate(group.fields, 1)
        )
        return (
            f"{line}; do local n = (#ARGV - {at - 1}) / {width}; local g = {{n = n, {lists}}};"
            f" for i = 1, n do local b = {at - 1} + (i - 1) * {width}; {reads} end;"
            f" args.{group.name} = g end"
        )


def _lua_value(arg: Arg, expression: str) -> str:
    return f"tonumber({expression})" if arg.kind == "int" else expression
