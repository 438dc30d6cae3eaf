"""The live tail across processes and failures: every event of concurrent producers reaches a
consumer in another process once, in order; a consumer cut off at random points resumes with no
gap and no repeat; a server killed with -9 (AOF always) mid-stream loses no acknowledged write's
event."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time

import pytest

from kvstore import MessageStore, StoreConfig, UserMessage, errors
from kvstore.cli.process import aof
from kvstore.events import MessagesAdded

from ..reliability.support import dedicated_server, server_kinds
from ..support import watch_workers

PRODUCERS, EACH = 4, 60


def test_a_consumer_in_another_process_sees_every_event_of_four_producers_once(
    server_only, server, namespace
):
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    consumer = spawn.Process(
        target=watch_workers.consume, args=(server.url, namespace, "t", PRODUCERS * EACH, out)
    )
    consumer.start()
    producers = [
        spawn.Process(target=watch_workers.produce, args=(server.url, namespace, "t", w, EACH))
        for w in range(PRODUCERS)
    ]
    for p in producers:
        p.start()
    for p in producers:
        p.join(120)
        assert p.exitcode == 0
    seen = out.get(timeout=120)
    consumer.join(30)
    assert consumer.exitcode == 0
    # One event per append, numbered 1, 2, 3 ... with no gap; the messages in sequence order.
    assert [int(cursor.split("-")[0]) for cursor, _ in seen] == list(range(1, PRODUCERS * EACH + 1))
    messages = [m for _, batch in seen for m in batch]
    assert [seq for seq, _ in messages] == list(range(1, PRODUCERS * EACH + 1))
    assert sorted(otid for _, otid in messages) == sorted(
        f"w{w}-{k}" for w in range(PRODUCERS) for k in range(EACH)
    )
    # Each producer's messages in the order it sent them.
    for w in range(PRODUCERS):
        assert [otid for _, otid in messages if otid.startswith(f"w{w}-")] == [
            f"w{w}-{k}" for k in range(EACH)
        ]


def test_a_consumer_cut_off_at_random_points_resumes_with_no_gap_and_no_repeat(
    server_only, server, namespace
):
    spawn = multiprocessing.get_context("spawn")
    producers = [
        spawn.Process(target=watch_workers.produce, args=(server.url, namespace, "t", w, EACH))
        for w in range(PRODUCERS)
    ]
    for p in producers:
        p.start()
    rng = random.Random(16)
    received: list[tuple[int, str]] = []
    cursor: str | int = "0-0"
    deadline = time.monotonic() + 120
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as store:
        thread = store.thread("t")
        while len(received) < PRODUCERS * EACH and time.monotonic() < deadline:
            # Each connection takes a few events, then goes away; the next resumes after the last
            # one taken, by its cursor or (now and then) by the last sequence received.
            with thread.watch(after=cursor, block_ms=300) as events:
                cut = rng.randint(1, 7)
                for taken, event in enumerate(events, 1):
                    received += [(m.seq_id, m.otid) for m in event.messages]
                    cursor = event.cursor
                    if taken == cut or len(received) >= PRODUCERS * EACH:
                        break
            if received and rng.random() < 0.2:
                cursor = received[-1][0]
    for p in producers:
        p.join(120)
        assert p.exitcode == 0
    assert [seq for seq, _ in received] == list(range(1, PRODUCERS * EACH + 1))
    assert len({otid for _, otid in received}) == PRODUCERS * EACH


@pytest.mark.parametrize("kind", server_kinds())
def test_a_server_killed_mid_stream_loses_no_acknowledged_writes_event(kind):
    with dedicated_server(kind, *aof("always")) as server:
        config = StoreConfig(namespace="k")
        acknowledged: list[str] = []
        received: list[tuple[int, str]] = []

        def produce():
            with MessageStore.from_url(server.url, config) as store:
                thread = store.thread("t")
                for k in range(300):
                    message = UserMessage(content=f"m{k}", otid=f"o{k}")
                    while True:
                        try:
                            thread.append(message)  # the same otid again after a failure: a replay
                            break
                        except (errors.ConnectionFailed, errors.OutcomeUnknown, errors.ServerError):
                            time.sleep(0.05)
                    acknowledged.append(message.otid)

        def consume():
            cursor: str | int = "0-0"
            deadline = time.monotonic() + 120
            with MessageStore.from_url(server.url, config) as store:
                thread = store.thread("t")
                # The watcher stops at the 300th message: an event can arrive before its append's
                # acknowledgement is counted, and the stream then stays quiet for good.
                while len(received) < 300 and time.monotonic() < deadline:
                    try:
                        with thread.watch(after=cursor, block_ms=300) as events:
                            for event in events:
                                assert isinstance(event, MessagesAdded)
                                received.extend((m.seq_id, m.otid) for m in event.messages)
                                cursor = event.cursor
                                if len(received) >= 300:
                                    break
                    except (errors.ConnectionFailed, errors.ServerError, errors.OutcomeUnknown):
                        time.sleep(0.05)  # the server is down: resume from the last cursor

        producer = threading.Thread(target=produce, daemon=True)
        consumer = threading.Thread(target=consume, daemon=True)
        producer.start()
        consumer.start()
        while len(acknowledged) < 100:
            time.sleep(0.005)
        server.restart()  # SIGKILL mid-stream, then the same port and data dir
        producer.join(120)
        consumer.join(120)
        assert not producer.is_alive() and not consumer.is_alive()
        assert len(acknowledged) == 300
        assert [seq for seq, _ in received] == list(range(1, 301))
        assert [otid for _, otid in received] == acknowledged
