"""The Agents SDK's session on kvstore against the SDK's own ``RedisSession``, on one server.

    python -m benchmarks.integration_openai_agents [--quick] [--url URL]

A conversation at turn 1,000 (2,000 items of 0.2–1 KB, user and assistant in turns) is written
through each session's ``add_items``; then, alternating the two, each read is timed: the newest
50 (``get_items(50)``), the same right after an ``add_items`` of one item (the Runner's pattern:
the add is not timed; it reads the tail first), the whole history (``get_items()``), and what
kvstore hands the model after a compaction (``context_items()``: the summary and the newest 100)
against the peer's whole read. Ratios are kvstore / peer (the last one peer / kvstore, a
speed-up).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from kvstore import AsyncMessageStore, StoreConfig
from kvstore.integrations.openai_agents import KvstoreSession

from ._common import (
    collect_per_server,
    log,
    ratio,
    render_ratios,
    server_version,
    standalone_main,
    summarize,
)


@dataclass(frozen=True)
class Params:
    turns: int
    rounds: int
    keep_last: int = 100


DEFAULT = Params(turns=1000, rounds=60)
QUICK = Params(turns=100, rounds=10)


def conversation(turns: int, seed: int = 3) -> list[list[dict[str, Any]]]:
    """One batch per turn: a user item and the assistant's reply, 0.2–1 KB of text each."""
    rng = random.Random(seed)
    words = [
        "agent",
        "tool",
        "call",
        "result",
        "thread",
        "message",
        "context",
        "summary",
        "user",
        "reply",
        "the",
        "a",
    ]

    def text(n: int) -> str:
        size = rng.randint(200, 1000)
        body = " ".join(rng.choice(words) for _ in range(size // 4))
        return f"{n}: {body}"[:size]

    return [
        [
            {"role": "user", "content": text(2 * t)},
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{t}",
                "status": "completed",
                "content": [{"type": "output_text", "text": text(2 * t + 1), "annotations": []}],
            },
        ]
        for t in range(turns)
    ]


async def _timed(read: Any, rounds: int) -> list[int]:
    samples = []
    for _ in range(rounds):
        began = time.perf_counter_ns()
        await read()
        samples.append(time.perf_counter_ns() - began)
    return samples


async def _after_adds(session: Any, rounds: int) -> list[int]:
    """get_items(50) timed right after each add_items of one item (not timed)."""
    samples = []
    for n in range(rounds):
        await session.add_items([{"role": "user", "content": f"one more turn {n}"}])
        began = time.perf_counter_ns()
        await session.get_items(50)
        samples.append(time.perf_counter_ns() - began)
    return samples


async def _run(url: str, params: Params) -> dict[str, Any]:
    from agents.extensions.memory import RedisSession

    namespace = f"b{uuid.uuid4().hex[:10]}"
    store = AsyncMessageStore.from_url(url, StoreConfig(namespace=namespace))
    client = redis.asyncio.Redis.from_url(url)
    ours = KvstoreSession("bench", store)
    peer = RedisSession("bench", redis_client=client, key_prefix=namespace)
    try:
        for batch in conversation(params.turns):
            await ours.add_items(batch)
            await peer.add_items(batch)
        assert await ours.get_items() == await peer.get_items()
        reads = {
            "newest_50": (lambda: ours.get_items(50), lambda: peer.get_items(50)),
            "whole": (ours.get_items, peer.get_items),
        }
        samples: dict[str, list[int]] = {}
        for name, (mine, theirs) in reads.items():
            for _ in range(2):  # warm both
                await mine()
                await theirs()
            a, b = await _timed(mine, params.rounds), await _timed(theirs, params.rounds)
            samples[f"{name}_kvstore"], samples[f"{name}_peer"] = a, b
        a, b = await _after_adds(ours, params.rounds), await _after_adds(peer, params.rounds)
        samples["after_add_kvstore"], samples["after_add_peer"] = a, b
        await ours.compact("The conversation so far, in brief.", keep_last=params.keep_last)
        await ours.context_items()
        samples["context_kvstore"] = await _timed(ours.context_items, params.rounds)
        return {name: summarize(xs) for name, xs in samples.items()}
    finally:
        await ours.clear_session()
        await peer.clear_session()
        await client.aclose()
        await store.close()


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    log(f"a conversation of {params.turns} turns through both sessions, then the reads")
    medians = asyncio.run(_run(url, params))
    m = {name: s["median_us"] for name, s in medians.items()}
    ratios = [
        ratio(
            "newest_50",
            "get_items(50), kvstore / RedisSession",
            m["newest_50_kvstore"] / m["newest_50_peer"],
            1.0,
        ),
        ratio(
            "after_add",
            "get_items(50) after an add, kvstore / RedisSession",
            m["after_add_kvstore"] / m["after_add_peer"],
            1.0,
        ),
        ratio(
            "whole",
            "get_items(), kvstore / RedisSession",
            m["whole_kvstore"] / m["whole_peer"],
            1.2,
        ),
        ratio(
            "context",
            "peer's whole read / kvstore's context after compaction",
            m["whole_peer"] / m["context_kvstore"],
            10.0,
            higher=True,
        ),
    ]
    client = redis.Redis.from_url(url)
    version = server_version(client)
    client.close()
    return {"server": version, "medians": medians, "ratios": ratios}


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['name']} ({result['server']})"]
    for name, s in result["medians"].items():
        lines.append(f"{name:<20} median {s['median_us']:>9.0f} us  p99 {s['p99_us']:>9.0f} us")
    lines.append("")
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("integration_openai_agents", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("integration_openai_agents", __doc__, collect, argv)


if __name__ == "__main__":
    raise SystemExit(main())
