"""What the server sees of the append benchmark's operations: the round trips and commands of one
call of each (INFO commandstats around it, socket writes counted), and the server time per call
over many calls.

It uses a client of its own that counts its socket writes, on the fixture's threads and keys.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from kvstore import MessageStore, Thread

from ._append_fixture import PAGE, Bench, Params
from ._common import (
    SCRIPT_COMMANDS,
    MessagePool,
    command_stats,
    counting_client,
    new_messages,
    stats_diff,
)


def server_side(bench: Bench) -> dict[str, Any]:
    counting, sent = counting_client(bench.url)
    try:
        store = MessageStore(counting, bench.config)
        big, small = store.thread("big"), store.thread("read-100")
        single = _single_calls(bench, counting, sent, big, small)
        timed = _timed_calls(bench, counting, big, small)
    finally:
        counting.close()
    return {"single": single, "timed": timed}


def _single_calls(
    bench: Bench, counting: redis.Redis, sent: list[int], big: Thread, small: Thread
) -> dict[str, Any]:
    """One call of each: the typical append and the one that also moves a chunk, a page, the bare
    script."""

    def one(fn: Callable[[], Any]) -> dict[str, Any]:
        before = command_stats(counting)
        sent[0] = 0
        fn()
        trips = sent[0]
        return {"round_trips": trips, "commands": stats_diff(before, command_stats(counting))}

    # One chunk's worth of appends: all but one only store; one also moves a chunk.
    cycle = [
        one(lambda m=m: big.append(m)) for m in new_messages(bench.texts, bench.config.chunk_size)
    ]
    shapes = Counter(_shape(c) for c in cycle)
    common, share = shapes.most_common(1)[0]
    typical = next(c for c in cycle if _shape(c) == common)
    moving = [
        c
        for c in cycle
        if sum(v["calls"] for v in c["commands"].values())
        > sum(v["calls"] for v in typical["commands"].values())
    ]
    return {
        "append": typical,
        "append_typical_share": f"{share} of {len(cycle)}",
        "append_moving_a_chunk": moving[0] if moving else None,
        "page": one(lambda: small.list(limit=PAGE, order="desc")),
        "bare_script": one(lambda: bench.bare_script(counting, bench.ids[-1])),
    }


def _shape(call: dict[str, Any]) -> str:
    """A call's round trips and command counts, as one comparable value."""
    return json.dumps(
        [call["round_trips"], sorted((k, v["calls"]) for k, v in call["commands"].items())]
    )


def _timed_calls(bench: Bench, counting: redis.Redis, big: Thread, small: Thread) -> dict[str, Any]:
    """The commands per operation and their server time per call, over `server_calls` calls."""
    calls = bench.params.server_calls

    def many(fn: Callable[[int], Any]) -> dict[str, Any]:
        before = command_stats(counting)
        for i in range(calls):
            fn(i)
        diff = stats_diff(before, command_stats(counting))
        return {
            "calls": calls,
            "commands": {
                name: {**d, "usec_per_call": d["usec"] / d["calls"], "per_op": d["calls"] / calls}
                for name, d in diff.items()
            },
        }

    ids = bench.ids[-calls - 10 : -10]
    pool = MessagePool(bench.texts, calls)
    return {
        "append": many(lambda i: big.append(pool.take())),
        "bare_script": many(lambda i: bench.bare_script(counting, ids[i])),
        "page": many(lambda i: small.list(limit=PAGE, order="desc")),
        "list_page": many(lambda i: counting.lrange(bench.list_100, -PAGE, -1)),
    }


def render_server_side(server: dict[str, Any], params: Params) -> list[str]:
    """What one call of each sent and the server ran, then the server time per call."""
    single = server["single"]
    lines: list[str] = []
    for what, label in (
        ("append", f"one append ({single['append_typical_share']})"),
        ("append_moving_a_chunk", "one append that also moves a chunk"),
        ("bare_script", "one bare EVALSHA"),
        ("page", "one newest-50 page (kvstore)"),
    ):
        s = single.get(what)
        if not s:
            continue
        scripted = {k: v["calls"] for k, v in s["commands"].items() if k in SCRIPT_COMMANDS}
        inner = {k: v["calls"] for k, v in s["commands"].items() if k not in SCRIPT_COMMANDS}
        if scripted:
            detail = (
                ", ".join(f"{k} ×{v}" for k, v in sorted(scripted.items()))
                + ", run inside it: "
                + ", ".join(f"{k} ×{v}" for k, v in sorted(inner.items()))
                + f" ({sum(inner.values())} commands)"
            )
        else:
            detail = ", ".join(f"{k} ×{v}" for k, v in sorted(inner.items()))
        lines.append(f"{label}: {s['round_trips']} round trip(s); server saw {detail}")
    timed = server["timed"]
    lines.append(f"server time per call (usec_per_call over {params.server_calls:,} calls):")

    def per_op(entry: dict, names: list[str] | None = None) -> float:
        return (
            sum(d["usec"] for k, d in entry["commands"].items() if names is None or k in names)
            / entry["calls"]
        )

    append_total = per_op(timed["append"], list(SCRIPT_COMMANDS))
    inner = per_op(timed["append"]) - append_total
    lines.append(
        f"  fcall, kvstore append ({params.big:,}+ thread):    {append_total:6.1f} µs"
        f"  ({inner:.1f} in the commands it runs, {append_total - inner:.1f} in Lua and reply conversion)"
    )
    lines.append(
        f"  evalsha, bare 4-write script:                 {per_op(timed['bare_script'], list(SCRIPT_COMMANDS)):6.1f} µs"
    )
    page = timed["page"]["commands"]
    parts = ", ".join(
        f"{k} ×{d['per_op']:.0f} {d['usec_per_call']:.1f}" for k, d in sorted(page.items())
    )
    lines.append(
        f"  kvstore newest 50 (thread of 100):            {per_op(timed['page']):6.1f} µs  ({parts})"
    )
    lines.append(
        f"  JSON list newest 50 (LRANGE -50 -1):          {per_op(timed['list_page']):6.1f} µs"
    )
    return lines
