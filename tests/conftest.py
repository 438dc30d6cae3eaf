"""Test tiers: the server matrix of tests/support/servers.py (real Valkey always, real Debian
Redis where installed and required in CI, the other majors CI names) and fakeredis (the
in-process tier). Each test gets a fresh random namespace, never FLUSHALL."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import uuid
from pathlib import Path

import pytest
import redis

from kvstore import AsyncMessageStore, MessageStore, StoreConfig

from .support.facade import SyncFacade
from .support.servers import (
    ServerProcess,
    redis_binary,
    selected_backends,
    server_binaries,
    uses_fakeredis,
)

_servers: dict[str, ServerProcess] = {}

# A run started in the background by a script (`pytest &`) inherits SIGINT ignored, and so would
# every process the tests start; the tests that stop a child with SIGINT, as Ctrl-C in a
# terminal would, need it delivered. A handler is not inherited: the children start with the
# default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _start_servers() -> dict[str, ServerProcess]:
    if _servers:
        return _servers
    for kind, binary in server_binaries().items():
        _servers[kind] = ServerProcess(kind, binary).start()
    return _servers


def _serverless_layers_only(config) -> bool:
    """Whether the run holds only tests/unit and tests/offline, the layers that need no server."""
    layers = [Path(__file__).parent / name for name in ("unit", "offline")]
    paths = [
        (config.invocation_params.dir / str(arg).split("::")[0]).resolve() for arg in config.args
    ]
    return bool(paths) and all(
        any(path == layer or layer in path.parents for layer in layers) for path in paths
    )


def pytest_report_header(config):
    if _serverless_layers_only(config):
        return ["kvstore test servers: none started (tests/unit and tests/offline need none)"]
    servers = _start_servers()
    lines = [
        f"kvstore test servers: {name} {s.version()} on {s.url}" for name, s in servers.items()
    ]
    if not redis_binary():
        lines.append("kvstore test servers: redis-server not on PATH, the Redis tier is not run")
    return lines


def pytest_sessionfinish(session, exitstatus):
    for server in _servers.values():
        server.cleanup()
    _servers.clear()


@pytest.fixture(autouse=True, scope="module")
def _collect_what_the_module_left():
    """A connection a test module leaves open warns (an error here) when it is collected: collect
    at the module's end, so the warning fails that module's last test, not a later module's."""
    yield
    gc.collect()


# The parameters that name a server kind: a test with none of them runs the same on any matrix.
SERVER_PARAMS = {"backend", "kind", "cluster_kind"}


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` run with KVSTORE_LONG=1 only: any other run deselects them (never a
    skip). A run that picks its backends (KVSTORE_SERVERS, as CI's run on the matrix's other
    majors) keeps only the tests parametrized by a server kind: the others would repeat the main
    run; with KVSTORE_MODES=sync also only one client mode where a test has both."""
    if os.environ.get("KVSTORE_LONG") != "1":
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    if selected_backends() is None:
        return
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        (keep if callspec and SERVER_PARAMS & set(callspec.params) else drop).append(item)
    drop += _async_twins(keep) if os.environ.get("KVSTORE_MODES") == "sync" else []
    if drop:
        config.hook.pytest_deselected(items=drop)
        dropped = set(drop)
        items[:] = [item for item in keep if item not in dropped]


def _async_twins(items) -> list:
    """The async cases whose sync case is among `items`. CI's run on the other majors leaves them
    out (KVSTORE_MODES=sync): both client modes ran on the main servers, and what a server's
    major can change is the server's side, which a sync case reaches as its async case does."""
    sync_cases = {_case_in_mode(item, "sync") for item in items if _mode(item) == "sync"}
    return [
        item
        for item in items
        if _mode(item) == "async" and _case_in_mode(item, "sync") in sync_cases
    ]


def _mode(item) -> str | None:
    """The client mode a test case's id names, if any."""
    parts = item.callspec.id.split("-")
    return "async" if "async" in parts else "sync" if "sync" in parts else None


def _case_in_mode(item, mode: str) -> str:
    """A test case's node id with its client mode read as `mode`."""
    parts = [mode if part in ("sync", "async") else part for part in item.callspec.id.split("-")]
    return f"{item.nodeid.split('[')[0]}[{'-'.join(parts)}]"


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        names = list(_start_servers())
        if "server_only" not in metafunc.fixturenames and uses_fakeredis():
            names.append("fakeredis")
        metafunc.parametrize("backend", names, scope="session")
    if "mode" in metafunc.fixturenames and not _parametrizes(metafunc, "mode"):
        metafunc.parametrize("mode", ["sync", "async"])


def _parametrizes(metafunc, name: str) -> bool:
    """Whether the test names its own values of `name` (with the modes it runs in, say)."""
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0]
        if name in ([n.strip() for n in names.split(",")] if isinstance(names, str) else names):
            return True
    return False


@pytest.fixture
def server_only():
    """Ask for this fixture to run a backend test on the real servers only."""


@pytest.fixture
def server(backend) -> ServerProcess:
    if backend == "fakeredis":
        pytest.fail("this test needs a real server; add the server_only fixture")
    return _servers[backend]


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def raw_client(backend):
    """A plain client on the backend's server, for crafting and inspecting state."""
    if backend == "fakeredis":
        import fakeredis

        client = fakeredis.FakeRedis(server=_fake_server())
    else:
        client = redis.Redis.from_url(_servers[backend].url)
    yield client
    client.close()


_fake = {}


def _fake_server():
    import fakeredis

    if "server" not in _fake:
        _fake["server"] = fakeredis.FakeServer()
    return _fake["server"]


def make_sync_store(backend: str, config: StoreConfig, count_tokens=None) -> MessageStore:
    if backend == "fakeredis":
        import fakeredis

        return MessageStore(fakeredis.FakeRedis(server=_fake_server()), config, count_tokens)
    return MessageStore.from_url(_servers[backend].url, config, count_tokens=count_tokens)


def make_async_store(backend: str, config: StoreConfig, count_tokens=None) -> AsyncMessageStore:
    if backend == "fakeredis":
        import fakeredis

        return AsyncMessageStore(
            fakeredis.FakeAsyncRedis(server=_fake_server()), config, count_tokens
        )
    return AsyncMessageStore.from_url(_servers[backend].url, config, count_tokens=count_tokens)


@pytest.fixture
def make_thread(backend, mode, namespace):
    """make_thread(thread_id, count_tokens=None, **config) -> a thread with sync-looking methods,
    in either mode (`count_tokens`: the store's token counter)."""
    loop = asyncio.new_event_loop() if mode == "async" else None
    stores = []

    def make(thread_id: str = "thread-1", count_tokens=None, **config_values):
        config = StoreConfig(namespace=namespace, **config_values)
        if mode == "sync":
            store = make_sync_store(backend, config, count_tokens)
            stores.append(store)
            return store.thread(thread_id)
        store = make_async_store(backend, config, count_tokens)
        stores.append(store)
        return SyncFacade(store.thread(thread_id), loop)

    yield make
    for store in stores:
        if mode == "sync":
            store.close()
        else:
            loop.run_until_complete(store.close())
    if loop:
        loop.close()
