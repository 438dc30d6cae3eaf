"""Each lua/*.lua script's header, read as the contract it states (docs/LAYOUT.md, "Script
headers"), and the check of a call against it.

The keys are one entry `--- KEYS[i..j]` (with the lines that go on it: `---` and two or more
spaces). The arguments are the `--- ARGV name (kind): ...` entries, read by the one parser the
encoder and the Lua prologue are built from (kvstore/_engine/script_args.py: read_args).
`--- Errors: KVS_A, KVS_B, ...` names every code the script can raise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from kvstore._engine.script_args import LIMIT_NAMES, Arg, arg_problems, read_args

_KEYS = re.compile(r"^--- KEYS\[(\d+)(?:\.\.(\d+))?\]\s+(.*)$")
_GOES_ON = re.compile(r"^---\s{2,}\S")
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
class Header:
    keys: tuple[tuple[int, int], ...]  # each KEYS entry's first and last position
    argv: tuple[Arg, ...]
    errors: tuple[str, ...]
    errors_lines: int


def read_header(text: str) -> Header:
    """The header of a script's text: its comment lines up to the first include or code line."""
    keys, codes, errors_lines, in_errors = [], (), 0, False
    for line in text.split("\n")[1:]:
        if not line.startswith("---") or line.startswith("--- @include"):
            break
        if entry := _KEYS.match(line):
            keys.append((int(entry.group(1)), int(entry.group(2) or entry.group(1))))
        in_errors = line.startswith("--- Errors:") or (in_errors and bool(_GOES_ON.match(line)))
        if in_errors:
            errors_lines += line.startswith("--- Errors:")
            codes += tuple(_CODE.findall(line))
    return Header(tuple(keys), read_args(text), codes, errors_lines)


def script_header(name: str) -> Header:
    return read_header(
        resources.files("kvstore.lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")
    )


def header_problems(header: Header) -> list[str]:
    """What makes a header unusable as a contract, whatever is sent."""
    problems = list(arg_problems(header.argv))
    end = 0
    for first, last in header.keys:
        if first != end + 1:
            problems.append(f"KEYS[{first}..{last}] does not follow KEYS[{end}]")
        end = last
    if not header.keys:
        problems.append("no KEYS entry")
    if header.errors_lines != 1:
        problems.append(f"{header.errors_lines} Errors lines, not one")
    return problems


def _value_mismatch(arg: Arg, value: Any) -> str | None:
    return Kind(arg.kind, arg.values).mismatch(value)


def _limits_mismatches(arg: Arg, value: Any) -> list[str]:
    if not isinstance(value, str):
        return [f"{arg.name}: {value!r} is not the limits' key"]
    numbers = value.split(":")
    if len(numbers) != len(LIMIT_NAMES):
        return [f"{arg.name}: {len(numbers)} values sent, not {len(LIMIT_NAMES)}"]
    return [
        f"{arg.name}.{name} {problem}"
        for name, number in zip(LIMIT_NAMES, numbers, strict=True)
        if (
            problem := Kind("int").mismatch(int(number) if number.lstrip("-").isdigit() else number)
        )
    ]


def call_mismatches(header: Header, keys: list[Any], args: list[Any]) -> list[str]:
    """How a call's KEYS and ARGV differ from what the header says ([] when they agree)."""
    found = header_problems(header)
    key_count = header.keys[-1][1] if header.keys else 0
    if len(keys) != key_count:
        found.append(f"{len(keys)} keys sent, the header says {key_count}")
    found += [
        f"KEYS[{i}] {problem}"
        for i, key in enumerate(keys, 1)
        if (problem := Kind("str").mismatch(key))
    ]
    at = 0
    for arg in header.argv:
        if arg.kind == "limits":
            found += _limits_mismatches(arg, args[at] if at < len(args) else None)
            at += 1
        elif arg.kind == "group":
            rest, width = args[at:], len(arg.fields)
            if len(rest) % width:
                found.append(f"{arg.name}[]: {len(rest)} values sent, not rows of {width}")
                return found
            for i, value in enumerate(rest):
                field = arg.fields[i % width]
                if problem := _value_mismatch(field, value):
                    found.append(f"{arg.name}[{i // width + 1}].{field.name} {problem}")
            at = len(args)
        elif at >= len(args):
            found.append(f"{arg.name}: not sent ({len(args)} arguments)")
            at += 1
        else:
            if problem := _value_mismatch(arg, args[at]):
                found.append(f"{arg.name} {problem}")
            at += 1
    if at < len(args):
        found.append(f"{len(args)} arguments sent, the header describes {at}")
    return found
