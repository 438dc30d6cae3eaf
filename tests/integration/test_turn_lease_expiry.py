"""A held turn's lease ends when its holder stops calling: the turn is finished as abandoned,
in the server's time, with its event, and the dead lease is fenced (StoreConfig.turn_lease)."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from kvstore import AssistantMessage, MessageStore, StoreConfig, UserMessage, errors
from kvstore.cli import backup
from kvstore.events import TurnFinished

from ..conftest import make_async_store, make_sync_store

LEASE = 1  # seconds: the shortest turn_lease


def _abandoned(events) -> list[TurnFinished]:
    return [e for e in events if isinstance(e, TurnFinished) and e.outcome == "abandoned"]


def test_an_unrenewed_lease_ends_and_the_turn_is_finished_as_abandoned(make_thread):
    thread = make_thread("t", turn_lease=LEASE)
    thread.append(UserMessage(content="question"))
    lease = thread.hold_turn("turn-1")
    thread.append(AssistantMessage(content="half a rep"), turn_id=lease)
    time.sleep(0.6)
    thread.renew_turn(lease)  # the heartbeat: the lease lasts LEASE again from here
    time.sleep(0.6)  # past the hold's first end, not the renewal's
    assert thread.expire_turn() == "open"
    assert thread.snapshot().turn.outcome == "open"
    time.sleep(0.6)
    assert thread.expire_turn() == "abandoned"
    assert thread.expire_turn("turn-1") == "abandoned"  # idempotent
    assert thread.snapshot().turn.outcome == "abandoned"
    # Every later call under the dead lease is fenced, and writes nothing.
    stored = thread.stats().stored_messages
    for call in (
        lambda: thread.append(AssistantMessage(content="late"), turn_id=lease),
        lambda: thread.publish(lease, "late"),
        lambda: thread.renew_turn(lease),
        lambda: thread.finish_turn(lease),
    ):
        with pytest.raises(errors.TurnFenced, match="ended"):
            call()
    assert thread.stats().stored_messages == stored
    # Its result counts what the producer stored; a finish without a lease reads it back.
    result = thread.finish_turn("turn-1")
    assert (result.outcome, result.reply_count) == ("abandoned", 1)
    # The thread goes on: the next turn is held and finished as usual.
    nxt = thread.hold_turn("turn-2")
    thread.append(AssistantMessage(content="whole reply"), turn_id=nxt)
    assert thread.finish_turn(nxt).outcome == "completed"


def test_the_first_call_under_an_ended_lease_finishes_the_turn_and_is_fenced(make_thread):
    thread = make_thread("t", turn_lease=LEASE)
    lease = thread.hold_turn("turn-1")
    thread.append(AssistantMessage(content="part"), turn_id=lease)
    time.sleep(LEASE + 0.2)
    # No watcher and no expire_turn: the late producer's own call meets the ended lease.
    with pytest.raises(errors.TurnFenced, match="ended"):
        thread.append(AssistantMessage(content="after the end"), turn_id=lease)
    assert thread.snapshot().turn.outcome == "abandoned"
    assert [m.content for m in thread.list().messages] == ["part"]


def test_calls_under_the_lease_renew_it(make_thread):
    thread = make_thread("t", turn_lease=LEASE)
    lease = thread.hold_turn("turn-1")
    deadline = time.monotonic() + 2.5 * LEASE
    sent = 0
    while time.monotonic() < deadline:  # bounded: 2.5 leases of calls 0.3 s apart
        time.sleep(0.3)
        if sent % 2:
            thread.publish(lease, f"delta {sent}")
        else:
            thread.append(AssistantMessage(content=f"part {sent}"), turn_id=lease)
        sent += 1
    assert thread.expire_turn() == "open"
    result = thread.finish_turn(lease)
    assert result.outcome == "completed" and result.reply_count == (sent + 1) // 2


def test_a_take_over_after_the_lease_ended_continues_the_turn(make_thread):
    thread = make_thread("t", turn_lease=LEASE)
    first = thread.hold_turn("turn-1")
    thread.append(AssistantMessage(content="first worker"), turn_id=first)
    time.sleep(LEASE + 0.2)
    # A retry of the request reaches another worker before anything ended the turn: it takes
    # the turn over with a fresh lease, and the first worker is fenced as by any take-over.
    second = thread.hold_turn("turn-1")
    assert second.lease == first.lease + 1
    with pytest.raises(errors.TurnFenced):
        thread.append(AssistantMessage(content="first again"), turn_id=first)
    thread.append(AssistantMessage(content="second worker"), turn_id=second)
    assert thread.finish_turn(second).reply_count == 2


def test_a_turn_started_without_a_hold_has_no_lease_to_end(make_thread):
    thread = make_thread("t", turn_lease=LEASE)
    thread.start_turn("turn-1")
    thread.append(AssistantMessage(content="unleased"), turn_id="turn-1")
    time.sleep(LEASE + 0.2)
    assert thread.expire_turn() == "open"
    with pytest.raises(errors.TurnNotFound):
        thread.expire_turn("never-started")
    assert make_thread("empty", turn_lease=LEASE).expire_turn() is None


def test_a_turn_lease_must_be_a_positive_number_of_seconds():
    for bad in (0, -1, 1.5, True, "60"):
        with pytest.raises(errors.ConfigError, match="turn_lease"):
            StoreConfig(turn_lease=bad)


def test_a_sync_watcher_of_a_quiet_thread_ends_a_dead_producers_turn(
    server_only, backend, namespace
):
    store = make_sync_store(backend, StoreConfig(namespace=namespace, turn_lease=LEASE))
    thread = store.thread("t")
    lease = thread.hold_turn("turn-1")
    started = time.monotonic()
    thread.append(AssistantMessage(content="half"), turn_id=lease)  # its last renewal
    got = []
    with thread.watch(block_ms=200) as watch:  # from now on
        for event in watch:  # nothing else writes: only the watcher can end the turn
            got.append(event)
            if _abandoned(got) or time.monotonic() - started > 10:
                break
    (finished,) = _abandoned(got)
    assert (finished.turn_id, finished.reply_count) == ("turn-1", 1)
    # Not before the lease's end (the server's ms, floored), nor long after it.
    assert LEASE - 0.01 <= time.monotonic() - started < LEASE + 3
    assert thread.snapshot().turn.outcome == "abandoned"
    store.close()


def test_an_async_watcher_of_a_quiet_thread_ends_a_dead_producers_turn(
    server_only, backend, namespace
):
    async def main():
        store = make_async_store(backend, StoreConfig(namespace=namespace, turn_lease=LEASE))
        thread = store.thread("t")
        lease = await thread.hold_turn("turn-1")
        await thread.publish(lease, "Hel")
        got = []

        async def consume():
            async with thread.watch(block_ms=200) as events:
                async for event in events:
                    got.append(event)
                    if _abandoned(got):
                        return

        await asyncio.wait_for(consume(), timeout=10)
        outcome = (await thread.snapshot()).turn.outcome
        await store.close()
        return got, outcome

    got, outcome = asyncio.run(main())
    assert [e.turn_id for e in _abandoned(got)] == ["turn-1"] and outcome == "abandoned"


PRODUCER = """
import sys, time
from kvstore import AssistantMessage, MessageStore, StoreConfig
store = MessageStore.from_url(sys.argv[1], config=StoreConfig(namespace=sys.argv[2], turn_lease=1))
thread = store.thread("t")
lease = thread.hold_turn("turn-1")
for i in range(1000):  # killed long before the end
    thread.append(AssistantMessage(content=f"token {i}"), turn_id=lease)
    if i == 3:
        print("streaming", flush=True)
    time.sleep(0.05)
"""


def test_a_killed_producers_turn_is_abandoned_for_every_watcher(
    server_only, backend, server, namespace
):
    store = make_sync_store(backend, StoreConfig(namespace=namespace, turn_lease=LEASE))
    thread = store.thread("t")
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, server.url, namespace],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert producer.stdout.readline().strip() == "streaming"
        os.kill(producer.pid, signal.SIGKILL)
    finally:
        producer.kill()
        producer.wait(timeout=10)
        producer.stdout.close()
    watchers = [thread.watch(after="0-0", block_ms=200) for _ in range(2)]
    seen = []
    for watch in watchers:
        with watch:
            events = []
            started = time.monotonic()
            for event in watch:
                events.append(event)
                if _abandoned(events) or time.monotonic() - started > 10:
                    break
            seen.append(events)
    stored = len(thread.list(limit=1000).messages)
    for events in seen:
        (finished,) = _abandoned(events)
        assert finished.reply_count == stored >= 4
    assert thread.snapshot().turn.outcome == "abandoned"
    store.close()


def test_an_abandoned_turn_is_backed_up_and_restored_as_abandoned(server_only, server, namespace):
    config = StoreConfig(namespace=namespace, turn_lease=LEASE)
    source = MessageStore.from_url(server.url, config)
    target = MessageStore.from_url(server.url, replace(config, namespace=namespace + "r"))
    thread = source.thread("chat")
    lease = thread.hold_turn("turn-1")
    thread.append(AssistantMessage(content="cut off"), turn_id=lease)
    time.sleep(LEASE + 0.2)
    assert thread.expire_turn() == "abandoned"
    out = io.StringIO()
    backup.export(source, "chat", out, progress_out=io.StringIO())
    progress = backup.ImportProgress()
    backup.import_lines(
        target, "chat", io.StringIO(out.getvalue()), progress, progress_out=io.StringIO()
    )
    restored = target.thread("chat")
    assert restored.snapshot().turn == thread.snapshot().turn
    assert restored.finish_turn("turn-1") == thread.finish_turn("turn-1")
    assert restored.finish_turn("turn-1").outcome == "abandoned"
    source.close()
    target.close()


def test_a_watcher_asks_again_only_when_a_lease_could_have_ended(
    server_only, backend, namespace, raw_client
):
    store = make_sync_store(backend, StoreConfig(namespace=namespace, turn_lease=60))
    thread = store.thread("t")
    thread.start_turn("unleased")  # open, and no lease to end
    held = store.thread("held")
    held.hold_turn("turn-1")  # open, its lease 60 s away

    def fcalls() -> int:
        return raw_client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0)

    for watched in (thread, held):
        before = fcalls()
        timer = threading.Timer(1.0, lambda w=watched: w.append(UserMessage(content="wake")))
        timer.start()
        with watched.watch(block_ms=100) as watch:  # about ten quiet periods, then the append
            next(watch)
        timer.join()
        # One expire_turn call (the first quiet period) and the append: not one per period.
        assert fcalls() - before == 2, watched
    store.close()
