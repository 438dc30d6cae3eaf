"""A held turn that a newer turn started after ends when its producer does, as the current turn
does: a request whose worker died, then the user's next message, leaves no turn open forever
(docs/EVENTS.md, "Held turns end when their producer does")."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kvstore import AssistantMessage, StoreConfig, UserMessage, errors
from kvstore.events import TurnFinished

from ..conftest import make_async_store, make_sync_store

LEASE = 1  # seconds: the shortest turn_lease


def _abandoned(events) -> list[str]:
    return [e.turn_id for e in events if isinstance(e, TurnFinished) and e.outcome == "abandoned"]


def _assert_abandoned(thread, turn_id: str) -> None:
    with pytest.raises(errors.TurnFinished, match="abandoned"):
        thread.hold_turn(turn_id)  # a finished turn cannot be held again


def test_expire_turn_ends_a_superseded_turn_whose_lease_ended(make_thread):
    thread = make_thread("t", turn_lease=LEASE)
    dead = thread.hold_turn("turn-1")
    thread.append(AssistantMessage(content="half a rep"), turn_id=dead)  # then its worker died
    thread.append(UserMessage(content="hello?"))
    live = thread.hold_turn("turn-2")  # turn-1's lease has time left
    thread.append(AssistantMessage(content="whole reply"), turn_id=live)
    assert thread.finish_turn(live).outcome == "completed"
    assert thread.expire_turn() == "completed"  # the current turn; turn-1's lease runs on
    assert thread.hold_turn("turn-1").lease == dead.lease + 1  # still open: a retry takes it
    time.sleep(LEASE + 0.2)
    assert thread.expire_turn() == "completed"
    _assert_abandoned(thread, "turn-1")
    result = thread.finish_turn("turn-1")
    assert (result.outcome, result.reply_count) == ("abandoned", 1)


def test_a_new_turn_ends_the_current_one_whose_lease_ended(make_thread):
    thread = make_thread("t", turn_lease=LEASE)
    dead = thread.hold_turn("turn-1")
    thread.publish(dead, "Hel")
    time.sleep(LEASE + 0.2)
    thread.start_turn("turn-2")  # no watcher, no expire_turn: the new turn meets the old lease
    _assert_abandoned(thread, "turn-1")
    with pytest.raises(errors.TurnFenced, match="ended"):
        thread.publish(dead, "lo")


def test_a_superseded_turn_whose_producer_lives_on_is_not_ended(make_thread):
    thread = make_thread("t", turn_lease=LEASE)
    first = thread.hold_turn("turn-1")
    thread.hold_turn("turn-2")
    deadline = time.monotonic() + 2 * LEASE
    while time.monotonic() < deadline:  # turn-1's producer renews, turn-2's does not
        thread.append(AssistantMessage(content="more"), turn_id=first)
        assert thread.expire_turn("turn-1") == "open"
        thread.expire_turn()
        time.sleep(0.2)
    _assert_abandoned(thread, "turn-2")
    assert thread.finish_turn(first).outcome == "completed"


def test_superseded_turns_are_followed_in_bounded_state(make_thread, raw_client, namespace):
    thread = make_thread("t", turn_lease=LEASE)
    for k in range(12):  # each producer dies as the next turn starts
        thread.hold_turn(f"turn-{k}")
    time.sleep(LEASE + 0.2)
    thread.expire_turn()
    # The eight newest superseded turns are followed and ended; older ones wait for a call
    # naming them (docs/EVENTS.md), which ends them as well.
    for k in range(3, 11):
        _assert_abandoned(thread, f"turn-{k}")
    assert thread.expire_turn("turn-0") == "abandoned"
    meta = next(key for key in raw_client.scan_iter(f"{namespace}*") if key.endswith(b":meta"))
    assert raw_client.hget(meta, "older_turns") is None  # nothing left to follow


def test_a_sync_watcher_ends_a_superseded_dead_producers_turn(server_only, backend, namespace):
    store = make_sync_store(backend, StoreConfig(namespace=namespace, turn_lease=LEASE))
    thread = store.thread("t")
    dead = thread.hold_turn("turn-1")
    thread.append(AssistantMessage(content="half"), turn_id=dead)
    started = time.monotonic()
    done = thread.hold_turn("turn-2")
    thread.finish_turn(done)  # the current turn is finished; turn-1 is not
    got = []
    with thread.watch(block_ms=200) as watch:
        for event in watch:
            got.append(event)
            if _abandoned(got) or time.monotonic() - started > 10:
                break
    assert _abandoned(got) == ["turn-1"]
    assert LEASE - 0.05 <= time.monotonic() - started < LEASE + 3
    store.close()


def test_an_async_watcher_ends_superseded_and_current_dead_turns(server_only, backend, namespace):
    async def main():
        store = make_async_store(backend, StoreConfig(namespace=namespace, turn_lease=LEASE))
        thread = store.thread("t")
        await thread.publish(await thread.hold_turn("turn-1"), "Hel")
        await thread.publish(await thread.hold_turn("turn-2"), "Wor")  # both producers die
        got = []

        async def consume():
            async with thread.watch(block_ms=200) as events:
                async for event in events:
                    got.append(event)
                    if len(_abandoned(got)) == 2:
                        return

        await asyncio.wait_for(consume(), timeout=10)
        await store.close()
        return got

    assert sorted(_abandoned(asyncio.run(main()))) == ["turn-1", "turn-2"]


def test_a_watcher_of_a_busy_thread_ends_a_dead_producers_turn(server_only, backend, namespace):
    """Other writers keep the thread busy (the watcher is never quiet for block_ms): the dead
    producer's turn still ends within about turn_lease plus block_ms of its last call."""
    store = make_sync_store(backend, StoreConfig(namespace=namespace, turn_lease=LEASE))
    thread = store.thread("t")
    thread.publish(thread.hold_turn("turn-1"), "Hel")  # then its producer dies
    started = time.monotonic()
    stop = threading.Event()

    def chatter():  # a plain append every 0.3 s, shorter than block_ms
        while not stop.wait(0.3) and time.monotonic() - started < 8:
            thread.append(UserMessage(content="busy"))

    writer = threading.Thread(target=chatter)
    writer.start()
    got = []
    try:
        with thread.watch(block_ms=1000) as watch:
            for event in watch:
                got.append(event)
                if _abandoned(got) or time.monotonic() - started > 8:
                    break
    finally:
        stop.set()
        writer.join()
    assert _abandoned(got) == ["turn-1"]
    assert time.monotonic() - started < LEASE + 1 + 1.5
    store.close()
