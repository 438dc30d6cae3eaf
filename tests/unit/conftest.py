"""Fixtures of the unit layer, and its guard: no test here opens a socket or starts a server."""

from __future__ import annotations

import socket

import pytest

from kvstore import StoreConfig
from kvstore._engine.core import ThreadRef

from .layout import FakeThread


@pytest.fixture(autouse=True)
def no_server(request, monkeypatch):
    """A unit test talks to no server: connecting fails, and it may not ask for a backend (the
    test servers start at collection, for the tests that do, so only the asking shows)."""
    assert "backend" not in request.fixturenames, "a unit test asked for a test server (backend)"

    def refuse(self, address):
        raise AssertionError(f"a unit test connected to {address}: the core must not do I/O")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture
def config() -> StoreConfig:
    return StoreConfig(namespace="unit")


@pytest.fixture
def thread(config) -> ThreadRef:
    return ThreadRef.of(config, "t-1")


@pytest.fixture
def fake(thread) -> FakeThread:
    return FakeThread(thread.keys)
