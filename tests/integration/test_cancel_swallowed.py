"""A cancellation the client library swallows still ends the call (docs/RELIABILITY.md, "A
timed-out or interrupted append is a success or a safe re-send"): on Python 3.11 redis-py's
asyncio send awaits ``asyncio.wait_for``, which returns the result of a command whose bytes went
out as the cancellation came and drops the cancellation. kvstore's drivers raise it at the
step's end: the task ends cancelled, a retry is a replay, and a cancelled watcher's task ends."""

from __future__ import annotations

import asyncio

from kvstore import StoreConfig, UserMessage

from ..conftest import make_async_store


def test_a_call_cancelled_while_it_is_sent_ends_cancelled(backend, server_only, namespace):
    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace, turn_lease=30))
        thread = store.thread("t")
        await thread.append(UserMessage(content="first"))
        ran_on = []
        for k in range(10):
            for turns in (1, 2):
                task = asyncio.create_task(
                    thread.append(UserMessage(content=f"m{k}", otid=f"o{k}"))
                )
                for _ in range(turns):
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    await task
                    ran_on.append((k, turns))
                except asyncio.CancelledError:
                    pass
            # Re-sent as the caller holds it: stored once, whichever way the cut fell.
            await thread.append(UserMessage(content=f"m{k}", otid=f"o{k}"))
        assert ran_on == []
        contents = [m.content async for m in thread.iter()]
        assert contents == ["first", *(f"m{k}" for k in range(10))]

        async def producer(k: int) -> None:
            lease = await thread.hold_turn(f"turn-{k}")
            await thread.publish(lease, "never: the task was cancelled")

        for k in range(5):
            task = asyncio.create_task(producer(k))
            await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=3)
            assert done and task.cancelled(), k
        await store.close()

    asyncio.run(main())


def test_a_cancelled_watchers_task_ends(backend, server_only, namespace):
    async def main() -> None:
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        thread = store.thread("t")
        await thread.append(UserMessage(content="hi"))

        async def follow() -> None:
            async with thread.watch(after=0, block_ms=1000) as events:
                async for _ in events:
                    pass

        for turns in range(5):
            task = asyncio.create_task(follow())
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=3)
            assert done, f"the watcher's task ran on after its cancel ({turns} turns)"
            assert task.cancelled()
        await store.close()

    asyncio.run(main())
