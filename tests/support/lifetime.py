"""Every process the tests start dies with the test process, however that ends (SIGKILL too).

Two mechanisms, both on by default:

- Linux: the child asks the kernel for a signal when its parent dies (`prctl(PR_SET_PDEATHSIG)`).
  The kernel sends it when the *thread* that started the child ends, so it is asked for only by
  children started from the main thread.
- Everywhere: a reaper, one small process per test process, reading the pids of the processes
  started (and forgotten once stopped) on a pipe from it. The pipe reads its end when the test
  process is gone, however it died; the reaper then SIGKILLs every pid still listed, and exits.
  It runs in its own session, so a Ctrl-C meant for the tests does not reach it.

tests/integration/test_test_servers.py SIGKILLs a pytest run holding servers and checks they go.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

__all__ = ["Popen", "dies_with_tests", "forget", "watch"]

PR_SET_PDEATHSIG = 1

# The reaper: pids in ("pid" / "-pid" lines) until its stdin ends, then SIGKILL to the rest. A
# pid is killed only if its process started when the listed one did (Linux's /proc): a number
# that has since gone to another process is left alone.
REAPER = """
import os, signal, sys
def started(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None
signal.signal(signal.SIGINT, signal.SIG_IGN)
pids = {}
for line in sys.stdin:
    pid = int(line)
    if pid > 0:
        pids[pid] = started(pid)
    else:
        pids.pop(-pid, None)
for pid, start in pids.items():
    if started(pid) == start:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""

_reapers: dict[int, subprocess.Popen[str]] = {}  # this process's pid -> its reaper
_lock = threading.Lock()


def _pipe() -> IO[str]:
    """The pipe to this process's reaper, started on first use (a forked child starts its own)."""
    reaper = _reapers.get(os.getpid())
    if reaper is None:
        reaper = _reapers[os.getpid()] = subprocess.Popen(
            [sys.executable, "-c", REAPER],
            stdin=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        atexit.register(_end_reaper, reaper)
    assert reaper.stdin is not None  # a pipe, as asked
    return reaper.stdin


def _end_reaper(reaper: subprocess.Popen[str]) -> None:
    """At a normal exit: the reaper stops what is still listed (nothing, when every test
    stopped its processes) and exits."""
    if _reapers.get(os.getpid()) is reaper:
        assert reaper.stdin is not None
        reaper.stdin.close()
        reaper.wait()


def _tell(line: str) -> None:
    with _lock:
        pipe = _pipe()
        pipe.write(line + "\n")
        pipe.flush()


def watch(pid: int) -> None:
    """The reaper SIGKILLs `pid` if this process dies before `forget(pid)`."""
    _tell(f"{pid}")


def forget(pid: int) -> None:
    """`pid` has ended (its number may be given to another process): the reaper drops it."""
    _tell(f"-{pid}")


def dies_with_tests() -> Callable[[], None] | None:
    """A preexec_fn: on Linux, and from the main thread, the child gets SIGKILL when the process
    starting it dies. None where the kernel cannot promise that (the reaper still does)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
    parent = os.getpid()

    def arrange() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the prctl
            os._exit(1)

    return arrange


class Popen(subprocess.Popen[Any]):
    """subprocess.Popen whose process dies with the tests (see above), forgotten once reaped."""

    def __init__(self, args: Any, **options: Any) -> None:
        super().__init__(args, preexec_fn=dies_with_tests(), **options)
        watch(self.pid)
        self._watched = True

    def poll(self) -> int | None:
        return self._reaped(super().poll())

    def wait(self, timeout: float | None = None) -> int:
        return self._reaped(super().wait(timeout))

    def _reaped(self, code: Any) -> Any:
        if code is not None and self._watched:
            self._watched = False
            forget(self.pid)
        return code
