"""The retained chat's ratios (memory.py's bounded state): no upward trend once retention runs,
the bound LAYOUT.md states, bytes per stored message flat (±10 % of their median), and the
memory with events on against off."""

from __future__ import annotations

import statistics
from typing import Any

from ._common import ratio


def _steady(bounded: dict[str, Any]) -> list[dict[str, Any]]:
    """The samples from the first one where retention had deleted messages."""
    samples = bounded["samples"]
    started = next((x for x in samples if x["deleted_before"]), None)
    return [] if started is None else [x for x in samples if x["turn"] >= started["turn"]]


def bounded_ratios(
    bounded: dict[str, Any], quiet: dict[str, Any], params: Any
) -> list[dict[str, Any]]:
    """The retained chat: no upward trend, the stated bound, bytes per stored message flat
    (±10 % of their median once retention runs), events on against off."""
    ratios = []
    steady, steady_quiet = _steady(bounded), _steady(quiet)
    if steady:
        ratios += _steady_ratios(bounded, steady, params)
    if steady and steady_quiet:
        on = statistics.median(x["kvstore_bytes"] for x in steady)
        off = statistics.median(x["kvstore_bytes"] for x in steady_quiet)
        ratios.append(
            ratio(
                "retained_events_on_vs_off",
                "retained chat: memory, events on / off (median once retention runs; aim 1.05)",
                on / off,
                1.1,
            )
        )
    last = bounded["samples"][-1]
    ratios.append(
        ratio(
            "bounded_list_vs_kvstore",
            f"memory after {params.turns:,} turns: JSON list / kvstore",
            last["list_bytes"] / last["kvstore_bytes"],
            None,
        )
    )
    return ratios


def _steady_ratios(
    bounded: dict[str, Any], steady: list[dict[str, Any]], params: Any
) -> list[dict[str, Any]]:
    """No upward trend, the stated bound, bytes per stored message flat, once retention runs."""
    ratios = []
    bounded["retention_from_turn"] = steady[0]["turn"]
    bounded["band"] = [
        min(x["kvstore_bytes"] for x in steady),
        max(x["kvstore_bytes"] for x in steady),
    ]
    bounded["max_stored"] = max(x["stored_messages"] for x in steady)
    half = [x for x in steady if x["turn"] > params.turns // 2]
    first_half = [x for x in steady if x["turn"] <= params.turns // 2]
    if half and first_half:
        ratios.append(
            ratio(
                "bounded_trend",
                f"bounded: memory, max after turn {params.turns // 2:,} / max from turn {steady[0]['turn']} to it",
                max(x["kvstore_bytes"] for x in half) / max(x["kvstore_bytes"] for x in first_half),
                1.05,
            )
        )
    ratios.append(
        ratio(
            "bounded_messages",
            "bounded: most messages stored / (retained + window + chunk)",
            bounded["max_stored"] / bounded["bound_messages"],
            1.0,
        )
    )
    per_message = [x["kvstore_bytes"] / x["stored_messages"] for x in steady]
    middle = statistics.median(per_message)
    bounded["bytes_per_message"] = {
        "min": min(per_message),
        "median": middle,
        "max": max(per_message),
    }
    ratios.append(
        ratio(
            "bounded_per_message_max",
            "bounded: bytes per stored message, highest / median (flat: ±10 %)",
            max(per_message) / middle,
            1.1,
        )
    )
    ratios.append(
        ratio(
            "bounded_per_message_min",
            "bounded: bytes per stored message, lowest / median (flat: ±10 %)",
            min(per_message) / middle,
            0.9,
            higher=True,
        )
    )
    return ratios
