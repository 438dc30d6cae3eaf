"""Closing a store ends its open watchers (docs/EVENTS.md, "Shutting down"): a watcher blocked in
its XREAD BLOCK right now stops within a bound, cleanly (the iteration ends, no error), and no
event is delivered after close() returns; sync and async, on each real server."""

from __future__ import annotations

import asyncio
import threading
import time

from kvstore import StoreConfig, UserMessage

from ..conftest import make_async_store, make_sync_store

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
