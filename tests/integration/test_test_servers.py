"""The tests' own processes die with the test run, however it ends: a pytest run holding servers
(tests/support/held_servers.py) is killed with SIGKILL, and every server it held goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..support import lifetime
from ..support.held_servers import HELD

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie no longer does: it waits for a parent to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_servers_of_a_killed_test_run_die_with_it(tmp_path):
    held = tmp_path / "pids"
    run = lifetime.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/support/held_servers.py",
        ],
        cwd=ROOT,
        env={**os.environ, HELD: str(held)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the SIGKILL reaches the run alone, not a process group
    )
    pids: list[int] = []
    try:
        assert _wait_for(lambda: held.exists() or run.poll() is not None, 120)
        assert run.poll() is None, f"the inner run ended ({run.returncode}) before holding servers"
        pids = [int(pid) for pid in held.read_text().split()]
        assert len(pids) >= 6 and all(_alive(pid) for pid in pids), pids
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        gone = _wait_for(lambda: not any(_alive(pid) for pid in pids), 20)
        left = [pid for pid in pids if _alive(pid)]
        print(f"\nkilled test run: {len(pids)} servers held, {len(left)} left after SIGKILL")
        assert gone, f"still running after the test run was killed: {left}"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in pids:  # whatever the outcome, this test leaves nothing behind
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
