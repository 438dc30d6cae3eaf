"""health(): what the server kvstore talks to promises, and which of kvstore's guarantees it voids.

kvstore's guarantees hold only as far as the server keeps what it acknowledged: an eviction policy
may drop one key of a thread (a chunk, its index, the id map) and leave the rest inconsistent, and
a server without persistence loses everything on a restart. The report reads the server's version,
whether Lua runs, whether kvstore's function library is loaded, its eviction policy and its
persistence settings, and says in words which settings weaken what docs/RELIABILITY.md states. It
never raises for a denied or unknown command: what cannot be read is reported as unknown, with a
warning.
"""

from __future__ import annotations

from typing import Any

import redis
from pydantic import BaseModel, ConfigDict

from .. import errors
from .scripts import LIBRARY, SCRIPTS

# The oldest servers whose scripts honour the `#!lua` shebang flags (checked before a write runs).
MIN_REDIS = (7, 0)
MIN_VALKEY = (7, 2)


class HealthReport(BaseModel):
    """The server's relevant settings; `warnings` names each one that voids a guarantee."""

    model_config = ConfigDict(frozen=True)

    server: str
    version: str | None = None
    lua: bool | None = None
    maxmemory: int | None = None
    maxmemory_policy: str | None = None
    appendonly: bool | None = None
    appendfsync: str | None = None
    save: str | None = None
    aof_last_write_ok: bool | None = None
    library: str = LIBRARY.name
    library_loaded: bool | None = None
    scripts_loaded: int | None = None
    scripts_total: int = len(SCRIPTS)
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.warnings

    def __str__(self) -> str:
        def show(value: Any) -> str:
            return "unknown" if value is None else str(value)

        lines = [
            f"server           {self.server} {show(self.version)}",
            f"lua              {show(self.lua)}",
            f"maxmemory        {show(self.maxmemory)} (policy {show(self.maxmemory_policy)})",
            f"appendonly       {show(self.appendonly)} (appendfsync {show(self.appendfsync)})",
            f"save             {show(self.save if self.save is None else repr(self.save))}",
            f"library          {self.library} loaded: {show(self.library_loaded)}",
            f"scripts cached   {show(self.scripts_loaded)} of {self.scripts_total} (for scripting='eval')",
        ]
        lines += [f"warning: {w}" for w in self.warnings] or ["ok: no setting voids kvstore's guarantees"]
        return "\n".join(lines)


def health(client: Any) -> HealthReport:
    """Reads the server behind a synchronous client (redis.Redis, or fakeredis) and reports.

    Raises ServerError only when the server cannot be reached at all.
    """
    try:
        return _health(client)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise errors.ServerError(f"cannot reach the server: {exc}") from exc


def _health(client: Any) -> HealthReport:
    if type(client).__module__.startswith("fakeredis"):
        return HealthReport(
            server="fakeredis",
            lua=_lua(client)[0],
            library_loaded=_library_loaded(client),
            warnings=("fakeredis runs in this process: nothing persists, nothing is shared",),
        )
    warnings: list[str] = []
    name, version = _server(client, warnings)
    lua, lua_note = _lua(client)
    if lua is False:
        warnings.append(f"Lua scripts do not run ({lua_note}): kvstore cannot write")
    config = _settings(client, warnings)
    return HealthReport(
        server=name,
        version=version,
        lua=lua,
        **config,
        aof_last_write_ok=_aof_write_ok(client, config["appendonly"], warnings),
        library_loaded=_library_loaded(client),
        scripts_loaded=_scripts_loaded(client),
        warnings=tuple(warnings),
    )


def _server(client: Any, warnings: list[str]) -> tuple[str, str | None]:
    """The server's name and version (from INFO), checked against the versions kvstore needs."""
    info = _call(client.info, "server") or {}
    if not info:
        name = "unknown"
    elif "valkey_version" in info:
        name = "valkey"
    else:
        name = str(info.get("server_name") or "redis")
    version = info.get("valkey_version") or info.get("redis_version")
    version = str(version) if version is not None else None
    if version is None:
        warnings.append("cannot read the server version (INFO denied)")
    else:
        _check_version(name, version, warnings)
    return name, version


def _settings(client: Any, warnings: list[str]) -> dict[str, Any]:
    """The memory and persistence settings (CONFIG GET), with what they void of kvstore's guarantees."""
    config = _config(client, ("maxmemory", "maxmemory-policy", "appendonly", "appendfsync", "save"))
    if config is None:
        warnings.append(
            "cannot read the server configuration (CONFIG GET denied): its eviction policy and"
            " persistence are unknown, so kvstore's durability guarantees are unverified"
        )
        config = {}
    settings = {
        "maxmemory": int(config["maxmemory"]) if "maxmemory" in config else None,
        "maxmemory_policy": config.get("maxmemory-policy"),
        "appendonly": config["appendonly"] == "yes" if "appendonly" in config else None,
        "appendfsync": config.get("appendfsync"),
        "save": config.get("save"),
    }
    policy = settings["maxmemory_policy"]
    if policy is not None and policy != "noeviction":
        scope = "keys that carry a TTL (with thread_ttl, every key of a thread)" if policy.startswith("volatile") else "any key"
        warnings.append(
            f"maxmemory-policy is {policy}: the server may evict {scope} and leave a thread with"
            " some of its keys (a chunk without its index entry, messages without their ids);"
            " set maxmemory-policy noeviction, under which a full server refuses writes instead"
        )
    _check_persistence(settings["appendonly"], settings["appendfsync"], settings["save"], warnings)
    return settings


def _aof_write_ok(client: Any, appendonly: bool | None, warnings: list[str]) -> bool | None:
    """Whether the last AOF write succeeded (INFO persistence); None where unknown or AOF is off."""
    persistence = _call(client.info, "persistence") or {}
    if "aof_last_write_status" not in persistence or not appendonly:
        return None
    if persistence["aof_last_write_status"] != "ok":
        warnings.append("the last AOF write failed (aof_last_write_status is not ok): check the disk")
        return False
    return True


def _check_version(name: str, version: str, warnings: list[str]) -> None:
    minimum = MIN_VALKEY if name == "valkey" else MIN_REDIS
    try:
        parts = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        return
    if parts < minimum:
        warnings.append(
            f"{name} {version} is older than {'.'.join(map(str, minimum))}: scripts' shebang flags"
            " are not honoured, so a write may start on a server that is out of memory"
        )


def _check_persistence(appendonly: bool | None, appendfsync: str | None, save: str | None, warnings: list[str]) -> None:
    if appendonly is None:
        return
    if not appendonly:
        if save is not None and save.strip():
            warnings.append(
                f"appendonly is no (snapshots only, save {save!r}): a crash loses every write since"
                " the last snapshot; set appendonly yes and appendfsync always"
            )
        elif save is not None:
            warnings.append(
                "no persistence (appendonly no, save ''): a restart loses every thread;"
                " set appendonly yes and appendfsync always"
            )
        return
    if appendfsync == "everysec":
        warnings.append(
            "appendfsync is everysec: a crash can lose the last second or two of acknowledged"
            " writes; appendfsync always makes every acknowledged write durable"
        )
    elif appendfsync == "no":
        warnings.append(
            "appendfsync is no: the operating system decides when the log reaches the disk, and a"
            " crash of the machine can lose many seconds of acknowledged writes;"
            " set appendfsync always"
        )


def _call(method: Any, *args: Any) -> Any:
    try:
        return method(*args)
    except redis.ResponseError:
        return None


def _lua(client: Any) -> tuple[bool | None, str]:
    try:
        return int(client.eval("return 1", 0)) == 1, ""
    except redis.exceptions.NoPermissionError as exc:
        return None, f"EVAL is denied to this user: {exc}"
    except redis.ResponseError as exc:
        text = str(exc)
        if "no permissions" in text.lower() or "noperm" in text.lower():
            return None, f"EVAL is denied to this user: {text}"
        return False, text


def _library_loaded(client: Any) -> bool | None:
    """Whether kvstore's function library is loaded (None: FUNCTION LIST denied, or a server
    without functions)."""
    try:
        return bool(client.function_list(library=LIBRARY.name))
    except redis.ResponseError:
        return None


def _scripts_loaded(client: Any) -> int | None:
    """How many of kvstore's scripts are in the server's script cache (None: SCRIPT EXISTS denied)."""
    try:
        found = client.script_exists(*(script.sha for script in SCRIPTS.values()))
    except redis.ResponseError:
        return None
    return sum(1 for present in found if present)


def _config(client: Any, names: tuple[str, ...]) -> dict[str, str] | None:
    values: dict[str, str] = {}
    for name in names:
        try:
            reply = client.config_get(name)
        except redis.ResponseError:
            return None
        for key, value in reply.items():
            key = key.decode() if isinstance(key, bytes) else key
            values[key] = value.decode() if isinstance(value, bytes) else str(value)
    return values


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
        raise errors.PermissionDenied(f"this user may not load kvstore's function library: {exc}") from None
    except redis.ResponseError as exc:
        if "already exists" in str(exc):
            return LIBRARY.name
        if str(exc).lower().startswith("unknown"):
            return None
        raise
    name = name.decode() if isinstance(name, bytes) else str(name)
    if name != LIBRARY.name:
        raise errors.ServerError(f"the server loaded the library as {name}, kvstore named it {LIBRARY.name}")
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
            raise errors.ServerError(f"the server hashed {name}.lua to {sha}, kvstore to {script.sha}")
        loaded[name] = sha
    return loaded
