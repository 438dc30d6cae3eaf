"""docs/ARCHITECTURE.md lists every module of the package and every Lua file, one table row each
with what it owns, and names the files a new stored layout touches: a module added, removed or
renamed without the page fails here, so the page stays the map of the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")
LAYOUT_CHANGE = "## What a new layout touches"


def _rows() -> dict[str, str]:
    """Each table row's first cell (a path from the repository's root) and what it says."""
    rows = {}
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match and match.group(1) != "module":
            rows[match.group(1)] = match.group(2).strip()
    return rows


def _modules() -> set[str]:
    found = [*(ROOT / "kvstore").rglob("*.py"), *(ROOT / "lua").rglob("*.py")]
    found += (ROOT / "lua").rglob("*.lua")
    return {path.relative_to(ROOT).as_posix() for path in found}


def test_every_module_has_one_row_saying_what_it_owns() -> None:
    rows, modules = _rows(), _modules()
    assert sorted(modules - rows.keys()) == [], "modules docs/ARCHITECTURE.md does not list"
    listed = {path for path in rows if path.endswith((".py", ".lua"))}
    assert sorted(listed - modules) == [], "rows of docs/ARCHITECTURE.md naming no file"
    assert [path for path in modules if len(rows[path]) < 12] == [], "rows that say nothing"


def test_the_files_a_new_layout_touches_exist_and_are_few() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert LAYOUT_CHANGE in text
    section = text.split(LAYOUT_CHANGE, 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`((?:kvstore|lua|tests|docs)/[^`]+)`", section)
    assert named, "the section names no file"
    missing = [path for path in named if not (ROOT / path.rstrip("/")).exists()]
    assert missing == []
    assert len(set(named)) <= 12
