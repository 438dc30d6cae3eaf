"""Each lua/*.lua script's header, read as the contract it states (docs/LAYOUT.md, "Script
headers"), and the check of a call against it.

An entry is a line `--- KEYS[i..j]`, `--- ARGV[i]`, `--- ARGV[i..j]` or `--- ARGV[i..]` with the
lines that go on it (`---` and two or more spaces). Each argument's kind is in parentheses:
`(int)`, `(str)`, `(bytes)`, or `(str: 'a' | 'b')` for a str that is one of those values. An
entry over several positions gives the kinds of one group, repeated over its range; `ARGV[i..]`
repeats to the last argument (no group at all is one way to repeat), and `ARGV[n] times` in its
text says how many groups there are.
`--- Errors: KVS_A, KVS_B, ...` names every code the script can raise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

_ENTRY = re.compile(r"^--- (KEYS|ARGV)\[(\d+)(?:(\.\.)(\d*))?\]\s+(.*)$")
_GOES_ON = re.compile(r"^---\s{2,}(\S.*)$")
_KIND = re.compile(r"\((int|str|bytes)(?:: ([^)]*))?\)")
_TIMES = re.compile(r"ARGV\[(\d+)\] times")
_VALUE = re.compile(r"'([^']*)'")
_CODE = re.compile(r"KVS_[A-Z_]+")


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


@dataclass(frozen=True)
class Kind:
    name: str  # int | str | bytes
    values: tuple[str, ...] | None = None  # the values a str may take, or None for any

    def mismatch(self, value: Any) -> str | None:
        expected = {"int": int, "str": str, "bytes": bytes}[self.name]
        if type(value) is not expected:
            return f"{value!r:.60} is {_a(type(value).__name__)}, the header says {self.name}"
        if self.values is not None and value not in self.values:
            return f"{value!r} is not one of {' | '.join(map(repr, self.values))}"
        return None


@dataclass(frozen=True)
class Entry:
    table: str  # KEYS | ARGV
    first: int
    last: int | None  # None: up to the last argument
    kinds: tuple[Kind, ...]  # one group
    times: int | None  # the ARGV position that gives the number of groups
    text: str


@dataclass(frozen=True)
class Header:
    keys: tuple[Entry, ...]
    argv: tuple[Entry, ...]
    errors: tuple[str, ...]
    errors_lines: int


def read_header(text: str) -> Header:
    """The header of a script's text: its comment lines up to the first include or code line."""
    blocks: list[list[str]] = []  # each entry's (or the Errors line's) text, lines joined
    current: list[str] | None = None
    for line in text.split("\n")[1:]:
        if not line.startswith("---") or line.startswith("--- @include"):
            break
        goes_on = _GOES_ON.match(line)
        if _ENTRY.match(line) or line.startswith("--- Errors:"):
            current = [line]
            blocks.append(current)
        elif goes_on and current is not None:
            current.append(goes_on.group(1))
        else:
            current = None
    entries, codes, errors_lines = [], (), 0
    for block in blocks:
        text = " ".join(block)
        if text.startswith("--- Errors:"):
            codes += tuple(_CODE.findall(text))
            errors_lines += 1
            continue
        table, first, dots, last, rest = _ENTRY.match(text).groups()
        times = _TIMES.search(rest)
        entries.append(
            Entry(
                table=table,
                first=int(first),
                last=int(first) if not dots else (int(last) if last else None),
                kinds=tuple(
                    Kind(name, tuple(_VALUE.findall(values)) if values else None)
                    for name, values in _KIND.findall(rest)
                ),
                times=int(times.group(1)) if times else None,
                text=rest,
            )
        )
    return Header(
        keys=tuple(e for e in entries if e.table == "KEYS"),
        argv=tuple(e for e in entries if e.table == "ARGV"),
        errors=codes,
        errors_lines=errors_lines,
    )


def script_header(name: str) -> Header:
    return read_header(
        resources.files("kvstore.lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")
    )


def _label(entry: Entry) -> str:
    if entry.last == entry.first:
        return f"{entry.table}[{entry.first}]"
    return f"{entry.table}[{entry.first}..{'' if entry.last is None else entry.last}]"


def header_problems(header: Header) -> list[str]:
    """What makes a header unusable as a contract, whatever is sent."""
    problems = []
    for table, entries in (("KEYS", header.keys), ("ARGV", header.argv)):
        end: int | None = 0
        for entry in entries:
            label = _label(entry)
            if end is None:
                problems.append(f"{label} follows a range open to the end")
            elif entry.first != end + 1:
                problems.append(f"{label} does not follow {table}[{end}]")
            if table == "ARGV" and not entry.kinds:
                problems.append(f"{label} names no kind")
            if entry.last is not None and entry.last < entry.first:
                problems.append(f"{label} is empty")
            elif (
                entry.last is not None
                and entry.kinds
                and (entry.last - entry.first + 1) % len(entry.kinds)
            ):
                problems.append(f"{label} is no whole number of groups of {len(entry.kinds)}")
            end = entry.last
    if not header.keys:
        problems.append("no KEYS entry")
    if header.errors_lines != 1:
        problems.append(f"{header.errors_lines} Errors lines, not one")
    return problems


def call_mismatches(header: Header, keys: list[Any], args: list[Any]) -> list[str]:
    """How a call's KEYS and ARGV differ from what the header says ([] when they agree)."""
    found = header_problems(header)
    key_count = header.keys[-1].last if header.keys else 0
    if len(keys) != key_count:
        found.append(f"{len(keys)} keys sent, the header says {key_count}")
    found += [
        f"KEYS[{i}] {problem}"
        for i, key in enumerate(keys, 1)
        if (problem := Kind("str").mismatch(key))
    ]
    end = 0
    for entry in header.argv:
        if not entry.kinds:
            continue
        last = entry.last if entry.last is not None else len(args)
        span = last - entry.first + 1
        label = _label(entry)
        # A range open to the end may hold no group at all.
        if (
            last > len(args)
            or span < (len(entry.kinds) if entry.last is not None else 0)
            or span % len(entry.kinds)
        ):
            found.append(
                f"{label}: {len(args)} arguments sent, not whole groups of {len(entry.kinds)} there"
            )
            end = last
            continue
        if entry.times is not None:
            told = args[entry.times - 1] if entry.times <= len(args) else None
            if told != span // len(entry.kinds):
                found.append(
                    f"{label}: {span // len(entry.kinds)} groups sent, ARGV[{entry.times}] says {told!r}"
                )
        for position in range(entry.first, last + 1):
            kind = entry.kinds[(position - entry.first) % len(entry.kinds)]
            if problem := kind.mismatch(args[position - 1]):
                found.append(f"ARGV[{position}] {problem}")
        end = last
    if end != len(args):
        found.append(f"{len(args)} arguments sent, the header describes {end}")
    return found
