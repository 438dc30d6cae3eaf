"""The previous release (layout 2), run in a child process: it writes layout-2 threads exactly as
that release does, and plays the older worker of a mixed fleet.

Its source is the commit PREVIOUS of this repository (`git archive`), unpacked once per test
session into a temporary directory and imported from there (its own scripts, its own function
library: the two releases' libraries load side by side). Without git or that commit, the tests
that need it are skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

# The last commit of the release that wrote layout 2.
PREVIOUS = "658d5c4"

_ROOT = Path(__file__).resolve().parents[2]
_TREE = Path(tempfile.gettempdir()) / f"kvstore-release-{PREVIOUS}-{os.getuid()}-1"

# What the child runs around the caller's code: a store of the previous release on `url`, with
# `config`; the code leaves what it returns in `result` (anything json can write).
_PRELUDE = """
import json, sys
from kvstore import *
from kvstore import errors
request = json.load(sys.stdin)
store = MessageStore.from_url(request["url"], StoreConfig(**request["config"]))
result = None
"""


def previous_release() -> Path:
    """The unpacked source of the previous release (skips the test when it cannot be had)."""
    if (_TREE / "kvstore" / "lua" / "__init__.py").exists():
        return _TREE
    tree = Path(tempfile.mkdtemp(prefix="kvstore-release-"))
    try:
        archive = subprocess.run(
            ["git", "-C", str(_ROOT), "archive", PREVIOUS, "kvstore", "lua"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        # Installed, the scripts are the package kvstore.lua (pyproject.toml): there they are
        # found before an installed kvstore's.
        (tree / "lua").rename(tree / "kvstore" / "lua")
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the previous release ({PREVIOUS}) is not in this checkout: {exc}")
    with contextlib.suppress(OSError):  # another process unpacked it first
        tree.rename(_TREE)
    return _TREE


def run_previous(url: str, config: dict[str, Any], code: str) -> Any:
    """Runs `code` in a child process on the previous release (names: `store`, every public name
    of kvstore, `errors`); returns what it left in `result`. An exception the code raises is
    returned as {"error": its class name, "message": its text}."""
    body = textwrap.indent(textwrap.dedent(code), "    ")
    source = (
        _PRELUDE
        + "try:\n"
        + body
        + "\nexcept Exception as exc:\n"
        + "    result = {'error': type(exc).__name__, 'message': str(exc)}\n"
        + "store.close()\nprint(json.dumps(result))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(previous_release())}
    done = subprocess.run(
        [sys.executable, "-c", source],
        input=json.dumps({"url": url, "config": config}),
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def copy_thread(client, source_keys, target_keys) -> None:
    """Copies every key of a thread to another thread's names (raw COPY: the same bytes)."""
    prefix = source_keys.meta[: -len("meta")]
    target_prefix = target_keys.meta[: -len("meta")]
    pattern = prefix.replace("{", "\\{").replace("}", "\\}") + "*"
    for key in client.scan_iter(match=pattern):
        name = key.decode()[len(prefix) :]
        client.copy(key, target_prefix + name, replace=True)
