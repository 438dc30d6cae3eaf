"""Modules and functions that fit in a head: every module of kvstore/ at most 400 lines
(messages.py, the message models, aside), every function at most 60 (its def line to the last
line of its body). And every module imports alone, in a fresh interpreter: no import circle that
only works in one order."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kvstore"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
EXEMPT_MODULES = {"messages.py"}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def oversized(path: Path) -> list[str]:
    """Each bound the module breaks, named."""
    source = path.read_text(encoding="utf-8")
    where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path.name
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES and path.name not in EXEMPT_MODULES:
        found.append(f"{where}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(
                    f"{where}:{node.lineno} {node.name}: {length} lines"
                    f" (at most {MAX_FUNCTION_LINES})"
                )
    return found


def test_every_module_and_function_within_its_bound():
    broken = [line for path in modules() for line in oversized(path)]
    assert broken == [], "\n".join(broken)


def test_the_bounds_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long = tmp_path / "long.py"
    long.write_text(f"def long():\n{body}\n")
    assert oversized(long) == ["long.py:1 long: 61 lines (at most 60)"]


def test_every_module_imports_alone():
    """Each module outside the engine imported first, in a fresh import state: one interpreter,
    kvstore's modules dropped from sys.modules before each. (The engine's modules are the
    circle test's below: importing each of them alone too would double this test's time.)"""
    names = [module_name(path) for path in modules() if path.name != "__main__.py"]
    names = [name for name in names if not name.startswith("kvstore._engine.")]
    script = (
        "import importlib, sys, traceback\n"
        f"failed = []\nfor name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'kvstore' or m.startswith('kvstore.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n        importlib.import_module(name)\n"
        "    except Exception:\n        failed.append(name + ': ' + traceback.format_exc(limit=3))\n"
        "print('\\n'.join(failed))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def imports(path: Path) -> set[str]:
    """The kvstore modules `path` imports: at the top, under TYPE_CHECKING, inside functions."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    known = {module_name(other) for other in modules()}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join([*base, node.module or ""]).strip(".") if node.level else node.module
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in known else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return (found & known) - {name}


def test_no_import_circle():
    """No module imports, however indirectly and however lazily, one that imports it back (as
    store.py and thread.py once did, one of them under TYPE_CHECKING)."""
    graph = {module_name(path): imports(path) for path in modules()}
    circles = []
    for start in graph:
        seen, todo = set(), [(start, [start])]
        while todo:
            node, trail = todo.pop()
            for after in graph[node]:
                if after == start:
                    circles.append(" -> ".join([*trail, start]))
                elif after not in seen:
                    seen.add(after)
                    todo.append((after, [*trail, after]))
    assert circles == [], "\n".join(sorted(circles))
