"""A history a model can be given: a budgeted context against the whole one, and a fork.

    python -m benchmarks.history [--quick] [--url URL] [--json PATH]

On a thread of 10,000 messages of ~1 KB (2,000 with --quick), interleaved round by round:
``context()`` (every message), ``context(max_tokens=8000)`` (the newest that fit, read newest page
first), and, as the raw floor, ``LRANGE`` of the same number of newest items from a JSON list.
Then ``fork`` of the whole thread, once: its time, the script calls and commands the server ran
(``INFO commandstats``) and the memory it added (``used_memory``), beside a raw copy of the same
records from a JSON list into a new one (``LRANGE`` + ``RPUSH`` in pipelines of 100).

Last, strict history checks: agent turns (a user message, a tool call, its return, the answer;
one append each) into a thread of a store with ``history_checks="strict"`` and one without, in
alternating blocks; the server time per append (the script's ``usec`` in ``INFO commandstats``,
median of the blocks) with checks against without, and what the checks keep (``MEMORY USAGE`` of
the thread's ``pairs`` key) per message.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from kvstore import (
    AssistantMessage,
    Message,
    MessageStore,
    ToolCallMessage,
    ToolReturnMessage,
    UserMessage,
)

from ._common import (
    SCRIPT_COMMANDS,
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
    check_turns: int  # agent turns (4 appends each) per block of the history-checks comparison


DEFAULT = Params(messages=10_000, rounds=9, warmup=2, check_turns=250)
QUICK = Params(messages=2_000, rounds=5, warmup=1, check_turns=100)


def agent_turn(texts: list[str], i: int) -> list[Message]:
    """One turn of an agent, as four messages: the question, a tool call, its return, the answer."""
    call_id = f"call-{i}"
    return [
        UserMessage(content=texts[i % len(texts)][:300]),
        ToolCallMessage(
            tool_call={
                "name": "search",
                "arguments": json.dumps({"q": f"query {i}"}),
                "tool_call_id": call_id,
            }
        ),
        ToolReturnMessage(
            status="success", tool_call_id=call_id, tool_return=texts[(i + 1) % len(texts)][:600]
        ),
        AssistantMessage(content=texts[(i + 2) % len(texts)]),
    ]


def checked_appends(fx: Fixture, params: Params) -> dict[str, Any]:
    """Server time per append with strict history checks and without, in alternating blocks."""
    client = fx.client
    threads = {
        mode: MessageStore(client, dataclasses.replace(fx.config, history_checks=mode)).thread(
            f"checks-{mode}"
        )
        for mode in ("off", "strict")
    }
    samples: dict[str, list[float]] = {mode: [] for mode in threads}
    turn = 0
    for block in range(params.warmup + params.rounds):
        order = ("off", "strict") if block % 2 == 0 else ("strict", "off")
        for mode in order:
            turns = [agent_turn(fx.texts, turn + i) for i in range(params.check_turns)]
            before = command_stats(client)
            for messages in turns:
                for message in messages:
                    threads[mode].append(message)
            diff = stats_diff(before, command_stats(client))
            scripts = [diff[name] for name in SCRIPT_COMMANDS if name in diff]
            if block >= params.warmup:
                samples[mode].append(
                    sum(v["usec"] for v in scripts) / sum(v["calls"] for v in scripts)
                )
        turn += params.check_turns
    strict = threads["strict"]
    assert strict.stats().history_checked, "the strict thread is checked"
    kept = client.memory_usage(strict.keys.pairs) or 0
    stored = strict.stats().stored_messages
    return {
        "append_usec": {mode: statistics.median(values) for mode, values in samples.items()},
        "appends_per_block": 4 * params.check_turns,
        "pairs_bytes_per_message": kept / stored,
    }


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Fixture(url, params, own) as fx:
        client, thread = fx.client, fx.store.thread("history")
        log(f"{fx.version}: filling a thread of {params.messages:,} messages")
        fill_thread(thread, fx.config, fx.texts, params.messages)
        listed = f"{fx.ns}:list"
        for start in range(0, params.messages, 500):
            client.rpush(
                listed,
                *[
                    json.dumps({"type": "human", "content": fx.texts[(start + i) % len(fx.texts)]})
                    for i in range(min(500, params.messages - start))
                ],
            )
        budgeted = len(thread.context(max_tokens=BUDGET))
        samples = measure(
            [
                Variant("context", "context(): every message", lambda: thread.context()),
                Variant(
                    "budget",
                    f"context(max_tokens={BUDGET})",
                    lambda: thread.context(max_tokens=BUDGET),
                ),
                Variant(
                    "lrange",
                    f"LRANGE of the newest {budgeted} JSON items",
                    lambda: client.lrange(listed, -budgeted, -1),
                ),
            ],
            params.rounds,
            params.warmup,
        )
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

        log(f"{fx.version}: agent turns with strict history checks and without")
        checks = checked_appends(fx, params)
        median = {name: t["median_us"] for name, t in timings.items()}
        return {
            "server": fx.version,
            "timings": timings,
            "budgeted_messages": budgeted,
            "fork": {
                "seconds": fork_s,
                "script_calls": calls.get("fcall", {}).get("calls", 0)
                + calls.get("evalsha", {}).get("calls", 0),
                "commands": sum(v["calls"] for v in calls.values()),
                "bytes_added": added,
            },
            "list_copy_seconds": copy_s,
            "checks": checks,
            "ratios": [
                ratio(
                    "strict_vs_off",
                    "server time per append: strict history checks / none",
                    checks["append_usec"]["strict"] / checks["append_usec"]["off"],
                    1.15,
                ),
                ratio(
                    "budget_vs_context",
                    f"context(max_tokens={BUDGET}) / context()",
                    median["budget"] / median["context"],
                    None,
                ),
                ratio(
                    "budget_vs_lrange",
                    f"context(max_tokens={BUDGET}) / LRANGE of as many",
                    median["budget"] / median["lrange"],
                    None,
                ),
                ratio("fork_vs_list_copy", "fork / raw copy of a JSON list", fork_s / copy_s, None),
            ],
        }


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['name']} ({result['server']})"]
    for name, t in result["timings"].items():
        lines.append(
            f"  {name:<8} median {t['median_us'] / 1000:8.2f} ms   p99 {t['p99_us'] / 1000:8.2f} ms"
        )
    f = result["fork"]
    lines.append(
        f"  fork: {f['seconds']:.2f} s, {f['script_calls']} script calls, {f['commands']:,} commands, "
        f"+{f['bytes_added'] / 1e6:.1f} MB; raw list copy {result['list_copy_seconds']:.2f} s"
    )
    c = result["checks"]
    lines.append(
        f"  append server time (median of blocks of {c['appends_per_block']}): strict checks "
        f"{c['append_usec']['strict']:.1f} µs, none {c['append_usec']['off']:.1f} µs; "
        f"pairs key {c['pairs_bytes_per_message']:.1f} B per message"
    )
    lines += render_ratios(result["ratios"])
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("history", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("history", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
