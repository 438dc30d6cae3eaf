"""The partition tier: a cluster of each server kind of the matrix on test hosts of our own."""

from __future__ import annotations

from ..cluster.harness import cluster_binaries


def pytest_generate_tests(metafunc):
    if "cluster_kind" in metafunc.fixturenames:
        metafunc.parametrize("cluster_kind", list(cluster_binaries()), scope="session")
