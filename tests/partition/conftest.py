"""The partition tier: a cluster of each server kind of the matrix on test hosts of our own.

Its network namespaces need root and iproute2. Where they are missing the tier is deselected
(said in the run's header), unless KVSTORE_REQUIRE_NETNS=1 (CI) makes every test of it fail.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..cluster.harness import cluster_binaries
from .netlab import available

HERE = Path(__file__).parent


def _required() -> bool:
    return os.environ.get("KVSTORE_REQUIRE_NETNS") == "1"


def pytest_generate_tests(metafunc):
    if "cluster_kind" in metafunc.fixturenames:
        metafunc.parametrize("cluster_kind", list(cluster_binaries()), scope="session")


def pytest_report_header(config):
    why = available()
    if why and not _required():
        return [f"kvstore partition tier: not run ({why}; run as root with iproute2)"]
    return []


def pytest_collection_modifyitems(config, items):
    if available() is None or _required():
        return
    mine = [item for item in items if HERE in Path(str(item.fspath)).parents]
    if mine:
        config.hook.pytest_deselected(items=mine)
        items[:] = [item for item in items if item not in mine]
