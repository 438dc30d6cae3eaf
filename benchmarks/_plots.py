"""PNG plots of the benchmarks' figures (matplotlib, Agg backend: no display needed).

matplotlib is an optional extra (``pip install -e ".[bench]"``); without it the plots are skipped
with a note and everything else runs. Each plot is drawn from a benchmark's JSON document, so
``draw`` also works on files of earlier runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._key_kinds import KINDS

SERVER_COLORS = {"valkey": "#3b6ea8", "redis": "#c0392b", "url": "#555555"}
PALETTE = [
    "#3b6ea8",
    "#e39b2d",
    "#5a9e4b",
    "#9b59b6",
    "#c0392b",
    "#7f8c8d",
    "#16a085",
    "#d35400",
    "#2c3e50",
]


def draw(documents: dict[str, dict[str, Any]], out_dir: Path, quick: bool) -> list[Path]:
    """Draws every plot the given documents allow; returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('plots skipped: matplotlib is not installed (pip install -e ".[bench]")')
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "-quick" if quick else ""
    drawers: dict[str, list[tuple[str, Callable[[Any, dict[str, Any]], None]]]] = {
        "append": [("append-latency", _append)],
        "server_cost": [("server-cost", _server_cost)],
        "memory": [("memory-per-message", _memory), ("bounded-state", _bounded)],
        "throughput": [("throughput", _throughput)],
        "encode": [("encode-breakdown", _encode)],
        "peers": [("peers", _peers)],
    }
    written = []
    for benchmark, document in documents.items():
        if not document or not document.get("servers"):
            continue
        for name, drawer in drawers.get(benchmark, []):
            figure = plt.figure(figsize=(11, 6.2), dpi=110)
            try:
                drawer(figure, document)
                figure.tight_layout()
                path = out_dir / f"{name}{suffix}.png"
                figure.savefig(path)
                written.append(path)
            finally:
                plt.close(figure)
    return written


def _servers(document: dict[str, Any]) -> list[dict[str, Any]]:
    return document["servers"]


def _title(figure: Any, text: str, document: dict[str, Any]) -> None:
    machine = document.get("machine", {})
    commit = machine.get("kvstore_commit") or ""
    load = machine.get("load_average")
    notes = (
        [commit]
        + ([f"load {load[0]:.2f}"] if load else [])
        + (["--quick"] if document.get("quick") else [])
    )
    figure.suptitle(f"{text}  ({', '.join(n for n in notes if n)})", fontsize=11)


def _hbars(
    ax: Any,
    labels: list[str],
    values: list[float],
    colors: Any = None,
    texts: list[str] | None = None,
    log: bool = False,
) -> None:
    y = range(len(labels))
    ax.barh(list(y), values, color=colors or PALETTE[0])
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    top = max(values) if values else 1
    texts = texts or [f"{v:,.0f}" for v in values]
    for i, (v, text) in enumerate(zip(values, texts, strict=True)):
        ax.text(v * 1.12 if log else v + top * 0.01, i, text, va="center", fontsize=7)
    if log:
        ax.set_xscale("log")
    else:
        ax.set_xlim(0, top * 1.45)


def _append(figure: Any, document: dict[str, Any]) -> None:
    servers = _servers(document)
    _title(figure, "Append and newest page of 50: median latency, µs (p99 beside it)", document)
    for i, server in enumerate(servers):
        ax = figure.add_subplot(1, len(servers), i + 1)
        rows = [s for s in server["latency"].values() if "whole" not in s["label"]]
        labels = [s["label"].strip() for s in rows]
        med = [s["median_us"] for s in rows]
        colors = [
            PALETTE[0]
            if "kvstore" in s["label"]
            or "append" in s["label"]
            or "script alone" in s["label"]
            or "prepare" in s["label"]
            else PALETTE[5]
            for s in rows
        ]
        _hbars(
            ax,
            labels,
            med,
            colors,
            [f"{s['median_us']:,.0f}  (p99 {s['p99_us']:,.0f})" for s in rows],
        )
        whole = [s for s in server["latency"].values() if "whole" in s["label"]]
        extra = "\n".join(
            f"{s['label'].replace(' (LRANGE 0 -1)', '')}: {s['median_us'] / 1000:,.1f} ms"
            for s in whole
        )
        ax.set_title(server["server"] + ("\n" + extra if extra else ""), fontsize=9)
        ax.set_xlabel("µs (grey: kvstore's baselines)")


def _server_cost(figure: Any, document: dict[str, Any]) -> None:
    servers = _servers(document)
    _title(figure, "Server time per operation, µs (INFO commandstats usec per call)", document)
    names = [
        ("append", "kvstore append"),
        ("append_events_off", "append, events off"),
        ("bare_script", "bare 4-write script"),
        ("newest_page_cold", "newest page of 50, cold"),
        ("hmget_50_cold", "HMGET of 50, cold"),
        ("older_page", "older page of 50"),
        ("hmget_50", "HMGET of 50, hot"),
        ("list_page", "JSON list LRANGE -50 -1"),
    ]
    # An operation one server did not measure (a page that read back wrong) is left out.
    names = [n for n in names if all(n[0] in server["results"] for server in servers)]
    ax = figure.add_subplot(1, 1, 1)
    width = 0.8 / len(servers)
    for i, server in enumerate(servers):
        values = [server["results"][key]["usec_per_call"] for key, _ in names]
        xs = [j + i * width for j in range(len(names))]
        ax.bar(
            xs,
            values,
            width,
            label=server["server"],
            color=SERVER_COLORS.get(server["name"], PALETTE[i]),
        )
        for x, v in zip(xs, values, strict=True):
            ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(names))])
    ax.set_xticklabels([label for _, label in names], fontsize=8)
    ax.set_ylabel("µs of server time per call")
    ax.legend(fontsize=8)
    lines = []
    for server in servers:
        for r in server["ratios"]:
            if r.get("target") is not None:
                lines.append(
                    f"{server['server']}: {r['label'].removeprefix('server time: ')} = {r['value']:.2f}"
                    f" (target {'≥' if r.get('higher') else '≤'} {r['target']:g})"
                )
    ax.text(
        0.01,
        0.98,
        "\n".join(lines),
        transform=ax.transAxes,
        va="top",
        fontsize=7,
        bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "#cccccc"},
    )


def _memory(figure: Any, document: dict[str, Any]) -> None:
    servers = _servers(document)
    _title(figure, "Memory per stored message (MEMORY USAGE / messages), bytes", document)
    ax = figure.add_subplot(1, 1, 1)
    bars, labels = [], []
    for server in servers:
        short = server["server"].split()[0]
        for entry in server["sizes"]:
            labels.append(f"{short}\nkvstore\n{entry['size']:,}")
            bars.append(("kvstore", entry))
            labels.append(f"{short}\nJSON list\n{entry['size']:,}")
            bars.append(("list", entry))
    kinds = list(KINDS)
    for entry in (e for s in servers for e in s["sizes"]):
        for kind in entry["kvstore"]["kinds"]:
            if kind not in kinds:
                kinds.append(kind)
    bottoms = [0.0] * len(bars)
    for k, kind in enumerate(kinds):
        values = []
        for what, entry in bars:
            n = entry["messages"]
            if what == "kvstore":
                values.append(entry["kvstore"]["kinds"].get(kind, {}).get("bytes", 0) / n)
            else:
                values.append(0.0)
        if not any(values):
            continue
        ax.bar(
            range(len(bars)),
            values,
            bottom=bottoms,
            label=KINDS.get(kind, kind),
            color=PALETTE[k % len(PALETTE)],
        )
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    list_values = [
        entry["json_list"]["bytes"] / entry["messages"] if what == "list" else 0
        for what, entry in bars
    ]
    ax.bar(
        range(len(bars)),
        list_values,
        bottom=bottoms,
        color="#95a5a6",
        label="JSON list (one Redis list)",
    )
    totals = [b + v for b, v in zip(bottoms, list_values, strict=True)]
    for x, v in enumerate(totals):
        ax.text(x, v + 10, f"{v:,.0f}", ha="center", fontsize=8)
    record = servers[0]["sizes"][0]["record_bytes"] / servers[0]["sizes"][0]["messages"]
    ax.axhline(record, color="#333333", linestyle="--", linewidth=1)
    ax.text(len(bars) - 0.5, record - 60, f"msgpack record {record:,.0f} B", ha="right", fontsize=8)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("bytes per stored message")
    ax.set_ylim(0, max(totals) * 1.12)
    ax.legend(fontsize=7, loc="upper left", ncol=4)


def _bounded_title(bounded: dict[str, Any]) -> str:
    config = bounded["config"]
    return (
        f"One thread over {bounded['samples'][-1]['turn']:,} turns, compaction every "
        f"{config['compact_every']} turns, retained_message_limit {config['retained_message_limit']}"
    )


def _bounded(figure: Any, document: dict[str, Any]) -> None:
    servers = _servers(document)
    _title(figure, _bounded_title(servers[0]["bounded"]), document)
    left = figure.add_subplot(1, 2, 1)
    right = figure.add_subplot(1, 2, 2)
    for i, server in enumerate(servers):
        samples = server["bounded"]["samples"]
        turns = [s["turn"] for s in samples]
        color = SERVER_COLORS.get(server["name"], PALETTE[i])
        short = server["server"]
        left.plot(
            turns,
            [s["list_bytes"] / 1024 for s in samples],
            color=color,
            linestyle="--",
            label=f"JSON list, {short}",
        )
        left.plot(
            turns,
            [s["kvstore_bytes"] / 1024 for s in samples],
            color=color,
            label=f"kvstore, {short}",
        )
        right.plot(
            turns,
            [s["kvstore_bytes"] / 1024 for s in samples],
            color=color,
            marker=".",
            label=f"kvstore KB, {short}",
        )
        if i == 0:
            twin = right.twinx()
        twin.plot(
            turns,
            [s["stored_messages"] for s in samples],
            color=color,
            alpha=0.35,
            linestyle=":",
            label=f"messages stored, {short}",
        )
    bound = servers[0]["bounded"]["bound_messages"]
    twin.axhline(bound, color="#555555", linewidth=0.8, linestyle="-.")
    twin.text(turns[0], bound + 2, f"retained + window + chunk = {bound}", fontsize=7)
    twin.set_ylabel("messages stored (dotted)")
    twin.set_ylim(0, bound * 1.3)
    left.set_title("memory, KB: kvstore against the JSON list of the same messages", fontsize=9)
    left.set_xlabel("turns")
    left.set_ylabel("KB (sum of MEMORY USAGE)")
    left.legend(fontsize=7)
    right.set_title("kvstore alone: memory (solid) and messages stored (dotted)", fontsize=9)
    right.set_xlabel("turns")
    right.set_ylabel("KB")
    right.set_ylim(
        0, max(s["kvstore_bytes"] for sv in servers for s in sv["bounded"]["samples"]) / 1024 * 1.3
    )
    right.legend(fontsize=7, loc="lower right")


def _throughput(figure: Any, document: dict[str, Any]) -> None:
    servers = _servers(document)
    _title(
        figure, "Appends per second by worker processes (2 CPUs shared with the server)", document
    )
    series = [
        ("kvstore", False, "kvstore, distinct threads"),
        ("kvstore", True, "kvstore, one shared thread"),
        ("bare", False, "bare 4-write EVALSHA from Python"),
    ]
    for i, server in enumerate(servers):
        ax = figure.add_subplot(1, len(servers), i + 1)
        width = 0.26
        for j, (kind, shared, label) in enumerate(series):
            values = []
            for workers in (1, 2, 4):
                match = [
                    r
                    for r in server["runs"]
                    if r["kind"] == kind
                    and r["workers"] == workers
                    and (r["shared"] == shared or (kind == "kvstore" and workers == 1))
                ]
                values.append(match[0]["per_second"] if match else 0)
            xs = [k + (j - 1) * width for k in range(3)]
            ax.bar(xs, values, width, label=label, color=PALETTE[j])
            for x, v in zip(xs, values, strict=True):
                ax.text(x, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=6)
        limit = server["ceiling"]
        if "runs" in limit:
            for key, label, style in (
                ("bare_p1", "server ceiling, bare script", "--"),
                ("kvstore_p1", "server ceiling, kvstore script", "-."),
            ):
                v = limit["runs"][key]["per_second"]
                ax.axhline(v, color="#333333", linestyle=style, linewidth=1)
                ax.text(2.45, v, f"{label}: {v:,.0f}/s", ha="right", va="bottom", fontsize=7)
        ax.set_xticks(range(3))
        ax.set_xticklabels(["1 worker", "2 workers", "4 workers"])
        ax.set_title(server["server"], fontsize=10)
        ax.set_ylabel("appends per second")
        ax.legend(fontsize=7, loc="upper left")


def _encode(figure: Any, document: dict[str, Any]) -> None:
    servers = _servers(document)
    _title(figure, "Where the time goes: medians, µs", document)
    for i, server in enumerate(servers):
        ax = figure.add_subplot(1, len(servers), i + 1)
        s = {k: v["median_us"] for k, v in server["steps"].items()}
        append_parts = [
            ("bare script round trip", s["bare"]),
            ("kvstore script over bare", s["script"] - s["bare"]),
            ("prepare_batch (validate, encode)", s["prepare"]),
            ("rest of the client side", s["append"] - s["script"] - s["prepare"]),
        ]
        page_parts = [
            ("native read round trip", s["read"]),
            ("msgpack unpack ×50", s["unpack"]),
            ("pydantic validate ×50", s["validate_page"]),
            ("rest", s["page"] - s["read"] - s["unpack"] - s["validate_page"]),
        ]
        for row, parts in enumerate((append_parts, page_parts)):
            left = 0.0
            for k, (label, value) in enumerate(parts):
                color = PALETTE[(k + 4 * row) % len(PALETTE)]
                ax.barh(row, value, left=left, color=color, label=label)
                if value > 12:
                    ax.text(
                        left + value / 2,
                        row,
                        f"{value:.0f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white",
                    )
                left += value
        ax.set_yticks([0, 1])
        ax.set_yticklabels(
            [f"append\n{s['append']:.0f} µs", f"page of 50\n{s['page']:.0f} µs"], fontsize=8
        )
        ax.invert_yaxis()
        ax.set_xlabel("µs")
        ax.set_title(server["server"], fontsize=10)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)


def _peers(figure: Any, document: dict[str, Any]) -> None:
    servers = _servers(document)
    _title(
        figure,
        "kvstore beside llama-index RedisChatStore and LangChain RedisChatMessageHistory (median µs, log)",
        document,
    )
    for i, server in enumerate(servers):
        ax = figure.add_subplot(1, len(servers), i + 1)
        rows = list(server["latency"].values())
        colors = [
            PALETTE[0]
            if s["label"].startswith("kvstore")
            else PALETTE[1]
            if s["label"].startswith("llama")
            else PALETTE[2]
            for s in rows
        ]
        _hbars(ax, [s["label"] for s in rows], [s["median_us"] for s in rows], colors, log=True)
        ax.set_xlim(50, max(s["median_us"] for s in rows) * 6)
        ax.set_title(server["server"], fontsize=10)
        ax.set_xlabel("µs (log scale)")


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks._plots SUMMARY.json``: draws a run's plots again from its files."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks._plots benchmarks/results/summary-<date>-<time>.json")
        return 2
    summary = json.loads(Path(args[0]).read_text())
    documents = {
        name: json.loads(Path(path).read_text()) for name, path in summary["files"].items()
    }
    for path in draw(documents, Path(args[0]).parent, summary["quick"]):
        print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
