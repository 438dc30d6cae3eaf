"""What every benchmark shares: the message texts, interleaved timing, command counts, the
servers to measure, ratios with their targets and the JSON output (the machine's description is
in _machine.py)."""

from __future__ import annotations

import gc
import json
import math
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import redis

from kvstore import MessageStore, StoreConfig, UserMessage

from . import _plots, _servers
from ._engine import request_command, sent_command
from ._machine import headline, machine

RESULTS_DIR = Path(__file__).resolve().parent / "results"

TEXT_BYTES = 1000  # the text of each message; its record is ~1.1 KB with id and date
TEXTS = 64  # distinct texts, used in turn


def new_messages(texts: list[str], count: int, start: int = 0) -> list:
    """`count` new user messages without ids over `texts`, from text `start` on.

    `append` gives each message it is sent that has no id the id it makes, on the caller's own
    object: that id is the call's token, so the same object sent again to a thread is a replay.
    Whatever a benchmark appends is therefore a new object."""
    return [UserMessage(content=texts[(start + i) % len(texts)]) for i in range(count)]


def fill_thread(thread: Any, config: Any, texts: list[str], count: int) -> list[Any]:
    """Appends `count` new messages to `thread` in batches of ``max_chunks_per_call ×
    chunk_size``, so every thread is filled alike; returns the messages as stored."""
    batch, stored = config.max_chunks_per_call * config.chunk_size, []
    for start in range(0, count, batch):
        stored += thread.append(new_messages(texts, min(batch, count - start), start))
    return stored


class MessagePool:
    """New messages made ahead of the timed calls (see new_messages); `take` hands out each once."""

    def __init__(self, texts: list[str], count: int) -> None:
        self._texts = texts
        self._made = new_messages(texts, count)
        self._next = 0

    def take(self, count: int | None = None) -> Any:
        """One message, or a list of `count`."""
        wanted = 1 if count is None else count
        if self._next + wanted > len(self._made):  # past what was made ahead: make more now
            self._made += new_messages(self._texts, max(wanted, 256), len(self._made))
        taken = self._made[self._next : self._next + wanted]
        self._made[self._next : self._next + wanted] = [None] * wanted
        self._next += wanted
        return taken[0] if count is None else taken


# The bare baseline: the writes an append cannot do without (record, counter, index, id map).
BARE_SCRIPT = """\
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('HSET', KEYS[1], n, ARGV[2])
redis.call('ZADD', KEYS[3], n, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], n)
return n
"""
BARE_KEYS = ("records", "meta", "index", "ids")  # KEYS[1..4] of BARE_SCRIPT


def bare_keys(prefix: str) -> list[str]:
    """The bare script's four keys, under `prefix` (which holds their hash tag)."""
    return [f"{prefix}:{part}" for part in BARE_KEYS]


# The commands that run a script. A script command's usec covers the commands its script runs
# (they are counted under their own names too), so a scripted call is charged this time.
SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "eval", "evalsha_ro", "eval_ro")


def send_script(client: Any, store: Any, request: Any) -> Any:
    """Sends a core Eval request on `client` as `store`'s executor sends it: FCALL / FCALL_RO of
    its function, or EVALSHA on the EVAL path. The function or script must be loaded already
    (any call of the store's loads it)."""
    return client.execute_command(*sent_command(store, request))


def script_command(store: Any, request: Any) -> list[Any]:
    """The command `send_script` sends, as an argument list (for redis-benchmark)."""
    return list(request_command(store, request))


class Fixture:
    """What a benchmark keeps on one server: a client, the server's version, a fresh namespace
    ``bench-<hex>``, a store of `store_class` there, and the message texts.

    Used as a context manager: on leaving it, `cleanup` deletes what the run wrote on a server
    that is not the benchmark's own (`own`: the benchmark's own servers are stopped after it; one
    given with --url is not), and the client is closed."""

    def __init__(
        self, url: str, params: Any, own: bool, store_class: type[MessageStore] = MessageStore
    ) -> None:
        self.url = url
        self.params = params
        self.own = own
        self.client = redis.Redis.from_url(url, decode_responses=False)
        self.ns = f"bench-{uuid.uuid4().hex[:8]}"
        self.config = StoreConfig(namespace=self.ns)
        # The store before any command: the connections its client's pool opens from then on
        # are the store's kind (kvstore/_engine/failures.py, track_sends), as from_url's are.
        self.store = store_class(self.client, self.config)
        self.version = server_version(self.client)
        self.texts = make_texts()

    def cleanup(self) -> None:
        """Deletes the keys the run wrote."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if not self.own:
                self.cleanup()
        finally:
            self.client.close()


def log(text: str) -> None:
    """Progress goes to stderr; the tables go to stdout."""
    print(text, file=sys.stderr, flush=True)


def make_texts(seed: int = 7, count: int = TEXTS, size: int = TEXT_BYTES) -> list[str]:
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
        "of",
        "to",
        "and",
        "store",
        "window",
        "chunk",
        "page",
        "turn",
    ]
    texts = []
    for _ in range(count):
        text = ""
        while len(text) < size:
            text += rng.choice(words) + " "
        texts.append(text[:size])
    return texts


# ------------------------------------------------------------------------------ measuring


@dataclass
class Variant:
    name: str
    label: str
    run: Callable[[], Any]
    every: int = 1  # runs in one round out of `every`


def summarize(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    us = [s / 1000 for s in ordered]
    return {
        "n": len(us),
        "median_us": statistics.median(us),
        "p99_us": us[max(0, math.ceil(0.99 * len(us)) - 1)],
        "mean_us": statistics.fmean(us),
        "min_us": us[0],
        "max_us": us[-1],
    }


def measure(
    variants: list[Variant], rounds: int, warmup: int, seed: int = 1
) -> dict[str, list[int]]:
    """Runs every variant once a round (or once every `every` rounds), in a fresh shuffled order
    each round; the first `warmup` rounds are not recorded.

    The garbage made so far is collected and frozen first: filling the threads is not the measured
    calls' cost; the collector otherwise runs as usual."""
    gc.collect()
    gc.freeze()
    try:
        return _measure(variants, rounds, warmup, seed)
    finally:
        gc.unfreeze()


def _measure(variants: list[Variant], rounds: int, warmup: int, seed: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    samples: dict[str, list[int]] = {v.name: [] for v in variants}
    order = list(variants)
    clock = time.perf_counter_ns
    for round_ in range(warmup + rounds):
        rng.shuffle(order)
        for variant in order:
            if round_ % variant.every:
                continue
            start = clock()
            variant.run()
            elapsed = clock() - start
            if round_ >= warmup:
                samples[variant.name].append(elapsed)
    return samples


def command_stats(client: redis.Redis) -> dict[str, dict[str, int]]:
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): {"calls": int(v["calls"]), "usec": int(v["usec"])}
        for name, v in stats.items()
    }


def stats_diff(before: dict, after: dict) -> dict[str, dict[str, int]]:
    diff = {}
    for name, now in after.items():
        if name == "info" or name.startswith("info|"):
            continue
        was = before.get(name, {"calls": 0, "usec": 0})
        calls = now["calls"] - was["calls"]
        if calls:
            diff[name] = {"calls": calls, "usec": now["usec"] - was["usec"]}
    return diff


def counting_client(url: str) -> tuple[redis.Redis, list[int]]:
    """A client that counts the times it writes to its socket: one per round trip."""
    client = redis.Redis.from_url(url, decode_responses=False)
    pool = client.connection_pool
    sent = [0]

    class Counting(pool.connection_class):  # type: ignore[name-defined,misc]
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            sent[0] += 1
            super().send_packed_command(command, check_health)

    pool.connection_class = Counting
    return client, sent


def server_version(client: redis.Redis) -> str:
    info = client.info("server")
    if "valkey_version" in info:
        return f"Valkey {info['valkey_version']}"
    return f"Redis {info['redis_version']}"


# -------------------------------------------------------------------------------- servers


def each_server(url: str | None) -> Iterator[tuple[str, str, bool]]:
    """(name, url, own) of every server to measure: the one at `url`, or a fresh Valkey and,
    where installed, a fresh Redis, each stopped before the next starts."""
    if url:
        yield "url", url, False
        return
    for name, binary in _servers.available():
        with _servers.running(name, binary) as server:
            yield name, server.url, True


# --------------------------------------------------------------------------------- ratios


def collect_per_server(
    title: str,
    args: Any,
    params: Any,
    run_server: Callable[..., dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    params_document: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Runs one benchmark on each server (its own embedded ones, or --url), printing as it goes.

    `run_server(url, params, own)` measures one server; its document's "params" are
    `params_document`, or the fields of `params`."""
    info = machine()
    print(headline(title, info, args.quick))
    results = []
    for name, url, own in each_server(args.url):
        results.append({"name": name, **run_server(url, params, own)})
        print()
        print(render(results[-1]), flush=True)
    return {
        "params": params.__dict__ if params_document is None else params_document,
        "machine": info,
        "servers": results,
    }


def ratio(
    name: str, label: str, value: float, target: float | None, higher: bool = False, **extra: Any
) -> dict[str, Any]:
    """A ratio and its verdict; `higher` means the target is a minimum (≥), not a maximum."""
    verdict = None
    if target is not None:
        verdict = value >= target if higher else value <= target
    return {
        "name": name,
        "label": label,
        "value": value,
        "target": target,
        "higher": higher,
        "pass": verdict,
        **extra,
    }


def target_text(r: dict[str, Any]) -> str:
    if r.get("target") is None:
        return "info"
    return f"{'≥' if r.get('higher') else '≤'} {r['target']:g}"


def value_text(value: float) -> str:
    return f"{value:.0f}×" if value >= 10 else f"{value:.2f}"


def verdict_text(r: dict[str, Any]) -> str:
    return "" if r.get("pass") is None else ("PASS" if r["pass"] else "MISS")


def render_ratios(ratios: list[dict[str, Any]], title: str = "ratios") -> list[str]:
    width = max([len(title)] + [len(r["label"]) for r in ratios]) + 2
    lines = [f"{title:<{width}} {'value':>7} {'target':>8}"]
    for r in ratios:
        lines.append(
            f"{r['label']:<{width}} {value_text(r['value']):>7} {target_text(r):>8}  {verdict_text(r)}"
        )
    return lines


def write_document(
    benchmark: str, document: dict[str, Any], path: Path | None, quick: bool
) -> Path:
    stamp = f"{datetime.now():%Y%m%d-%H%M%S}{'-quick' if quick else ''}"
    path = path or RESULTS_DIR / f"{benchmark}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    full = {
        "benchmark": benchmark,
        "created": datetime.now(UTC).isoformat(),
        "quick": quick,
        **document,
    }
    path.write_text(json.dumps(full, indent=2, default=str) + "\n")
    return path


def standalone_main(
    benchmark: str,
    doc: str | None,
    collect: Callable[[Any], dict[str, Any]],
    argv: list[str] | None,
    add_arguments: Callable[[Any], None] | None = None,
) -> int:
    """`python -m benchmarks.<name>`: one benchmark, its JSON and its plots."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{benchmark}", description=(doc or "").split("\n\n")[0]
    )
    add_common_arguments(parser)
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args(argv)
    _servers.stop_on_sigterm()
    try:
        document = collect(args)
    except KeyboardInterrupt:
        print("\ninterrupted; the benchmark's servers are stopped", file=sys.stderr)
        return 130
    path = write_document(benchmark, document, args.json, args.quick)
    print(f"\nall figures: {path}")
    for plot in _plots.draw({benchmark: document}, path.parent, args.quick):
        print(f"plot: {plot}")
    return 0


def add_common_arguments(parser: Any) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes and fewer calls (for CI)"
    )
    parser.add_argument("--url", help="measure this server instead of starting Valkey (and Redis)")
    parser.add_argument(
        "--json", type=Path, help="where to write the figures (default: benchmarks/results/)"
    )
