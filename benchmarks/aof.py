"""AOF bytes per append, against the bare 4-write script.

    python -m benchmarks.aof [--quick] [--url URL] [--json PATH]

What an append costs a server that persists with ``appendonly yes``: on each of the benchmark's
own servers (started without persistence), ``CONFIG SET appendonly yes`` (the server writes its
base file, then appends every write), then the growth of ``aof_current_size`` (INFO persistence)
over many calls of each operation, divided by the calls. A script's writes go to the AOF as the
commands it ran (effects replication, wrapped in MULTI/EXEC), so this counts what each write
command of an append carries: the record, its manifest line, the id map, meta, the event.

- kvstore append of one 1 KB message (events on, the defaults), on a thread filled past a few
  chunks, so the closing of chunks is in the average;
- the same with events off, and a batch of 10 per message (information);
- the bare 4-write script (HINCRBY, HSET of the record, ZADD, HSET of the id) with the same bytes.

With --url the server is left alone (its persistence is not this benchmark's to change): nothing
is measured.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from kvstore import MessageStore, StoreConfig, UserMessage

from ._common import (
    BARE_SCRIPT,
    Fixture,
    MessagePool,
    bare_keys,
    collect_per_server,
    fill_thread,
    log,
    ratio,
    render_ratios,
    standalone_main,
)
from ._engine import encode_record


@dataclass(frozen=True)
class Params:
    fill: int  # messages in each thread before measuring
    calls: int  # appends (and bare calls) measured


DEFAULT = Params(fill=500, calls=2000)
QUICK = Params(fill=200, calls=400)


def aof_size(client: redis.Redis) -> int:
    return int(client.info("persistence")["aof_current_size"])


def enable_aof(client: redis.Redis, timeout: float = 30.0) -> None:
    """appendonly yes, and the base file written, before anything is measured."""
    client.config_set("appendonly", "yes")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = client.info("persistence")
        if (
            int(info.get("aof_enabled", 0))
            and not int(info.get("aof_rewrite_in_progress", 0))
            and not int(info.get("aof_rewrite_scheduled", 0))
        ):
            return
        time.sleep(0.05)
    raise RuntimeError("the server did not finish writing its AOF base file")


class Aof(Fixture):
    params: Params

    def __init__(self, url: str, params: Params, own: bool) -> None:
        super().__init__(url, params, own)
        self.quiet_config = StoreConfig(namespace=self.ns, events=False)
        self.threads = {
            "append": self.store.thread("aof"),
            "append_events_off": MessageStore(self.client, self.quiet_config).thread("aof-quiet"),
            "append_batch_10": self.store.thread("aof-batch"),
        }
        self.keys = bare_keys(f"{self.ns}:{{bare}}")

    def grown(self, calls: int, fn: Callable[[int], Any]) -> dict[str, Any]:
        before = aof_size(self.client)
        for i in range(calls):
            fn(i)
        grown = aof_size(self.client) - before
        return {"calls": calls, "bytes": grown, "bytes_per_call": grown / calls}

    def measure(self) -> dict[str, Any]:
        p, client = self.params, self.client
        for name, thread in self.threads.items():
            config = self.quiet_config if name == "append_events_off" else self.config
            fill_thread(thread, config, self.texts, p.fill)
        stamped = UserMessage(content=self.texts[0]).model_copy(
            update={"id": f"message-{uuid.uuid4()}", "date": datetime.now(UTC)}
        )
        blob = encode_record(stamped)
        sha = client.script_load(BARE_SCRIPT)
        ids = [f"message-{uuid.uuid4()}" for _ in range(p.calls)]
        pool = MessagePool(self.texts, 3 * p.calls)
        enable_aof(client)
        log(f"  measuring {p.calls:,} calls of each")
        t = self.threads
        results = {
            "append": self.grown(p.calls, lambda i: t["append"].append(pool.take())),
            "append_events_off": self.grown(
                p.calls, lambda i: t["append_events_off"].append(pool.take())
            ),
            "append_batch_10": self.grown(
                p.calls // 10, lambda i: t["append_batch_10"].append(pool.take(10))
            ),
            "bare_script": self.grown(
                p.calls, lambda i: client.evalsha(sha, 4, *self.keys, ids[i], blob)
            ),
        }
        results["append_batch_10"]["bytes_per_message"] = (
            results["append_batch_10"]["bytes_per_call"] / 10
        )
        results["record_bytes"] = len(blob)
        return results

    def cleanup(self) -> None:
        for thread in self.threads.values():
            thread.delete()
        self.client.delete(*self.keys)


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Aof(url, params, own) as bench:
        version = bench.version
        if not own:
            log(f"{version} at {url}: not the benchmark's own server; AOF not measured")
            return {"server": version, "results": None, "ratios": []}
        log(f"{version} at {url}: appendonly yes, threads of {params.fill:,}")
        results = bench.measure()
    bare = results["bare_script"]["bytes_per_call"]
    return {
        "server": version,
        "results": results,
        "ratios": [
            ratio(
                "aof_append_vs_bare",
                "AOF bytes per append / bare script",
                results["append"]["bytes_per_call"] / bare,
                1.15,
            ),
            ratio(
                "aof_append_events_off_vs_bare",
                "AOF bytes per append, events off / bare script",
                results["append_events_off"]["bytes_per_call"] / bare,
                None,
            ),
            ratio(
                "aof_batch_message_vs_bare",
                "AOF bytes per message of a batch of 10 / bare script",
                results["append_batch_10"]["bytes_per_message"] / bare,
                None,
            ),
        ],
    }


def render(result: dict[str, Any]) -> str:
    r = result["results"]
    if r is None:
        return f"== {result['server']} ==\nnot measured (not the benchmark's own server)"
    lines = [
        f"== {result['server']} ==",
        f"AOF bytes per call (record {r['record_bytes']:,} B)",
    ]
    for name, label in (
        ("append", "kvstore append, events on"),
        ("append_events_off", "kvstore append, events off"),
        ("append_batch_10", "kvstore append, batch of 10 (per message)"),
        ("bare_script", "bare 4-write script"),
    ):
        entry = r[name]
        value = entry.get("bytes_per_message", entry["bytes_per_call"])
        lines.append(f"  {label:<44} {value:>9,.0f}   ({entry['calls']:,} calls)")
    lines.append("")
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("AOF bytes", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("aof", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
