"""The live tail on a 3-primary cluster: a thread's event stream lives in its slot, and a watcher
(sync and async, each on its own connection to the slot's primary) gets every event of threads
on each primary, in order, through RedisCluster clients."""

from __future__ import annotations

import asyncio
import threading

from redis.crc import key_slot

from kvstore import AssistantMessage, AsyncMessageStore, MessageStore, StoreConfig, UserMessage

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
