"""The Lua scripts: read from the package, includes inlined, SHAs computed locally; and the one
function library built from the same files.

Each script in ``lua/`` serves one operation. ``--- @include "includes/name"`` lines are replaced
by ``lua/includes/name.lua``; an include is inlined once per script (a second mention is
skipped) and a cycle is an error. Scripts are plain objects, independent of any client.

Two ways to run them (docs/LAYOUT.md, "Loading"):

- the function library (:data:`LIBRARY`, FUNCTION LOAD once, then FCALL / FCALL_RO): every
  include is defined once, when the library loads, and each script's body becomes one
  registered function taking KEYS and ARGV as arguments. A call runs only the body.
- a script per operation (EVALSHA, EVAL on NOSCRIPT): the whole inlined source runs on every
  call, so every include's local functions are created again each time.

The library's name and its functions' names carry a digest of its source, so a client only
ever calls the library it was built with; two versions can be loaded side by side.

Every script's arguments are named in its header: a script's ARGV is built by name
(:meth:`Script.args`) and its body reads them by name, from the table `args` a prologue written
from the same header fills (kvstore/_engine/script_args.py). A ``--- @first name`` line after a
script's includes runs ``name(KEYS, ARGV)`` before that prologue, and a reply it returns is the
call's: a common case can skip the prologue's tables (append: lua/includes/append_direct.lua).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from .. import errors
from .script_args import ScriptArgs

_INCLUDE = re.compile(r'^--- @include "([a-z0-9_/]+)"\s*$', re.MULTILINE)


class ScriptBuildError(Exception):
    """A script's includes are missing or form a cycle (a packaging bug, not a user error)."""


def _read(name: str) -> str:
    return resources.files("kvstore.lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


_ARGS_INCLUDE = '--- @include "includes/args"'
_FIRST = re.compile(r"^--- @first (\w+)\s*$", re.MULTILINE)


def _read_script(name: str) -> str:
    """A script's file with the prologue that names its arguments (and the include it needs to
    read limits) put before its first code line, after its header and its includes; on the same
    line before it, the call of the script's ``--- @first`` function."""
    text = _read(name)
    lines = text.split("\n")
    body = next(i for i, line in enumerate(lines) if i and not line.startswith("---"))
    arguments = ScriptArgs.of(name, text)
    include = (_ARGS_INCLUDE,) if any(arg.kind == "limits" for arg in arguments.args) else ()
    first = tuple(
        f"do local reply = {found.group(1)}(KEYS, ARGV); if reply then return reply end end"
        for found in _FIRST.finditer("\n".join(lines[:body]))
    )
    prologue = " ".join((*first, arguments.lua_prologue()))
    return "\n".join((*lines[:body], *include, prologue, *lines[body:]))


_OWNER_INCLUDE = '--- @include "includes/owner"'
# The writing scripts that do not take a thread's keys (an owner's own scripts).
_OWNER_SCRIPTS = ("owner_list", "owner_info", "owner_usage", "owner_erase")


def owner_hook(name: str) -> tuple[str, str] | None:
    """A writing thread script's wrapper for owned threads (lua/includes/owner.lua:
    owner.hooked): the opening, with where the call's records are in its ARGV, and the closing
    around the body as a function of (KEYS, ARGV); None for a script that reads, or an owner's
    own script."""
    script_args = ScriptArgs.of(name, _read(name))
    if name in _OWNER_SCRIPTS or "no-writes" in _read(name).split("\n", 1)[0]:
        return None
    # `ids`: where a record's message id (and after it its otid) is, from the record (0: none):
    # a retried call's check (owner.replay).
    first, stride, ids, at = 0, 0, 0, 1
    for arg in script_args.args:
        if arg.kind == "group":
            names = [field.name for field in arg.fields]
            if "record" in names:
                first, stride = at + names.index("record"), len(names)
                if "id" in names and names[names.index("id") + 1 :][:1] == ["otid"]:
                    ids = names.index("id") - names.index("record")
            break
        if arg.name == "record":
            first = at
        at += 1
    return f"owner.hooked('{name}', {first}, {stride}, {ids}, function(KEYS, ARGV)\n", "\nend)"


def build_source(name: str) -> str:
    """Returns the script's source (or an include's, built alone) with every include inlined;
    a writing thread script's body wrapped by owner.hooked."""
    if name.startswith("includes/"):
        return _expand(_read(name), (name,))
    text = _read_script(name)
    hook = owner_hook(name)
    if hook is not None:
        lines = text.split("\n")
        body = next(i for i, line in enumerate(lines) if i and not line.startswith("---"))
        head = (*lines[:body], _OWNER_INCLUDE)
        text = "\n".join(
            (*head, f"return {hook[0]}{chr(10).join(lines[body:])}{hook[1]}(KEYS, ARGV)")
        )
    return _expand(text, (name,))


def _expand(text: str, chain: tuple[str, ...]) -> str:
    """The text with its include lines replaced by the includes, each inlined once."""
    included: set[str] = set()

    def expand(source: str, chain: tuple[str, ...]) -> str:
        def inline(match: re.Match[str]) -> str:
            target = match.group(1)
            if target in chain:
                raise ScriptBuildError(f"include cycle: {' -> '.join((*chain, target))}")
            if target in included:
                return f"-- ({target} already included)"
            included.add(target)
            return expand(_read(target), (*chain, target)).rstrip("\n")

        return _INCLUDE.sub(inline, source)

    return expand(text, chain)


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str
    writes: bool
    arguments: ScriptArgs
    flags: tuple[str, ...] = ()
    function: str = ""  # its name in LIBRARY, set when the library is built

    @classmethod
    def load(cls, name: str) -> Script:
        source = build_source(name)
        first_line = source.split("\n", 1)[0]
        if not first_line.startswith("#!lua"):
            raise ScriptBuildError(f"{name}.lua must start with a #!lua shebang line")
        flags = (
            tuple(first_line.partition("flags=")[2].split(",")) if "flags=" in first_line else ()
        )
        return cls(
            name=name,
            source=source,
            sha=hashlib.sha1(source.encode()).hexdigest(),
            writes="no-writes" not in flags,
            arguments=ScriptArgs.of(name, _read(name)),
            flags=flags,
        )

    def args(self, **values: Any) -> tuple[Any, ...]:
        """The script's ARGV, from its arguments by name (its header's; a name missing or not
        declared is refused before anything is sent)."""
        return self.arguments.encode(values)

    def without_shebang(self) -> Script:
        """The same script for servers whose Lua does not parse the shebang (fakeredis)."""
        body = "--" + self.source[2:]  # keep line numbers: the shebang becomes a comment
        return replace(self, source=body, sha=hashlib.sha1(body.encode()).hexdigest())


def _hooked(name: str, function: str) -> str:
    """A library callback: the body's function, wrapped by owner.hooked for a writing thread
    script."""
    hook = owner_hook(name)
    if hook is None:
        return function
    opening = hook[0].rsplit("function(KEYS, ARGV)", 1)[0]
    return f"{opening}{function})"


@dataclass(frozen=True)
class Library:
    """Every script as one function library: includes defined once, one function per script."""

    name: str
    source: str

    @classmethod
    def build(cls, names: tuple[str, ...]) -> tuple[Library, dict[str, Script]]:
        """The library of the named scripts, and the scripts with their function names set."""
        bodies = {name: _read_script(name) for name in names}
        # Every include any script uses, each once, in an order that defines a name before its
        # users (build_source's expansion of all the include lines, in the scripts' order).
        include_lines = "\n".join(
            (
                *(m.group(0) for body in bodies.values() for m in _INCLUDE.finditer(body)),
                _OWNER_INCLUDE,
            )
        )
        shared = _expand(include_lines, ("library",))
        # Each body is the callback itself, not a local naming it: the library's main function
        # holds at most 200 locals (Lua 5.1), and the includes take most of them.
        bodies_code = {
            name: _hooked(
                name,
                f"function(KEYS, ARGV)\n{_INCLUDE.sub('', body.split(chr(10), 1)[1]).rstrip()}\nend",
            )
            for name, body in bodies.items()  # the shebang line is the library's
        }
        digest = hashlib.sha1("\n".join((shared, *bodies_code.values())).encode()).hexdigest()[:12]
        library = f"kvstore_{digest}"
        scripts = {}
        registrations = []
        for name in names:
            script = replace(SCRIPTS_BY_FILE[name], function=f"{library}_{name}")
            scripts[name] = script
            flags = ", ".join(f"'{flag}'" for flag in script.flags)
            registrations.append(
                f"redis.register_function{{function_name = '{script.function}',"
                f" callback = {bodies_code[name]}, flags = {{{flags}}}}}"
            )
        source = "\n".join((f"#!lua name={library}", shared, *registrations)) + "\n"
        return cls(library, source), scripts


SCRIPT_NAMES = (
    "append",
    "compact",
    "retain",
    "start_turn",
    "finish_turn",
    "replace",
    "remove_turn",
    "delete",
    "migrate",
    "publish",
    "page_plan",
    "locate",
    "turn_page",
    "restore",
    "restore_state",
    "read_range",
    "renew_turn",
    *_OWNER_SCRIPTS,
)
SCRIPTS_BY_FILE: dict[str, Script] = {name: Script.load(name) for name in SCRIPT_NAMES}
LIBRARY, SCRIPTS = Library.build(SCRIPT_NAMES)


# Every code a script raises, and the one class it raises as (docs/LAYOUT.md, "Errors"; a test
# checks this table against the codes in lua/ and against that page). Two codes share a class
# where the caller's remedy is the same; the detail after the code says which case it was.
ERROR_CODES: dict[str, type[errors.KVStoreError]] = {
    "KVS_WRONGTYPE": errors.LayoutError,
    "KVS_LAYOUT": errors.LayoutError,
    "KVS_MIGRATING": errors.MigrationPending,
    "KVS_DELETING": errors.ThreadDeleting,
    "KVS_TOO_LARGE": errors.MessageTooLarge,
    "KVS_MEDIA_OVER": errors.InlineMediaBudget,
    "KVS_OTID_CONFLICT": errors.OtidConflict,
    "KVS_OTID_REPEATED": errors.OtidRepeated,
    "KVS_DUPLICATE_ID": errors.DuplicateMessageId,
    "KVS_ID_REPEATED": errors.MessageIdRepeated,
    "KVS_BAD_SUMMARY": errors.InvalidSummaryRange,
    "KVS_NOT_FOUND": errors.MessageNotFound,
    "KVS_BAD_INDEX": errors.RecordError,
    "KVS_CURSOR_NOT_FOUND": errors.MessageNotFound,
    "KVS_CURSOR_EXPIRED": errors.CursorExpired,
    "KVS_TURN_NOT_FOUND": errors.TurnNotFound,
    "KVS_TURN_FINISHED": errors.TurnFinished,
    "KVS_TURN_FENCED": errors.TurnFenced,
    "KVS_HISTORY": errors.HistoryConflict,
    "KVS_RESTORE_CONFLICT": errors.RestoreConflict,
    "KVS_RESTORING": errors.RestoreIncomplete,
    "KVS_BAD_BACKUP": errors.InvalidMessage,
    "KVS_QUOTA": errors.QuotaExceeded,
    "KVS_QUOTA_BYTES": errors.StorageQuotaExceeded,
    "KVS_OWNER_ERASING": errors.OwnerErasing,
}

_KVS_CODE = re.compile(r"(KVS_[A-Z_]+) ?(.*)", re.DOTALL)


def error_from_reply(script: Script, message: str) -> errors.KVStoreError:
    """Maps a script's error reply to a typed error; unknown errors name the script."""
    match = _KVS_CODE.search(message)
    if match and match.group(1) in ERROR_CODES:
        try:
            return ERROR_CODES[match.group(1)]._from_script(
                match.group(2).strip() or match.group(1)
            )
        except ValueError:  # a detail without the number its class reads first
            return errors.ServerError(
                f"script {script.name}.lua replied an error kvstore cannot read: {message}"
            )
    if (
        message.startswith("NOPERM")
        or "no permissions" in message
        or "can't run this command" in message
        or "can't access" in message
    ):
        return errors.PermissionDenied(f"{script.name}: {message}")
    return errors.ServerError(f"script {script.name}.lua failed: {message}")
