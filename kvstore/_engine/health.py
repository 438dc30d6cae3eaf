"""health(): what the server kvstore talks to promises, and which of kvstore's guarantees it voids.

kvstore's guarantees hold only as far as the server keeps what it acknowledged: an eviction policy
may drop one key of a thread (a chunk, its index, the id map) and leave the rest inconsistent, and
a server without persistence loses everything on a restart. The report reads the server's version,
whether Lua runs, whether kvstore's function library is loaded, its eviction policy and its
persistence settings, and says in words which settings weaken what docs/RELIABILITY.md states.

It never raises for a denied or unknown command. A least-privileged user (the README's ACL line)
may not run INFO, CONFIG GET, EVAL or FUNCTION LIST: the report then reads what that user can
(the version from HELLO, whether the library is loaded from an FCALL_RO the server refuses before
running anything), and lists each setting it could not read, and why, in `unchecked`.

The probe is written once, as a generator of client calls; `health` makes them on a synchronous
client, `health_async` awaits them on an asyncio one.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

import redis

from .. import errors
from .failures import is_fakeredis
from .health_report import HealthReport
from .scripts import LIBRARY, SCRIPTS
from .text import text as _text

# The oldest servers whose scripts honour the `#!lua` shebang flags (checked before a write runs).
MIN_REDIS = (7, 0)
MIN_VALKEY = (7, 2)
# One client call: a method of redis.Redis / redis.asyncio.Redis and its arguments. Its reply
# comes back in, or the redis error it raised (a refusal is an answer here); only a connection
# that fails ends the probe.
Probe = Generator[tuple[str, tuple[Any, ...]], Any, Any]


def health(client: Any) -> HealthReport:
    """Reads the server behind a synchronous client (redis.Redis, or fakeredis) and reports.

    Raises ConnectionFailed (a ServerError) only when the server cannot be reached at all.
    """
    run = _Run(client)
    while (call := run.next_call()) is not None:
        method, args = call
        with run.answering():
            run.reply = getattr(client, method)(*args)
    assert run.report is not None  # made once next_call gives None
    return run.report


async def health_async(client: Any) -> HealthReport:
    """The same report, read through an asyncio client (redis.asyncio.Redis, or fakeredis's)."""
    run = _Run(client)
    while (call := run.next_call()) is not None:
        method, args = call
        with run.answering():
            run.reply = await getattr(client, method)(*args)
    assert run.report is not None  # made once next_call gives None
    return run.report


class _Run:
    """The probe's side of `health` and `health_async`: the calls to make, and each call's reply,
    or the redis error it raised; only the making of the call (awaited or not) is theirs."""

    def __init__(self, client: Any) -> None:
        self.probe = _report(fake=is_fakeredis(client))
        self.reply: Any = None
        self.report: HealthReport | None = None

    def next_call(self) -> tuple[str, tuple[Any, ...]] | None:
        """The next client call, or None once the report is made (in `report`)."""
        try:
            return self.probe.send(self.reply)
        except StopIteration as done:
            self.report = done.value
            return None

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Around one call: a refusal (or a call a cluster client cannot route) is the reply;
        a connection that fails ends the probe."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise errors.ConnectionFailed(f"cannot reach the server: {exc}") from exc
        except redis.RedisError as exc:
            self.reply = exc


def _report(fake: bool = False) -> Probe:
    if fake:
        return HealthReport(
            server="fakeredis",
            lua=(yield from _lua())[0],
            library_loaded=(yield from _library_loaded())[0],
            warnings=("fakeredis runs in this process: nothing persists, nothing is shared",),
        )
    warnings: list[str] = []
    unchecked: list[str] = []
    name, version = yield from _server(warnings, unchecked)
    library_loaded, library_why = yield from _library_loaded()
    lua, lua_note = yield from _lua()
    if lua is None and library_loaded:
        lua = True  # the server holds kvstore's functions, which are Lua
    elif lua is None:
        library = (
            f"whether kvstore's library is loaded is unknown ({library_why})"
            if library_why
            else ("kvstore's library is not loaded yet (the first write loads it)")
        )
        unchecked.append(f"whether Lua runs: {lua_note}, and {library}")
    elif lua is False:
        warnings.append(f"Lua scripts do not run ({lua_note}): kvstore cannot write")
    settings = yield from _settings(warnings, unchecked)
    aof_ok = yield from _aof_write_ok(settings["appendonly"], warnings, unchecked)
    return HealthReport(
        server=name,
        version=version,
        lua=lua,
        **settings,
        aof_last_write_ok=aof_ok,
        library_loaded=library_loaded,
        scripts_loaded=(yield from _scripts_loaded()),
        warnings=tuple(warnings),
        unchecked=tuple(unchecked),
    )


def _server(warnings: list[str], unchecked: list[str]) -> Probe:
    """The server's name and version (INFO, else HELLO), checked against the versions kvstore needs."""
    info = yield ("info", ("server",))
    if isinstance(info, Exception):
        hello = yield ("execute_command", ("HELLO",))
        if isinstance(hello, Exception):
            unchecked.append(f"the server's version: INFO {_why(info)}, HELLO {_why(hello)}")
            return "unknown", None
        hello = {_text(k): v for k, v in hello.items()} if isinstance(hello, dict) else {}
        name, version = _text(hello.get("server") or "unknown"), hello.get("version")
    else:
        name = "valkey" if "valkey_version" in info else str(info.get("server_name") or "redis")
        version = info.get("valkey_version") or info.get("redis_version")
    if version is None:
        unchecked.append("the server's version: neither INFO nor HELLO gave it")
        return name, None
    version = _text(version)
    _check_version(name, version, warnings)
    return name, version


class _Settings(TypedDict):
    maxmemory: int | None
    maxmemory_policy: str | None
    appendonly: bool | None
    appendfsync: str | None
    save: str | None


def _settings(warnings: list[str], unchecked: list[str]) -> Probe:
    """The memory and persistence settings (CONFIG GET; where it is denied, what INFO shows),
    with what they void of kvstore's guarantees."""
    names = ("maxmemory", "maxmemory-policy", "appendonly", "appendfsync", "save")
    config: dict[str, str] = {}
    for name in names:
        reply = yield ("config_get", (name,))
        if isinstance(reply, Exception):
            config = yield from _settings_from_info(reply, unchecked)
            break
        config.update({_text(k): _text(v) for k, v in reply.items()})
    settings: _Settings = {
        "maxmemory": int(config["maxmemory"]) if "maxmemory" in config else None,
        "maxmemory_policy": config.get("maxmemory-policy"),
        "appendonly": config["appendonly"] == "yes" if "appendonly" in config else None,
        "appendfsync": config.get("appendfsync"),
        "save": config.get("save"),
    }
    policy = settings["maxmemory_policy"]
    if policy is not None and policy != "noeviction":
        scope = (
            "keys that carry a TTL (with thread_ttl, every key of a thread)"
            if policy.startswith("volatile")
            else "any key"
        )
        warnings.append(
            f"maxmemory-policy is {policy}: the server may evict {scope} and leave a thread with"
            " some of its keys (a chunk without its index entry, messages without their ids);"
            " set maxmemory-policy noeviction, under which a full server refuses writes instead"
        )
    _check_persistence(settings["appendonly"], settings["appendfsync"], settings["save"], warnings)
    return settings


def _settings_from_info(refused: Exception, unchecked: list[str]) -> Probe:
    """What INFO shows of the settings when CONFIG GET is refused (managed services often
    disable CONFIG): the eviction policy and whether AOF is on, not appendfsync nor save."""
    memory = yield ("info", ("memory",))
    persistence = yield ("info", ("persistence",))
    config: dict[str, str] = {}
    if not isinstance(memory, Exception) and "maxmemory_policy" in memory:
        config["maxmemory"] = _text(memory.get("maxmemory", 0))
        config["maxmemory-policy"] = _text(memory["maxmemory_policy"])
    if not isinstance(persistence, Exception) and "aof_enabled" in persistence:
        config["appendonly"] = "yes" if int(persistence["aof_enabled"]) else "no"
    missing = [
        name
        for name in ("maxmemory-policy", "appendonly", "appendfsync", "save")
        if name not in config
    ]
    if config.get("appendonly") == "no":
        missing.remove("appendfsync")  # without AOF it does not matter
    if missing:
        unchecked.append(
            f"{', '.join(missing)}: CONFIG GET {_why(refused)}"
            + (
                ""
                if config
                else f", INFO {_why(memory if isinstance(memory, Exception) else persistence)}"
            )
        )
    return config


def _aof_write_ok(appendonly: bool | None, warnings: list[str], unchecked: list[str]) -> Probe:
    """Whether the last AOF write succeeded (INFO persistence); None where unknown or AOF is off."""
    if appendonly is False:
        return None
    persistence = yield ("info", ("persistence",))
    if isinstance(persistence, Exception):
        if appendonly:
            unchecked.append(f"the last AOF write's status: INFO {_why(persistence)}")
        return None
    if "aof_last_write_status" not in persistence or not appendonly:
        return None
    if persistence["aof_last_write_status"] != "ok":
        warnings.append(
            "the last AOF write failed (aof_last_write_status is not ok): check the disk"
        )
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


def _check_persistence(
    appendonly: bool | None, appendfsync: str | None, save: str | None, warnings: list[str]
) -> None:
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


def _lua() -> Probe:
    """Whether `EVAL "return 1"` runs (None: it may not be asked), and what EVAL answered."""
    reply = yield ("eval", ("return 1", 0))
    if isinstance(reply, Exception):
        return (None if _denied(reply) else False), f"EVAL {_why(reply)}"
    return int(reply) == 1, ""


def _library_loaded() -> Probe:
    """Whether kvstore's function library is loaded, and if unknown why: FUNCTION LIST, else an
    FCALL_RO of one of its writing functions, which the server refuses before running anything
    ("write flag") when the function exists and answers "Function not found" when it does not."""
    listed = yield ("function_list", (LIBRARY.name,))
    if not isinstance(listed, Exception):
        return bool(listed), ""
    writer = next(script for script in SCRIPTS.values() if script.writes)
    probed = yield ("fcall_ro", (writer.function, 0))
    text = str(probed).lower()
    if "write flag" in text:
        return True, ""
    if "function not found" in text:
        return False, ""
    return (
        None,
        f"FUNCTION LIST {_why(listed)}, FCALL_RO {_why(probed) if isinstance(probed, Exception) else 'ran'}",
    )


def _scripts_loaded() -> Probe:
    """How many of kvstore's scripts are in the server's script cache (None: SCRIPT EXISTS denied)."""
    found = yield ("script_exists", tuple(script.sha for script in SCRIPTS.values()))
    if isinstance(found, Exception):
        return None
    return sum(1 for present in found if present)


def _denied(exc: Exception) -> bool:
    text = str(exc).lower()
    return (
        isinstance(exc, redis.exceptions.NoPermissionError)
        or "no permissions" in text
        or "noperm" in text
    )


def _why(exc: Exception) -> str:
    """Why a command gave no answer, in a few words."""
    if _denied(exc):
        return "is denied to this user"
    return f"failed ({str(exc)[:80]})"
