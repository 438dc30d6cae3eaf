"""A short run of the throughput measurement (tests/cluster/throughput.py): 4 worker processes on
one standalone server, then on a 3-primary cluster. It checks that every acknowledged append is
stored and prints the figures; docs/SCALING.md quotes longer runs of `python -m tests.cluster.throughput`.
No speed is asserted: on this 2-core machine the figures depend on what else runs."""

from __future__ import annotations

from .harness import cluster_binaries
from .throughput import measure


def test_appends_per_second_standalone_vs_cluster(cluster_kind, record_property):
    figures = measure(cluster_kind, cluster_binaries()[cluster_kind], seconds=1.5, workers=4)
    assert figures["standalone"] > 0 and figures["cluster"] > 0
    assert len(figures["threads_per_primary"]) == 3, (
        "the threads did not spread over the 3 primaries"
    )
    record_property("appends_per_second", figures)
    print(
        f"\n{cluster_kind}: standalone {figures['standalone']:,.0f} appends/s,"
        f" 3-primary cluster {figures['cluster']:,.0f} appends/s"
    )
