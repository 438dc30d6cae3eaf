"""Closing a store ends its open watchers (docs/EVENTS.md, "Shutting down"): a watcher blocked in
its XREAD BLOCK right now stops within a bound, cleanly (the iteration ends, no error), and no
event is delivered after close() returns; sync and async, on each real server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvstore import StoreConfig, UserMessage
from kvstore.cli.process import free_port

from ..conftest import _servers, make_async_store, make_sync_store

ROOT = Path(__file__).resolve().parents[2]


def _url(backend: str) -> str:
    return _servers[backend].url


BLOCK_MS = 20_000  # far longer than the bound: only close() can end the read
BOUND_S = 1.0


def test_closing_a_sync_store_ends_a_blocked_watcher(server_only, backend, namespace):
    config = StoreConfig(namespace=namespace)
    store, writer = make_sync_store(backend, config), make_sync_store(backend, config)
    delivered: list[float] = []
    failures: list[BaseException] = []
    watching = threading.Event()

    def watch() -> None:
        try:
            for _ in store.thread("t").watch(block_ms=BLOCK_MS):
                delivered.append(time.monotonic())
                watching.set()
        except BaseException as exc:  # recorded: the test fails on it
            failures.append(exc)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while not watching.is_set() and time.monotonic() < deadline:
            writer.thread("t").append(UserMessage(content="hi"))
            watching.wait(0.2)
        assert watching.is_set(), "the watcher got no event"
        time.sleep(0.3)  # blocked in XREAD BLOCK now
        started = time.monotonic()
        store.close()
        closed = time.monotonic()
        writer.thread("t").append(UserMessage(content="after close"))
        watcher.join(BOUND_S)
        ended = time.monotonic()
        assert not watcher.is_alive(), "the watcher still runs after close()"
    finally:
        store.close()
        watcher.join(BLOCK_MS / 1000 + 5)
        writer.close()
    print(f"\nsync watcher [{backend}] ended {ended - started:.3f} s after close() was called")
    assert failures == []
    assert all(at <= closed for at in delivered), "an event was delivered after close()"


def test_closing_an_async_store_ends_a_blocked_watcher(server_only, backend, namespace):
    async def scenario() -> tuple[float, float, list[float]]:
        config = StoreConfig(namespace=namespace)
        store, writer = make_async_store(backend, config), make_async_store(backend, config)
        delivered: list[float] = []
        watching = asyncio.Event()

        async def watch() -> None:
            async for _ in store.thread("t").watch(block_ms=BLOCK_MS):
                delivered.append(time.monotonic())
                watching.set()

        task = asyncio.create_task(watch())
        try:
            for _ in range(50):
                await writer.thread("t").append(UserMessage(content="hi"))
                try:
                    await asyncio.wait_for(watching.wait(), 0.2)
                    break
                except TimeoutError:
                    continue
            assert watching.is_set(), "the watcher got no event"
            await asyncio.sleep(0.3)  # blocked in XREAD BLOCK now
            started = time.monotonic()
            await store.close()
            closed = time.monotonic()
            await writer.thread("t").append(UserMessage(content="after close"))
            await asyncio.wait_for(task, BOUND_S)  # ends, and raises nothing
            return closed, time.monotonic() - started, delivered
        finally:
            task.cancel()
            await store.close()
            await writer.close()

    closed, took, delivered = asyncio.run(scenario())
    print(f"\nasync watcher [{backend}] ended {took:.3f} s after close() was called")
    assert all(at <= closed for at in delivered), "an event was delivered after close()"


def test_uvicorn_stops_on_sigterm_with_streams_open(server_only, backend, namespace):
    """docs/EVENTS.md's recipe (tests/integration/shutdown_app.py) under uvicorn: two watch()
    streams open, SIGTERM; the process exits within a bound, and each stream ends cleanly."""
    import httpx

    port = free_port()
    env = {**os.environ, "KVSTORE_URL": _url(backend)}
    app = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.integration.shutdown_app:app",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/docs", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and app.poll() is None, "uvicorn did not start"
                time.sleep(0.1)
        ended: list[str] = []

        def stream(thread_id: str) -> None:
            url = f"http://127.0.0.1:{port}/threads/{thread_id}/events"
            with httpx.stream("GET", url, timeout=30) as response:
                for _ in response.iter_lines():
                    pass
            ended.append(thread_id)

        readers = [threading.Thread(target=stream, args=(f"t{i}",)) for i in range(2)]
        for reader in readers:
            reader.start()
        time.sleep(1.0)  # both streams open, their watchers blocked in XREAD BLOCK
        started = time.monotonic()
        app.send_signal(signal.SIGTERM)
        code = app.wait(timeout=10)
        took = time.monotonic() - started
        for reader in readers:
            reader.join(5)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
        log = app.stderr.read().decode() if app.stderr else ""
        if app.stderr:
            app.stderr.close()
    print(f"\nuvicorn [{backend}] exited {took:.2f} s after SIGTERM with 2 streams open")
    # uvicorn shuts down, then raises the signal it caught again: the exit is SIGTERM's.
    assert code == -signal.SIGTERM, log
    assert "Application shutdown complete." in log and "Traceback" not in log, log
    assert took < 5
    assert sorted(ended) == ["t0", "t1"]
