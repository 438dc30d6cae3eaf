"""The Lua scripts: read from the package, includes inlined, SHAs computed locally.

Each script in ``lua/`` serves one operation. ``--- @include "includes/name"`` lines are replaced
by ``lua/includes/name.lua``; an include is inlined once per script (a second mention is
skipped) and a cycle is an error. Scripts are plain objects, independent of any client: the
executors call them by SHA and load them once on NOSCRIPT.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from . import errors

_INCLUDE = re.compile(r'^--- @include "([a-z_/]+)"\s*$', re.MULTILINE)


class ScriptBuildError(Exception):
    """A script's includes are missing or form a cycle (a packaging bug, not a user error)."""


def _read(name: str) -> str:
    return resources.files("kvstore.lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


def build_source(name: str) -> str:
    """Returns the script's source with every include inlined."""
    included: set[str] = set()

    def expand(source: str, chain: tuple[str, ...]) -> str:
        def replace(match: re.Match[str]) -> str:
            target = match.group(1)
            if target in chain:
                raise ScriptBuildError(f"include cycle: {' -> '.join((*chain, target))}")
            if target in included:
                return f"-- ({target} already included)"
            included.add(target)
            return expand(_read(target), (*chain, target)).rstrip("\n")

        return _INCLUDE.sub(replace, source)

    return expand(_read(name), (name,))


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str
    writes: bool

    @classmethod
    def load(cls, name: str) -> Script:
        source = build_source(name)
        first_line = source.split("\n", 1)[0]
        if not first_line.startswith("#!lua"):
            raise ScriptBuildError(f"{name}.lua must start with a #!lua shebang line")
        return cls(
            name=name,
            source=source,
            sha=hashlib.sha1(source.encode()).hexdigest(),
            writes="no-writes" not in first_line,
        )

    def without_shebang(self) -> Script:
        """The same script for servers whose Lua does not parse the shebang (fakeredis)."""
        body = "--" + self.source[2:]  # keep line numbers: the shebang becomes a comment
        return Script(self.name, body, hashlib.sha1(body.encode()).hexdigest(), self.writes)


SCRIPT_NAMES = (
    "append", "compact", "retain", "start_turn", "finish_turn", "replace", "remove_turn", "delete",
    "migrate",
    "page_plan", "locate", "turn_page",
)
SCRIPTS: dict[str, Script] = {name: Script.load(name) for name in SCRIPT_NAMES}


_ERRORS: dict[str, type[errors.KVStoreError]] = {
    "KVS_WRONGTYPE": errors.LayoutError,
    "KVS_LAYOUT": errors.LayoutError,
    "KVS_TOO_LARGE": errors.MessageTooLarge,
    "KVS_OTID_REPEATED": errors.OtidConflict,
    "KVS_OTID_CONFLICT": errors.OtidConflict,
    "KVS_ID_REPEATED": errors.DuplicateMessageId,
    "KVS_DUPLICATE_ID": errors.DuplicateMessageId,
    "KVS_CURSOR_NOT_FOUND": errors.MessageNotFound,
    "KVS_TURN_NOT_FOUND": errors.TurnNotFound,
    "KVS_TURN_FINISHED": errors.TurnFinished,
    "KVS_NOT_FOUND": errors.MessageNotFound,
    "KVS_BAD_SUMMARY": errors.InvalidCursor,
    "KVS_MIGRATING": errors.MigrationPending,
    "KVS_DELETING": errors.ThreadDeleting,
}

_KVS_CODE = re.compile(r"(KVS_[A-Z_]+) ?(.*)", re.DOTALL)


def error_from_reply(script: Script, message: str) -> errors.KVStoreError:
    """Maps a script's error reply to a typed error; unknown errors name the script."""
    match = _KVS_CODE.search(message)
    if match and match.group(1) == "KVS_MEDIA_OVER":
        return errors.InlineMediaBudget(int(match.group(2).split()[0]))
    if match and match.group(1) == "KVS_CURSOR_EXPIRED":
        deleted_before, _, detail = match.group(2).partition(" ")
        return errors.CursorExpired(detail, int(deleted_before))
    if match and match.group(1) in _ERRORS:
        return _ERRORS[match.group(1)](match.group(2).strip() or match.group(1))
    if message.startswith("NOPERM") or "no permissions" in message or "can't run this command" in message \
            or "can't access" in message:
        return errors.PermissionDenied(f"{script.name}: {message}")
    return errors.ServerError(f"script {script.name}.lua failed: {message}")
