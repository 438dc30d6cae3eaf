"""Server time per call from INFO commandstats, shared by server_cost and aof: one operation
timed alone, a recorded multi-request operation replayed, each append's time from SLOWLOG."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

from ._common import SCRIPT_COMMANDS, command_stats, stats_diff


def cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def timed(
    client: redis.Redis, calls: int, fn: Callable[[int], Any], scripted: bool
) -> dict[str, Any]:
    """Server time per call of `fn`: its script command's time if `scripted`, else the sum of its
    commands."""
    cpu_before, before = cpu_seconds(client), command_stats(client)
    for i in range(calls):
        fn(i)
    after, cpu_after = command_stats(client), cpu_seconds(client)
    diff = stats_diff(before, after)
    diff.pop("cpu", None)
    diff = {k: v for k, v in diff.items() if not k.startswith("info")}
    if scripted:
        scripts = {k: v for k, v in diff.items() if k in SCRIPT_COMMANDS}
        usec = sum(v["usec"] for v in scripts.values())
        inner = sum(v["usec"] for k, v in diff.items() if k not in scripts)
    else:
        usec, inner = sum(v["usec"] for v in diff.values()), 0
    return {
        "calls": calls,
        "usec_per_call": usec / calls,
        "inner_usec_per_call": inner / calls,
        "cpu_usec_per_call": (cpu_after - cpu_before) * 1e6 / calls,
        "commands": {
            k: {**v, "per_call": v["calls"] / calls, "usec_per_call": v["usec"] / v["calls"]}
            for k, v in sorted(diff.items())
        },
    }


def slowlog_entries(client: redis.Redis, run: Callable[[], Any], calls: int) -> list[Any]:
    """What SLOWLOG logged, with a 0 µs threshold, while `run()` made about `calls` calls (own
    servers only: CONFIG SET)."""
    client.config_set("slowlog-log-slower-than", 0)
    # Valkey also logs the commands a script runs: room for all of them.
    client.config_set("slowlog-max-len", calls * 40)
    client.slowlog_reset()
    try:
        run()
        return list(client.slowlog_get(calls * 40))
    finally:
        client.config_set("slowlog-log-slower-than", 10000)


def slowlog_appends(
    client: redis.Redis, append: Callable[[int], Any], calls: int, per_chunk: int
) -> dict[str, Any] | None:
    """Each append's own server time, from SLOWLOG with a 0 µs threshold (own servers only):
    the typical append against the one in `per_chunk` (the messages a chunk holds) that also
    moves a chunk."""
    try:
        client.config_set("slowlog-log-slower-than", 10000)
    except redis.ResponseError:
        return None  # a server that refuses CONFIG SET: no SLOWLOG figure
    entries = slowlog_entries(client, lambda: [append(i) for i in range(calls)], calls)
    scripted = tuple(name.upper().encode() + b" " for name in SCRIPT_COMMANDS)
    durations = sorted(
        e["duration"] for e in entries if bytes(e["command"]).upper().startswith(scripted)
    )
    if not durations:
        return None
    moving = max(1, len(durations) // per_chunk)
    return {
        "calls": len(durations),
        "median_us": durations[len(durations) // 2],
        "typical_mean_us": sum(durations[:-moving]) / (len(durations) - moving),
        "slowest_share_mean_us": sum(durations[-moving:]) / moving,
        "slowest_share": f"1 in {per_chunk} ({moving})",
    }


def replayed(
    client: redis.Redis,
    calls: int,
    requests: Sequence[Sequence[Any]],
    replay: Callable[[Any], Callable[[int], Any]],
    scripted: Callable[[Any], bool],
) -> dict[str, Any]:
    """An operation of several requests, recorded on one or more threads (`requests[t]`: the
    requests of thread t, in order): the j-th request of every thread replayed in turn `calls`
    times (call i on thread i % threads), for each j, the times added up. One thread: the same
    thread's requests again and again (hot); many: each call reads other keys than the last
    (cold)."""
    parts = []
    for j in range(len(requests[0])):
        senders = [replay(thread[j]) for thread in requests]
        parts.append(timed(client, calls, _round(senders), scripted(requests[0][j])))
    return {
        "calls": calls,
        "threads": len(requests),
        "usec_per_call": sum(p["usec_per_call"] for p in parts),
        "inner_usec_per_call": sum(p["inner_usec_per_call"] for p in parts),
        "cpu_usec_per_call": sum(p["cpu_usec_per_call"] for p in parts),
        "parts": parts,
    }


def _round(senders: list[Callable[[int], Any]]) -> Callable[[int], Any]:
    """Call i sends `senders[i % len(senders)]`."""
    count = len(senders)
    return lambda i: senders[i % count](i)
