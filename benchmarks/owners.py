"""An owner's listing against a bare ZREVRANGE, and what an owner adds to an append.

    python -m benchmarks.owners [--quick] [--url URL] [--json PATH]

- **Listing** (docs/OWNERS.md): one owner with many threads (10,000; 2,000 with --quick), each
  with a title and a few messages. A page of 50 by recent activity, `store.threads(owner,
  limit=50)`, first and from a cursor in the middle, against a bare `ZREVRANGE key 0 49
  WITHSCORES` of a sorted set of as many members, sent through redis-py: end to end medians,
  interleaved, and each call's server time (SLOWLOG, own servers only). Target: the first page
  end to end ≤ 1.5× the bare command.
- **An owner's share of an append**: appends of one 1 KB message to an owned thread and to a
  thread without an owner, interleaved, each call's server time from SLOWLOG (the owned call
  sends 18 keys, the other 14, which tells them apart); and the directory's memory per thread
  (`MEMORY USAGE` of the owner's four keys over its threads), beside a thread's own keys.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import redis

from kvstore import UserMessage
from kvstore._engine.layout.keys import OwnerKeys

from ._common import (
    Fixture,
    Variant,
    collect_per_server,
    log,
    measure,
    ratio,
    render_ratios,
    standalone_main,
    summarize,
)
from ._cost import slowlog_entries

OWNER = "bench-owner"


@dataclass(frozen=True)
class Params:
    threads: int  # threads of the owner
    rounds: int  # interleaved rounds of the listing's variants
    appends: int  # appends of each kind whose server time is read


DEFAULT = Params(threads=10_000, rounds=400, appends=2_000)
QUICK = Params(threads=2_000, rounds=150, appends=400)


def slowlog_durations(client: redis.Redis, run: Any, calls: int) -> list[list[Any]]:
    """Each command's (name + first arguments, µs) the server logged while `run()` ran."""
    return [[bytes(e["command"]), e["duration"]] for e in slowlog_entries(client, run, calls)]


def median_of(entries: list[list[Any]], prefix: bytes, contains: bytes = b"") -> float | None:
    found = [d for c, d in entries if c.upper().startswith(prefix) and contains in c]
    return statistics.median(found) if found else None


class Owners(Fixture):
    params: Params

    def fill(self) -> None:
        p = self.params
        bare = f"{self.ns}:{{bare}}:recent"
        self.bare_key = bare
        started = time.monotonic()
        for i in range(p.threads):
            thread = self.store.thread(f"chat-{i:05d}", owner=OWNER)
            thread.append(UserMessage(content=self.texts[i % len(self.texts)][:200]))
            if i % 10 == 0:
                thread.set_info(title=f"Conversation {i}", metadata={"model": "small"})
        pipe = self.client.pipeline(transaction=False)
        now = int(time.time() * 1000)
        for i in range(p.threads):
            pipe.zadd(bare, {f"chat-{i:05d}": now + i})
        pipe.execute()
        log(f"  {p.threads:,} threads of one owner in {time.monotonic() - started:.1f} s")

    def listing(self) -> dict[str, Any]:
        p, store, client = self.params, self.store, self.client
        middle = store.threads(OWNER, limit=p.threads // 2).next_cursor
        variants = [
            Variant("first_page", "threads(limit=50)", lambda: store.threads(OWNER, limit=50)),
            Variant(
                "middle_page",
                "threads(after=<middle>, limit=50)",
                lambda: store.threads(OWNER, after=middle, limit=50),
            ),
            Variant(
                "bare",
                "ZREVRANGE 0 49 WITHSCORES",
                lambda: client.zrevrange(self.bare_key, 0, 49, withscores=True),
            ),
        ]
        samples = measure(variants, p.rounds, warmup=20)
        results: dict[str, Any] = {v.name: summarize(samples[v.name]) for v in variants}
        if self.own:

            def run() -> None:
                for _ in range(200):
                    store.threads(OWNER, limit=50)
                    client.zrevrange(self.bare_key, 0, 49, withscores=True)

            entries = slowlog_durations(client, run, 400)
            results["server_us"] = {
                "first_page": median_of(entries, b"FCALL", b"owner_list")
                or median_of(entries, b"EVALSHA"),
                "bare": median_of(entries, b"ZREVRANGE"),
            }
        return results

    def append_share(self) -> dict[str, Any]:
        p, store, client = self.params, self.store, self.client
        owned = store.thread("owned-append", owner=OWNER)
        plain = store.thread("plain-append")
        text = self.texts[0]
        messages = [UserMessage(content=text) for _ in range(2 * p.appends)]

        def run() -> None:
            for i in range(p.appends):
                owned.append(messages[2 * i])
                plain.append(messages[2 * i + 1])

        results: dict[str, Any] = {}
        if self.own:
            entries = slowlog_durations(client, run, 2 * p.appends)
            results["owned_us"] = median_of(entries, b"FCALL", b" 18 ")
            results["plain_us"] = median_of(entries, b"FCALL", b" 14 ")
        else:
            run()
        keys = OwnerKeys.of(self.ns, OWNER)
        directory = sum(
            client.memory_usage(k) or 0 for k in (keys.recent, keys.created, keys.info, keys.usage)
        )
        threads = p.threads + 1
        thread_keys = [k for k in client.scan_iter(match=keys.prefix + "chat-00001|*")]
        results["directory_bytes_per_thread"] = directory / threads
        results["thread_bytes"] = sum(client.memory_usage(k) or 0 for k in thread_keys)
        return results

    def cleanup(self) -> None:
        self.store.erase_owner(OWNER)
        self.store.thread("plain-append").delete()
        self.client.delete(self.bare_key)


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Owners(url, params, own) as bench:
        log(f"{bench.version} at {url}")
        bench.fill()
        results = {"listing": bench.listing(), "append": bench.append_share()}
        version = bench.version
    listing, append = results["listing"], results["append"]
    ratios = [
        ratio(
            "owner_page_vs_zrevrange",
            "first page of 50 of an owner's threads / bare ZREVRANGE of 50 (end to end)",
            listing["first_page"]["median_us"] / listing["bare"]["median_us"],
            1.5,
        ),
        ratio(
            "owner_middle_page_vs_zrevrange",
            "a page of 50 from a cursor in the middle / bare ZREVRANGE of 50 (end to end)",
            listing["middle_page"]["median_us"] / listing["bare"]["median_us"],
            None,
        ),
    ]
    server = listing.get("server_us") or {}
    if server.get("first_page") and server.get("bare"):
        ratios.append(
            ratio(
                "owner_page_server_vs_zrevrange",
                "first page of 50, server time / bare ZREVRANGE of 50",
                server["first_page"] / server["bare"],
                None,
            )
        )
    if append.get("owned_us") and append.get("plain_us"):
        ratios.append(
            ratio(
                "owned_append_vs_plain",
                "append server time, owned thread / thread without an owner",
                append["owned_us"] / append["plain_us"],
                None,
            )
        )
    return {"server": version, "results": results, "ratios": ratios}


def render(result: dict[str, Any]) -> str:
    listing, append = result["results"]["listing"], result["results"]["append"]
    lines = [f"== {result['server']} ==", "listing, end to end (µs): median / p99"]
    for name in ("first_page", "middle_page", "bare"):
        s = listing[name]
        lines.append(f"  {name:<14} {s['median_us']:>9.1f} / {s['p99_us']:>9.1f}")
    if "server_us" in listing:
        lines.append(f"  server time (µs, SLOWLOG medians): {listing['server_us']}")
    lines.append(
        f"append server time (µs, SLOWLOG medians): owned {append.get('owned_us')},"
        f" without an owner {append.get('plain_us')}"
    )
    lines.append(
        f"directory bytes per thread {append['directory_bytes_per_thread']:.0f};"
        f" one thread's own keys {append['thread_bytes']:,} B"
    )
    lines.append("")
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict[str, Any]:
    params = QUICK if args.quick else DEFAULT
    return collect_per_server("owners", args, params, run_server, render)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("owners", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
