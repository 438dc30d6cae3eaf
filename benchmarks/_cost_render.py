"""server_cost's ratios with issue 27's targets, and its table."""

from __future__ import annotations

from typing import Any

from ._common import SCRIPT_COMMANDS, ratio, render_ratios


def _per_call(results: dict[str, Any], name: str) -> float:
    """Server µs per call of `name`; NaN when it was not measured (its ratios are left out)."""
    entry = results.get(name)
    return float(entry["usec_per_call"]) if entry else float("nan")


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ratio; a target is the issue's "must" (its "aim" is in the label)."""
    a, b = _per_call(results, "append"), _per_call(results, "bare_script")
    h, cold = _per_call(results, "hmget_50"), _per_call(results, "hmget_50_cold")
    return [
        r
        for r in _append_ratios(results, a, b) + _page_ratios(results, h, cold)
        if r["value"] == r["value"]
    ]  # NaN: not measured


def _append_ratios(results: dict[str, Any], a: float, b: float) -> list[dict[str, Any]]:
    return [
        ratio("append_vs_bare", "server time: append / bare 4-write script (aim 1.4)", a / b, 1.6),
        ratio(
            "append_events_off_vs_bare",
            "server time: append, events off / bare 4-write script (aim 1.15)",
            _per_call(results, "append_events_off") / b,
            1.3,
        ),
        ratio(
            "batch_message_vs_bare",
            "server time: per message of a batch of 10 / one bare call (aim 0.5)",
            _per_call(results, "append_batch_10") / 10 / b,
            0.6,
        ),
        ratio(
            "ceiling_vs_bare",
            "script-bound ceiling (1e6 / server µs): append / bare script (aim 0.85)",
            b / a,
            0.7,
            higher=True,
        ),
        ratio(
            "append_vs_bare_cpu",
            "server CPU incl. I/O: append / bare 4-write script",
            results["append"]["cpu_usec_per_call"] / results["bare_script"]["cpu_usec_per_call"],
            None,
        ),
    ]


def _page_ratios(results: dict[str, Any], h: float, cold: float) -> list[dict[str, Any]]:
    return [
        ratio(
            "newest_page_cold_vs_hmget",
            "server time: newest page of 50 / HMGET of 50, cold, many threads (aim 0.3)",
            _per_call(results, "newest_page_cold") / cold,
            0.5,
        ),
        ratio(
            "newest_page_vs_hmget",
            "server time: newest page of 50 / HMGET of 50, hot (one thread)",
            _per_call(results, "newest_page") / h,
            None,
        ),
        ratio(
            "older_page_vs_hmget",
            "server time: older page of 50 / HMGET of 50 (aim 1.0)",
            _per_call(results, "older_page") / h,
            1.5,
        ),
        ratio(
            "older_page_by_id_vs_hmget",
            "server time: older page of 50, id cursor / HMGET of 50",
            _per_call(results, "older_page_by_id") / h,
            None,
        ),
        ratio(
            "list_page_vs_hmget",
            "server time: JSON list LRANGE -50 -1 / HMGET of 50",
            _per_call(results, "list_page") / h,
            None,
        ),
    ]


def _append_lines(result: dict[str, Any], name: str) -> list[str]:
    """What one append's script ran: the commands, their time, the rest."""
    entry = result["results"][name]
    inner = entry["inner_usec_per_call"]
    top = sorted(
        ((k, v) for k, v in entry["commands"].items() if k not in SCRIPT_COMMANDS),
        key=lambda kv: -kv[1]["usec"],
    )
    return [
        f"  of which the commands it runs: {inner:.1f}; Lua and reply conversion: "
        f"{entry['usec_per_call'] - inner:.1f}",
        "  commands per append: "
        + ", ".join(f"{k} ×{v['per_call']:.2f} {v['usec'] / entry['calls']:.2f}" for k, v in top),
    ]


def _slowlog_line(per_call: dict[str, Any]) -> str:
    return (
        f"  per call (SLOWLOG, {per_call['calls']} appends): median {per_call['median_us']} µs; "
        f"the slowest {per_call['slowest_share'].split(' (')[0]} (the appends that close a chunk)"
        f" {per_call['slowest_share_mean_us']:.0f} µs "
        f"on average, the others {per_call['typical_mean_us']:.1f}"
    )


def render(result: dict[str, Any]) -> str:
    r = result["results"]
    lines = [
        f"== {result['server']} ==",
        f"thread of {result['messages']:,} messages of {result['record_bytes']:,} B; "
        f"{r['append']['calls']:,} calls of each",
        "",
        f"{'server time per call (µs)':<56} {'commandstats':>12} {'CPU incl. I/O':>14}",
    ]

    def row(label: str, entry: dict[str, Any]) -> None:
        lines.append(
            f"{label:<56} {entry['usec_per_call']:>12.1f} {entry['cpu_usec_per_call']:>14.1f}"
        )

    command = result["requests"].get("append", "EVALSHA")
    row(f"kvstore append ({command}, events on, amortized)", r["append"])
    lines += _append_lines(result, "append")
    if result.get("append_per_call"):
        lines.append(_slowlog_line(result["append_per_call"]))
    row(f"kvstore append ({command}, events off)", r["append_events_off"])
    lines += _append_lines(result, "append_events_off")
    row("kvstore append, batch of 10 (per call)", r["append_batch_10"])
    row("bare 4-write script (EVALSHA)", r["bare_script"])
    for name, label in (
        ("newest_page", "kvstore newest page of 50, hot (one thread)"),
        ("newest_page_cold", f"  the same, cold ({result['cold_threads']} threads)"),
        ("older_page", "kvstore older page of 50 (plan + fetch)"),
        ("older_page_by_id", "  the same from an id cursor"),
    ):
        if name not in r:
            lines.append(f"{label:<56} {'not measured (the page read back wrong)':>28}")
            continue
        row(label, r[name])
        parts = " + ".join(f"{p['usec_per_call']:.1f}" for p in r[name]["parts"])
        lines.append("  " + "; ".join(result["requests"][name]) + f" ({parts})")
    row("native HMGET of 50 fields (1 KB values), hot", r["hmget_50"])
    row(f"  the same, cold ({result['cold_threads']} hashes)", r["hmget_50_cold"])
    row("JSON list LRANGE -50 -1", r["list_page"])
    lines.append("")
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)
