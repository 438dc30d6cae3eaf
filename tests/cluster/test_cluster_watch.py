"""The live tail on a 3-primary cluster: a thread's event stream lives in its slot, and a watcher
(sync and async, each on its own connection to the slot's primary) gets every event of threads
on each primary, in order, through RedisCluster clients."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
from redis.crc import key_slot

from kvstore import (
    AssistantMessage,
    AsyncMessageStore,
    MessageStore,
    StoreConfig,
    UserMessage,
    errors,
)
from kvstore._engine import watch_recovery

from .harness import thread_ids_on_each_primary

KINDS = ["turn_started", "messages_added", "delta", "delta", "messages_added", "turn_finished"]


def test_a_sync_watcher_follows_threads_on_each_primary(cluster, namespace):
    store = MessageStore(cluster.client(), StoreConfig(namespace=namespace))
    for owner, thread_id in thread_ids_on_each_primary(cluster, "watched"):
        thread = store.thread(thread_id)
        events = []
        watch = thread.watch(after="0-0", block_ms=500)

        def consume(watch=watch, events=events):
            for event in watch:
                events.append(event)
                if event.kind == "turn_finished":
                    return

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        lease = thread.hold_turn("turn-1")
        thread.append(UserMessage(content="hi"), turn_id=lease)
        thread.publish(lease, "hel")
        thread.publish(lease, "lo")
        thread.append(AssistantMessage(content="hello"), turn_id=lease)
        thread.finish_turn(lease)
        reader.join(20)
        watch.close()
        assert [e.kind for e in events] == KINDS, owner.name
        assert [m.content for e in events if e.kind == "messages_added" for m in e.messages] == [
            "hi",
            "hello",
        ]
        # The stream is in the thread's slot, on the primary that owns it.
        slot = key_slot(thread.keys.meta.encode())
        assert key_slot(thread.keys.events.encode()) == slot
        assert cluster.owner(slot) is owner
        assert owner.admin.exists(thread.keys.events) == 1
    store.close()


def test_an_async_watcher_follows_threads_on_each_primary(cluster, namespace):
    async def main():
        store = AsyncMessageStore(cluster.async_client(), StoreConfig(namespace=namespace))
        results = []
        for owner, thread_id in thread_ids_on_each_primary(cluster, "awatched"):
            thread = store.thread(thread_id)
            await thread.append(UserMessage(content="first"))
            events = []

            async def consume(thread=thread, events=events):
                async with thread.watch(after=1, block_ms=500) as watch:
                    async for event in watch:
                        events.append(event)
                        if event.kind == "turn_finished":
                            return

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.2)
            lease = await thread.hold_turn("turn-1")
            await thread.append(UserMessage(content="hi"), turn_id=lease)
            await thread.publish(lease, "hel")
            await thread.publish(lease, "lo")
            await thread.append(AssistantMessage(content="hello"), turn_id=lease)
            await thread.finish_turn(lease)
            await asyncio.wait_for(task, 20)
            results.append((owner.name, [e.kind for e in events]))
        await store.close()
        return results

    for name, kinds in asyncio.run(main()):
        assert kinds == KINDS, name


# ------------------------------------------------------------------ following the topology
#
# A store used only for watching (as an SSE worker's) follows a thread while another store
# appends; the thread's slot moves to another primary, its primary fails over or is killed, with
# the watcher blocked on it. The watcher must deliver every message once, in order, with no error.

HALF = 10  # messages appended before the disruption, and as many after it


class _Watcher:
    """A watch-only store's watcher of `thread_id` (sync, or asyncio on a loop of its own), in a
    thread of its own: the contents delivered, when each came, and the error that ended it."""

    def __init__(self, cluster, namespace, thread_id, mode, expected, block_ms=2000):
        self.contents: list[str] = []
        self.times: list[float] = []
        self.error: BaseException | None = None
        self._args = (cluster, StoreConfig(namespace=namespace), thread_id, expected, block_ms)
        target = self._sync if mode == "sync" else lambda: asyncio.run(self._async())
        self._thread = threading.Thread(target=self._guard(target), daemon=True)
        self._thread.start()

    def _guard(self, target):
        def run():
            try:
                target()
            except BaseException as exc:
                self.error = exc

        return run

    def _take(self, event) -> bool:
        if event.kind == "messages_added":
            for message in event.messages:
                self.contents.append(message.content)
                self.times.append(time.monotonic())
        return len(self.contents) >= self._args[3]

    def _sync(self):
        cluster, config, thread_id, _, block_ms = self._args
        store = self.store = MessageStore(cluster.client(), config)
        with store.thread(thread_id).watch(after=0, block_ms=block_ms) as watch:
            for event in watch:
                if self._take(event):
                    break

    async def _async(self):
        cluster, config, thread_id, _, block_ms = self._args
        store = self.store = AsyncMessageStore(cluster.async_client(), config)
        self.loop = asyncio.get_running_loop()
        try:
            async with store.thread(thread_id).watch(after=0, block_ms=block_ms) as watch:
                async for event in watch:
                    if self._take(event):
                        break
        finally:
            await store.close()

    def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.contents) < count and self.error is None and self._thread.is_alive():
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def close_store(self) -> None:
        """Closes the watcher's store from this thread (as a server shutting down does)."""
        if isinstance(self.store, MessageStore):
            self.store.close()
        else:
            asyncio.run_coroutine_threadsafe(self.store.close(), self.loop).result(10)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


def _append(thread, i: int) -> None:
    """Appends message i (its otid makes a re-send after a lost reply harmless)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            thread.append(UserMessage(content=f"m{i}", otid=f"otid-{i}"))
            return
        except errors.OtidRepeated:
            return
        except errors.KVStoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _disrupted_watch(fresh_cluster, namespace, mode, disrupt) -> dict:
    """HALF messages, the watcher caught up and blocked; `disrupt(cluster, owner, slot)`; HALF
    more. Returns figures; asserts every message came once, in order, and no error."""
    cluster = fresh_cluster(primaries=3, replicas=1)
    owner, thread_id = thread_ids_on_each_primary(cluster, "followed")[0]
    writer = MessageStore(cluster.client(), StoreConfig(namespace=namespace, **DURABLE))
    thread = writer.thread(thread_id)
    watcher = _Watcher(cluster, namespace, thread_id, mode, 2 * HALF)
    for i in range(HALF):
        _append(thread, i)
    watcher.wait_for(HALF, 20)
    assert watcher.error is None and len(watcher.contents) == HALF, watcher.error
    time.sleep(0.2)  # the watcher is blocked on the thread's primary again
    started = time.monotonic()
    disrupt(cluster, owner, key_slot(thread.keys.meta.encode()))
    agreed = time.monotonic()
    writer.close()  # the killed primary's replica has none of its own now: plain writes go on
    writer = MessageStore(cluster.client(), StoreConfig(namespace=namespace))
    thread = writer.thread(thread_id)
    acked = []
    for i in range(HALF, 2 * HALF):
        _append(thread, i)
        acked.append(time.monotonic())
    watcher.wait_for(2 * HALF, 30)
    watcher.join(5)
    writer.close()
    assert watcher.error is None, repr(watcher.error)
    assert watcher.contents == [f"m{i}" for i in range(2 * HALF)]
    return {
        "disruption_s": round(agreed - started, 3),
        "first_after_s": round(watcher.times[HALF] - agreed, 3),
        "first_latency_s": round(watcher.times[HALF] - acked[0], 3),
        "delivered": len(watcher.contents),
    }


# Acknowledged only once the replica has it: a kill -9 loses none of them.
DURABLE = dict(durability="replicated", durability_timeout_ms=2000)


def _move(cluster, owner, slot):
    target = next(node for node in cluster.primaries() if node is not owner)
    cluster.migrate_slot(slot, target)


def _failover(cluster, owner, slot):
    cluster.failover(cluster.replicas_of(owner)[0])


def _kill(cluster, owner, slot):
    cluster.kill(owner)
    cluster.wait_healthy(dead=(owner,))


@pytest.mark.parametrize("disrupt", [_move, _failover, _kill], ids=["move", "failover", "kill"])
def test_a_watch_only_store_follows_the_thread_across_the_topology(
    fresh_cluster, namespace, mode, disrupt
):
    figures = _disrupted_watch(fresh_cluster, namespace, mode, disrupt)
    print(f"\n{mode} {disrupt.__name__}: {figures}")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_watcher_of_an_unreachable_cluster_raises_a_kvstore_error_within_the_bound(
    fresh_cluster, namespace, mode, monkeypatch
):
    monkeypatch.setattr(watch_recovery, "RECOVERY_SECONDS", 2.0)
    cluster = fresh_cluster(primaries=3, replicas=0)
    _, thread_id = thread_ids_on_each_primary(cluster, "lost")[0]
    writer = MessageStore(cluster.client(), StoreConfig(namespace=namespace))
    _append(writer.thread(thread_id), 0)
    watcher = _Watcher(cluster, namespace, thread_id, mode, 2)
    watcher.wait_for(1, 20)
    time.sleep(0.2)
    started = time.monotonic()
    for node in cluster.nodes:
        cluster.kill(node)
    watcher.join(15)
    elapsed = time.monotonic() - started
    print(f"\n{mode}: raised {type(watcher.error).__name__} after {elapsed:.2f}s")
    assert isinstance(watcher.error, errors.ConnectionFailed), repr(watcher.error)
    assert not isinstance(watcher.error, redis.RedisError)
    assert 1.5 < elapsed < 6


@pytest.mark.parametrize("disrupt", [_move, _failover], ids=["move", "failover"])
def test_a_watcher_follows_the_thread_while_appends_go_on_during_the_change(
    fresh_cluster, namespace, mode, disrupt
):
    """The same, with the writer appending all along (every 20 ms), through the change."""
    cluster = fresh_cluster(primaries=3, replicas=1)
    owner, thread_id = thread_ids_on_each_primary(cluster, "busy")[0]
    writer = MessageStore(cluster.client(), StoreConfig(namespace=namespace))
    thread = writer.thread(thread_id)
    total = 4 * HALF
    watcher = _Watcher(cluster, namespace, thread_id, mode, total)

    def append_all():
        for i in range(total):
            _append(thread, i)
            time.sleep(0.02)

    appender = threading.Thread(target=append_all, daemon=True)
    appender.start()
    watcher.wait_for(HALF // 2, 20)
    disrupt(cluster, owner, key_slot(thread.keys.meta.encode()))
    appender.join(40)
    watcher.wait_for(total, 30)
    watcher.join(5)
    writer.close()
    assert watcher.error is None, repr(watcher.error)
    assert watcher.contents == [f"m{i}" for i in range(total)]
    gaps = [b - a for a, b in zip(watcher.times, watcher.times[1:], strict=False)]
    print(f"\n{mode} {disrupt.__name__} with appends: longest gap {max(gaps):.3f}s")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_closing_the_store_ends_a_watcher_looking_for_its_primary_at_once(
    fresh_cluster, namespace, mode
):
    cluster = fresh_cluster(primaries=3, replicas=0)
    _, thread_id = thread_ids_on_each_primary(cluster, "closed")[0]
    writer = MessageStore(cluster.client(), StoreConfig(namespace=namespace))
    _append(writer.thread(thread_id), 0)
    watcher = _Watcher(cluster, namespace, thread_id, mode, 2)
    watcher.wait_for(1, 20)
    for node in cluster.nodes:
        cluster.kill(node)
    time.sleep(1.5)  # the watcher is between attempts (30 s allowed)
    assert watcher.running and watcher.error is None
    started = time.monotonic()
    watcher.close_store()
    watcher.join(5)
    elapsed = time.monotonic() - started
    print(f"\n{mode}: ended {elapsed:.3f}s after its store's close()")
    assert not watcher.running and watcher.error is None, repr(watcher.error)
    assert elapsed < 1.5
