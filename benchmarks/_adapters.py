"""What the sync adapter benchmarks share (integration_langchain, integration_llamaindex): the
five calls measured in shuffled, interleaved rounds, and the three ratios against the peer."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from ._common import ratio, render_ratios


def timed(call: Callable[[], Any]) -> float:
    began = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - began) / 1000


def interleaved_medians(
    variants: dict[str, Callable[[], Any]], warmup: int, rounds: int
) -> dict[str, float]:
    """The median µs of each call over `rounds` shuffled rounds (after `warmup` more)."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    rng = random.Random(1)
    for round_ in range(warmup + rounds):
        rng.shuffle(order)
        for name in order:
            spent = timed(variants[name])
            if round_ >= warmup:
                samples[name].append(spent)
    return {name: statistics.median(values) for name, values in samples.items()}


def adapter_ratios(medians: dict[str, float], peer: str) -> list[dict[str, Any]]:
    """Newest 50 (target ≤ 1.0), whole history (≤ 1.2), the model's history (≥ 10× faster)."""
    return [
        ratio(
            "newest_50",
            f"newest 50: kvstore / {peer}",
            medians["kvstore_newest_50"] / medians["peer_newest_50"],
            1.0,
        ),
        ratio(
            "whole",
            f"whole history: kvstore / {peer}",
            medians["kvstore_whole"] / medians["peer_whole"],
            1.2,
        ),
        ratio(
            "context",
            f"model's history: {peer} whole / kvstore context",
            medians["peer_whole"] / medians["kvstore_context"],
            10.0,
            higher=True,
        ),
    ]


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['name']} ({result['server']})"]
    lines += [f"  {name:<20} {value:>10.0f} us" for name, value in result["medians_us"].items()]
    lines.append("")
    lines += render_ratios(result["ratios"], "ratios")
    return "\n".join(lines)
