"""``python -m benchmarks [names...] [--quick] [--url URL] [--peers] [--wait-quiet]``

Runs the benchmarks (all of them, or the ones named) one after the other, each printing its own
tables and writing its JSON under ``benchmarks/results/``; then prints every ratio of the run in
one table, writes it as ``summary-<date>-<time>.json`` and draws the plots (PNG) beside it.

``--peers`` adds the optional comparison with llama-index's and LangChain's Redis chat stores,
installing them with pip into ``benchmarks/results/peer-packages`` the first time.
``--wait-quiet`` waits before each benchmark (up to 15 minutes, checking every 30 s) until the
machine's 1-minute load average is below 0.7, so other work does not skew the figures. Each
benchmark's share of the CPUs that other processes used while it ran is printed at the end.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import _plots, _servers
from ._common import (
    RESULTS_DIR,
    add_common_arguments,
    target_text,
    value_text,
    verdict_text,
    write_document,
)
from ._machine import cpu_snapshot, machine

BENCHMARKS = (
    "append",
    "server_cost",
    "floor",
    "aof",
    "memory",
    "throughput",
    "encode",
    "history",
    "live_tail",
    "owners",
    "integration_openai_agents",
    "integration_llamaindex",
    "integration_langchain",
    "peers",
)
DEFAULT_SET = BENCHMARKS[:-1]  # peers only with --peers
QUIET_LOAD = 0.7


def wait_quiet(limit_s: float = 900, every_s: float = 30) -> tuple[float, float]:
    """Waits until the 1-minute load average is below QUIET_LOAD; returns (load, waited s)."""
    started = time.monotonic()
    while True:
        load = os.getloadavg()[0]
        waited = time.monotonic() - started
        if load < QUIET_LOAD or waited >= limit_s:
            return load, waited
        print(
            f"waiting for a quiet machine: 1-minute load {load:.2f} (want < {QUIET_LOAD}), "
            f"{waited:.0f} s so far",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(every_s)


def summary_table(documents: dict[str, dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Every ratio of the run: one row per ratio, one column per server."""
    servers: list[str] = []
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for benchmark, document in documents.items():
        for server in document.get("servers", []):
            short = server["server"]
            if short not in servers:
                servers.append(short)
            for r in server["ratios"]:
                row = rows.setdefault(
                    (benchmark, r["name"]),
                    {
                        "benchmark": benchmark,
                        "name": r["name"],
                        "label": r["label"],
                        "target": r.get("target"),
                        "higher": r.get("higher", False),
                        "values": {},
                    },
                )
                row["values"][short] = {"value": r["value"], "pass": r.get("pass")}
    width = max([20] + [len(r["label"]) for r in rows.values()]) + 2
    heads = "".join(f"{s:>16}" for s in servers)
    lines = [f"{'ratio':<{width}}{heads} {'target':>8}"]
    current = None
    for row in rows.values():
        if row["benchmark"] != current:
            current = row["benchmark"]
            lines.append(f"[{current}]")
        cells = ""
        for s in servers:
            v = row["values"].get(s)
            cells += (
                f"{(value_text(v['value']) + ' ' + verdict_text(v)).rstrip():>16}"
                if v
                else f"{'-':>16}"
            )
        lines.append(f"{row['label']:<{width}}{cells} {target_text(row):>8}")
    met = sum(1 for r in rows.values() for v in r["values"].values() if v["pass"])
    missed = sum(1 for r in rows.values() for v in r["values"].values() if v["pass"] is False)
    lines.append("")
    lines.append(f"targets: {met} met, {missed} missed (one per ratio and server)")
    for r in rows.values():
        where = [s.split()[0] for s, v in r["values"].items() if v["pass"] is False]
        if where:
            worst = max(
                (v["value"] for v in r["values"].values() if v["pass"] is False),
                key=lambda x: -x if r["higher"] else x,
            )
            lines.append(
                f"  MISS {r['label']}: {value_text(worst)} against {target_text(r)} ({', '.join(where)})"
            )
    return lines, list(rows.values())


@dataclass
class Run:
    """One run of the benchmarks: what it measures, and what each benchmark wrote."""

    names: list[str]
    quick: bool
    info: dict[str, Any] = field(default_factory=machine)
    stamp: str = field(default_factory=lambda: f"{datetime.now():%Y%m%d-%H%M%S}")
    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    waited: dict[str, Any] = field(default_factory=dict)  # per benchmark, with --wait-quiet

    @property
    def seconds(self) -> float:
        """Seconds spent measuring, not waiting."""
        return sum(d["seconds"] for d in self.documents.values())


def parse_arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the benchmarks to run."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run, of {', '.join(BENCHMARKS)} (default: all but peers)",
    )
    add_common_arguments(parser)
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also measure llama-index's and LangChain's Redis chat stores (installs them)",
    )
    parser.add_argument(
        "--wait-quiet",
        action="store_true",
        help=f"wait (up to 15 min) before each benchmark for a 1-minute load below {QUIET_LOAD}",
    )
    parser.add_argument(
        "--profile", action="store_true", help="encode: also print the client's profile"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(
            f"no benchmark named {', '.join(unknown)}; the benchmarks are {', '.join(BENCHMARKS)}"
        )
    if args.json:
        parser.error(
            "--json names one benchmark's file: use python -m benchmarks.<name> --json PATH"
        )
    return args, list(args.names) or list(DEFAULT_SET) + (["peers"] if args.peers else [])


def run_one(name: str, args: argparse.Namespace, run: Run) -> None:
    """One benchmark: waits for a quiet machine if asked, measures, writes its JSON."""
    print(flush=True)
    if args.wait_quiet:
        # Before each benchmark: other work, and the previous benchmark's own load, settle.
        load, seconds = wait_quiet()
        run.waited[name] = {"load": load, "seconds": seconds}
        print(
            f"machine {'quiet' if load < QUIET_LOAD else 'still busy'} for {name}: 1-minute load "
            f"{load:.2f} after {seconds:.0f} s of waiting",
            flush=True,
        )
    module = importlib.import_module(f"benchmarks.{name}")
    began, (busy, own) = time.monotonic(), cpu_snapshot()
    document = module.collect(args)
    document["seconds"] = time.monotonic() - began
    busy_after, own_after = cpu_snapshot()
    # What other processes used meanwhile, as a share of the machine's CPUs.
    document["others_cpu_share"] = max(0.0, (busy_after - busy) - (own_after - own)) / (
        document["seconds"] * (os.cpu_count() or 1)
    )
    run.documents[name] = document
    run.files[name] = str(write_document(name, document, None, args.quick))


def print_summary(run: Run, lines: list[str], load: tuple[float, ...]) -> None:
    """Every ratio of the run (`lines`), and how busy the machine was while each benchmark ran."""
    documents, info = run.documents, run.info
    first_load = (
        documents[run.names[0]]["machine"]["load_average"][0]
        if documents
        else info["load_average"][0]
    )
    print()
    print(
        f"== every ratio of this run ({info['kvstore_commit'] or 'no commit'}{', --quick' if run.quick else ''}; "
        f"{run.seconds:.0f} s measuring; 1-minute load {first_load:.2f} at the start, {load[0]:.2f} at the end) =="
    )
    print("\n".join(lines))
    print(
        "\nwhile each ran: "
        + "; ".join(
            f"{name} {d['seconds']:.0f} s, load {d['machine']['load_average'][0]:.2f} at its start, other processes "
            f"{100 * d['others_cpu_share']:.0f} % of the CPUs"
            for name, d in documents.items()
        )
    )
    busy = [name for name, d in documents.items() if d["others_cpu_share"] > 0.1]
    if busy:
        print(
            f"note: other processes used over 10 % of the CPUs during {', '.join(busy)}: "
            "their figures are disturbed; run again on a quiet machine (--wait-quiet)"
        )


def write_summary(run: Run, rows: list[dict[str, Any]], load: tuple[float, ...]) -> Path:
    """``summary-<date>-<time>.json``: every ratio of the run, the machine, what each benchmark took."""
    path = RESULTS_DIR / f"summary-{run.stamp}{'-quick' if run.quick else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "created": datetime.now(UTC).isoformat(),
                "quick": run.quick,
                "machine": run.info,
                "load_at_end": load,
                "waited_for_quiet": run.waited,
                "seconds": run.seconds,
                "seconds_per_benchmark": {k: d.get("seconds") for k, d in run.documents.items()},
                "others_cpu_share": {
                    k: d.get("others_cpu_share") for k, d in run.documents.items()
                },
                "files": run.files,
                "ratios": rows,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    return path


def main(argv: list[str] | None = None) -> int:
    args, names = parse_arguments(argv)
    _servers.stop_on_sigterm()
    run = Run(names, args.quick)
    failed: list[str] = []
    try:
        for name in names:
            try:
                run_one(name, args, run)
            except Exception:  # one benchmark's failure does not lose the others' figures
                traceback.print_exc()
                print(f"\n{name} FAILED (above); the other benchmarks go on", file=sys.stderr)
                failed.append(name)
    except KeyboardInterrupt:
        print("\ninterrupted; the benchmark's servers are stopped", file=sys.stderr)
        return 130
    if not args.names and "peers" not in names:
        print(
            "\npeers skipped: pass --peers to measure llama-index's RedisChatStore and LangChain's "
            "RedisChatMessageHistory beside kvstore (pip installs them into benchmarks/results/peer-packages)"
        )
    lines, rows = summary_table(run.documents)
    load = os.getloadavg()
    print_summary(run, lines, load)
    summary = write_summary(run, rows, load)
    print(f"\nall figures: {summary} (and one JSON per benchmark beside it)")
    for plot in _plots.draw(run.documents, RESULTS_DIR, args.quick):
        print(f"plot: {plot}")
    if failed:
        print(f"\nFAILED: {', '.join(failed)} (their tracebacks are above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
