"""An inner test session for tests/integration/test_test_servers.py (not collected on its own:
its name is not test_*): it holds a server of each way the tests start one, writes their pids to
the file KVSTORE_HELD_PIDS names, and waits to be killed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..conftest import _start_servers
from . import lifetime
from .servers import ServerProcess, valkey_binary

HELD = "KVSTORE_HELD_PIDS"


def test_hold_servers() -> None:
    """Session servers (conftest), a dedicated one, one in its own session (as a cluster node
    runs), one started from another thread, and `kvstore server` as a subprocess."""
    pids = [server.process.pid for server in _start_servers().values()]
    held = [
        ServerProcess("held", valkey_binary()).start(),
        ServerProcess("held-own-session", valkey_binary(), own_session=True).start(),
    ]
    from_thread = threading.Thread(
        target=lambda: held.append(ServerProcess("held-thread", valkey_binary()).start())
    )
    from_thread.start()
    from_thread.join()
    cli = lifetime.Popen(
        [sys.executable, "-m", "kvstore", "server", "--port", "0", "--data-dir", "cli-data"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(os.environ[HELD]).parent,
    )
    assert cli.stdout is not None and " on " in cli.stdout.readline()
    pids += [server.process.pid for server in held] + [cli.pid, *_children(cli.pid)]
    # Written aside then renamed: the outer test reads the file as soon as it exists.
    target = Path(os.environ[HELD])
    partial = target.with_name(target.name + ".partial")
    partial.write_text(" ".join(map(str, pids)) + "\n")
    partial.replace(target)
    time.sleep(600)  # killed long before


def _children(pid: int) -> list[int]:
    """The processes `pid` started (Linux: the embedded server of `kvstore server`)."""
    try:
        return [
            int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        ]
    except OSError:
        return []
