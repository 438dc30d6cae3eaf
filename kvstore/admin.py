"""The operator's surface: what the command line's admin commands call, for deployments whose
application user may not load scripts or read the server's settings.

``health`` / ``health_async`` read the server's settings kvstore's guarantees depend on (also
``store.health()``); ``preload_library`` and ``preload_scripts`` load kvstore's function library
and scripts as an admin user, for application users denied FUNCTION LOAD or EVAL.
"""

from __future__ import annotations

from typing import Any

import redis

from . import errors
from ._engine.health import HealthReport, health, health_async
from ._engine.scripts import LIBRARY, SCRIPTS

__all__ = ["HealthReport", "health", "health_async", "preload_library", "preload_scripts"]


def preload_library(client: Any) -> str | None:
    """Loads kvstore's function library (FUNCTION LOAD); returns its name, or None where the
    server knows no functions (its stores use the EVAL path).

    For deployments whose application user may not run FUNCTION LOAD: an operator runs this as
    an admin user once per kvstore version (the name carries the digest of its source) and after
    a FUNCTION FLUSH or a restart that lost the data. Functions are saved with the data (RDB,
    AOF) and replicated, so a restart with persistence and a failover keep them.
    """
    try:
        name = client.function_load(LIBRARY.source)
    except redis.exceptions.NoPermissionError as exc:
        raise errors.PermissionDenied(
            f"this user may not load kvstore's function library: {exc}"
        ) from None
    except redis.ResponseError as exc:
        if "already exists" in str(exc):
            return LIBRARY.name
        if str(exc).lower().startswith("unknown"):
            return None
        raise
    name = name.decode() if isinstance(name, bytes) else str(name)
    if name != LIBRARY.name:
        raise errors.ServerError(
            f"the server loaded the library as {name}, kvstore named it {LIBRARY.name}"
        )
    return name


def preload_scripts(client: Any) -> dict[str, str]:
    """Loads every kvstore script into the server's script cache; returns name -> SHA.

    The EVAL path's scripts (scripting="eval", cluster clients, servers without functions), for
    deployments whose application user may not run EVAL: an operator runs this as an admin user
    after every server start, failover or SCRIPT FLUSH (the cache is neither persisted nor
    replicated). On a cluster, run it against every primary. The SHAs are
    kvstore._engine.scripts.SCRIPTS[name].sha.
    """
    loaded: dict[str, str] = {}
    for name, script in SCRIPTS.items():
        sha = client.script_load(script.source)
        sha = sha.decode() if isinstance(sha, bytes) else str(sha)
        if sha != script.sha:
            raise errors.ServerError(
                f"the server hashed {name}.lua to {sha}, kvstore to {script.sha}"
            )
        loaded[name] = sha
    return loaded
