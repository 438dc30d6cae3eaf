"""Fixtures of the reliability suite; every test here starts the servers it needs and stops them."""

from __future__ import annotations

import pytest

from .support import dedicated_server, server_kinds


@pytest.fixture(scope="module", params=server_kinds())
def kind(request) -> str:
    """Each real server this machine runs: valkey always, redis where installed."""
    return request.param


@pytest.fixture(scope="module")
def plain_server(kind):
    """One server of `kind` per module with default settings, for tests that do not change them."""
    with dedicated_server(kind) as server:
        yield server
