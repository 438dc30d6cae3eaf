"""The live tail: what a thread's events cost the server, how soon a watcher gets them, and the
stream's memory under its cap.

    python -m benchmarks.live_tail [--quick] [--url URL] [--json PATH]

On each server:

- **Server time per append, events on against off**: two threads, one under
  ``StoreConfig(events=True)`` and one under ``events=False``, each filled past its window (every
  append rolls over), then alternating batches of 1 KB appends; ``CONFIG RESETSTAT`` before each
  batch and the script call's ``usec`` / ``calls`` from ``INFO commandstats`` after it. The ratio
  is of the medians (target ≤ 1.15).
- **Append → watcher latency**: a watcher blocked in ``thread.watch()`` in another thread, a
  writer appending 1 KB messages one at a time; from before the append call to the event, with
  its ``Message`` decoded, in the watcher (and with ``watch(messages=False)``: the
  sequences only, no read per event). The floor: a bare ``XADD`` of 1 KB and an ``XREAD
  BLOCK`` on another connection, same server. Ratio of the p50s and of the p99s (target ≤ 1.5).
- **Memory of the stream**: ``MEMORY USAGE`` of one thread's stream as appends go past its cap
  (``events_max_len``, default 1000), one 200-character message each (information).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from kvstore import MessageStore, StoreConfig, UserMessage

from ._common import Fixture, collect_per_server, log, ratio, render_ratios, standalone_main


@dataclass(frozen=True)
class Params:
    fill: int  # appends before the cost is measured (past the window)
    rounds: int  # batches per store
    batch: int  # appends per batch
    samples: int  # latency samples
    memory_appends: tuple[int, ...]  # where the stream's memory is read


DEFAULT = Params(
    fill=300, rounds=30, batch=100, samples=400, memory_appends=(500, 1000, 2000, 4000)
)
QUICK = Params(fill=100, rounds=8, batch=50, samples=100, memory_appends=(500, 1000, 2000))


def _percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


class LiveTail(Fixture):
    def make_store(self, events: bool, tag: str) -> MessageStore:
        return MessageStore(self.client, StoreConfig(namespace=f"{self.ns}-{tag}", events=events))

    def cleanup(self) -> None:
        for key in self.client.scan_iter(match=f"{self.ns}*", count=1000):
            self.client.unlink(key)

    def script_usec(self) -> float:
        stats = self.client.info("commandstats")
        calls = stats.get("cmdstat_fcall") or stats.get("cmdstat_evalsha")
        return calls["usec"] / calls["calls"]

    def cost(self) -> dict[str, Any]:
        p = self.params
        threads = {on: self.make_store(on, f"cost-{on}").thread("t") for on in (False, True)}
        for thread in threads.values():
            for _ in range(p.fill):
                thread.append(UserMessage(content="x" * 1000))
        samples: dict[bool, list[float]] = {False: [], True: []}
        for r in range(p.rounds):
            for on in (False, True) if r % 2 else (True, False):
                messages = [UserMessage(content="x" * 1000) for _ in range(p.batch)]
                self.client.config_resetstat()
                for message in messages:
                    threads[on].append(message)
                samples[on].append(self.script_usec())
        return {
            "off_us": samples[False],
            "on_us": samples[True],
            "off_median": statistics.median(samples[False]),
            "on_median": statistics.median(samples[True]),
        }

    def floor(self) -> list[float]:
        writer, reader = redis.Redis.from_url(self.url), redis.Redis.from_url(self.url)
        key, got, latencies = f"{self.ns}-floor", queue.Queue(), []

        def read() -> None:
            last = "0-0"
            while len(latencies) < self.params.samples:
                reply = reader.xread({key: last}, block=1000, count=1)
                if reply:
                    last = reply[0][1][0][0]
                    got.put(time.perf_counter())

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        time.sleep(0.2)
        blob = b"x" * 1000
        for _ in range(self.params.samples):
            began = time.perf_counter()
            writer.xadd(key, {"d": blob})
            latencies.append(got.get(timeout=10) - began)
            time.sleep(0.002)
        thread.join(5)
        writer.close()
        reader.close()
        return latencies

    def tail(self, messages: bool = True) -> list[float]:
        store = self.make_store(True, f"tail-{messages}")
        thread = store.thread("t")
        thread.append(UserMessage(content="first"))
        got, latencies = queue.Queue(), []
        watch = thread.watch(block_ms=1000, messages=messages)

        def read() -> None:
            with watch:
                for taken, _ in enumerate(watch, 1):
                    got.put(time.perf_counter())
                    if taken == self.params.samples:
                        return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.3)
        for _ in range(self.params.samples):
            message = UserMessage(content="x" * 1000)
            began = time.perf_counter()
            thread.append(message)
            latencies.append(got.get(timeout=10) - began)
            time.sleep(0.002)
        reader.join(5)
        return latencies

    def memory(self) -> list[dict[str, int]]:
        thread = self.make_store(True, "memory").thread("t")
        rows, done = [], 0
        for at in self.params.memory_appends:
            while done < at:
                thread.append(UserMessage(content="x" * 200))
                done += 1
            key = thread.keys.events
            rows.append(
                {
                    "appends": at,
                    "events": int(self.client.xlen(key)),
                    "bytes": int(self.client.memory_usage(key, samples=0) or 0),
                }
            )
        return rows


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with LiveTail(url, params, own) as fixture:
        log("server time per append, events on and off")
        cost = fixture.cost()
        log("append -> watcher latency, and its floor")
        floor, tail, ids_only = fixture.floor(), fixture.tail(), fixture.tail(messages=False)
        log("the stream's memory under its cap")
        memory = fixture.memory()
        latency = {
            name: {"p50_us": _percentile(xs, 0.5) * 1e6, "p99_us": _percentile(xs, 0.99) * 1e6}
            for name, xs in (("floor", floor), ("tail", tail), ("ids_only", ids_only))
        }
        ratios = [
            ratio(
                "events_cost",
                "append server time, events on / off",
                cost["on_median"] / cost["off_median"],
                1.15,
            ),
            ratio(
                "tail_p50",
                "append->watcher / XADD->XREAD, p50 (aim 1.2)",
                latency["tail"]["p50_us"] / latency["floor"]["p50_us"],
                1.5,
            ),
            ratio(
                "tail_p99",
                "append->watcher / XADD->XREAD, p99",
                latency["tail"]["p99_us"] / latency["floor"]["p99_us"],
                1.5,
            ),
            ratio(
                "ids_p50",
                "append->watcher (ids only) / XADD->XREAD, p50",
                latency["ids_only"]["p50_us"] / latency["floor"]["p50_us"],
                None,
            ),
        ]
        return {
            "server": fixture.version,
            "cost": cost,
            "latency": latency,
            "memory": memory,
            "ratios": ratios,
        }


def render(result: dict[str, Any]) -> str:
    cost, latency = result["cost"], result["latency"]
    lines = [
        f"{result['name']} ({result['server']})",
        f"server time per append: events off {cost['off_median']:.1f} us, on {cost['on_median']:.1f} us"
        f" (medians of {len(cost['on_us'])} batches)",
        f"latency: XADD->XREAD p50 {latency['floor']['p50_us']:.0f} us p99 {latency['floor']['p99_us']:.0f} us;"
        f" append->watcher p50 {latency['tail']['p50_us']:.0f} us p99 {latency['tail']['p99_us']:.0f} us"
        f" (ids only: p50 {latency['ids_only']['p50_us']:.0f} us p99 {latency['ids_only']['p99_us']:.0f} us)",
        "stream memory: "
        + ", ".join(
            f"{m['appends']} appends {m['events']} events {m['bytes'] / 1024:.1f} KB"
            for m in result["memory"]
        ),
        "",
    ]
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("live_tail", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("live_tail", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
