"""KVSTORE_MODES=sync (CI's run on the other server majors) leaves out only the async cases whose
sync case runs: a test with an async case alone, or with no mode, still runs."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import _async_twins


def _case(name: str, case_id: str) -> SimpleNamespace:
    return SimpleNamespace(
        nodeid=f"tests/integration/test_x.py::{name}[{case_id}]",
        callspec=SimpleNamespace(id=case_id),
    )


def test_only_async_cases_with_a_sync_twin_are_left_out():
    twin_sync = _case("test_a", "valkey8-sync-raise")
    twin_async = _case("test_a", "valkey8-async-raise")
    other_server_async = _case("test_a", "redis8-async-raise")  # its sync case is not collected
    async_alone = _case("test_b", "valkey8-async")
    no_mode = _case("test_c", "valkey8")
    asynchronous_word = _case("test_d", "valkey8-asyncio")
    items = [twin_sync, twin_async, other_server_async, async_alone, no_mode, asynchronous_word]

    assert _async_twins(items) == [twin_async]
