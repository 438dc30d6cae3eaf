"""A history a model can be given: a budgeted context against the whole one, and a fork.

    python -m benchmarks.history [--quick] [--url URL] [--json PATH]

On a thread of 10,000 messages of ~1 KB (2,000 with --quick), interleaved round by round:
``context()`` (every message), ``context(max_tokens=8000)`` (the newest that fit, read newest page
first), and, as the raw floor, ``LRANGE`` of the same number of newest items from a JSON list.
Then ``fork`` of the whole thread, once: its time, the script calls and commands the server ran
(``INFO commandstats``) and the memory it added (``used_memory``), beside a raw copy of the same
records from a JSON list into a new one (``LRANGE`` + ``RPUSH`` in pipelines of 100).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from ._common import (
    Fixture,
    Variant,
    collect_per_server,
    command_stats,
    fill_thread,
    log,
    measure,
    ratio,
    render_ratios,
    standalone_main,
    stats_diff,
    summarize,
)

BUDGET = 8000


@dataclass(frozen=True)
class Params:
    messages: int
    rounds: int
    warmup: int


DEFAULT = Params(messages=10_000, rounds=9, warmup=2)
QUICK = Params(messages=2_000, rounds=5, warmup=1)


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Fixture(url, params, own) as fx:
        client, thread = fx.client, fx.store.thread("history")
        log(f"{fx.version}: filling a thread of {params.messages:,} messages")
        fill_thread(thread, fx.config, fx.texts, params.messages)
        listed = f"{fx.ns}:list"
        for start in range(0, params.messages, 500):
            client.rpush(listed, *[json.dumps({"type": "human", "content": fx.texts[(start + i) % len(fx.texts)]})
                                   for i in range(min(500, params.messages - start))])
        budgeted = len(thread.context(max_tokens=BUDGET))
        samples = measure([
            Variant("context", "context(): every message", lambda: thread.context()),
            Variant("budget", f"context(max_tokens={BUDGET})", lambda: thread.context(max_tokens=BUDGET)),
            Variant("lrange", f"LRANGE of the newest {budgeted} JSON items", lambda: client.lrange(listed, -budgeted, -1)),
        ], params.rounds, params.warmup)
        timings = {name: summarize(values) for name, values in samples.items()}

        used, before = client.info("memory")["used_memory"], command_stats(client)
        started = time.perf_counter()
        fork = thread.fork("history-fork", at=params.messages)
        fork_s = time.perf_counter() - started
        calls = stats_diff(before, command_stats(client))
        added = client.info("memory")["used_memory"] - used
        assert fork.stats().stored_messages == params.messages, "the fork holds every message"

        started = time.perf_counter()
        for start in range(0, params.messages, 100):
            items = client.lrange(listed, start, start + 99)
            client.pipeline(transaction=False).rpush(f"{fx.ns}:copy", *items).execute()
        copy_s = time.perf_counter() - started

        median = {name: t["median_us"] for name, t in timings.items()}
        return {
            "server": fx.version,
            "timings": timings,
            "budgeted_messages": budgeted,
            "fork": {"seconds": fork_s, "script_calls": calls.get("fcall", {}).get("calls", 0)
                     + calls.get("evalsha", {}).get("calls", 0),
                     "commands": sum(v["calls"] for v in calls.values()), "bytes_added": added},
            "list_copy_seconds": copy_s,
            "ratios": [
                ratio("budget_vs_context", f"context(max_tokens={BUDGET}) / context()",
                      median["budget"] / median["context"], None),
                ratio("budget_vs_lrange", f"context(max_tokens={BUDGET}) / LRANGE of as many",
                      median["budget"] / median["lrange"], None),
                ratio("fork_vs_list_copy", "fork / raw copy of a JSON list", fork_s / copy_s, None),
            ],
        }


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['name']} ({result['server']})"]
    for name, t in result["timings"].items():
        lines.append(f"  {name:<8} median {t['median_us'] / 1000:8.2f} ms   p99 {t['p99_us'] / 1000:8.2f} ms")
    f = result["fork"]
    lines.append(f"  fork: {f['seconds']:.2f} s, {f['script_calls']} script calls, {f['commands']:,} commands, "
                 f"+{f['bytes_added'] / 1e6:.1f} MB; raw list copy {result['list_copy_seconds']:.2f} s")
    lines += render_ratios(result["ratios"])
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("history", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("history", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
