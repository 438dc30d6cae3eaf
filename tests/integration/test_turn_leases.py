"""hold_turn() and publish() sent again are replays, and every event's cursor names the thread's
last sequence when it was written (a take-over's TurnStarted too)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from kvstore import AssistantMessage, MessageStore, StoreConfig, UserMessage, errors
from kvstore._engine import core
from kvstore._engine.executor import send_request
from kvstore.events import MessagesAdded, TurnStarted

from ..conftest import make_async_store, make_sync_store
from ..reliability.support import dedicated_server, server_kinds


def _inner(thread):
    """The Thread or AsyncThread behind make_thread's facade."""
    return getattr(thread, "_thread", thread)


def _request(operation):
    """The first (here: only) script call an operation sends, as made once by the client."""
    return next(operation)


def _send(thread, request):
    """Sends one request as it is, as redis-py does when it sends a command again."""
    result = send_request(_inner(thread)._store, request)
    return thread._loop.run_until_complete(result) if hasattr(result, "__await__") else result


def _events(raw_client, thread) -> list[tuple[str, dict]]:
    return [
        (i.decode(), {k.decode(): v for k, v in f.items()})
        for i, f in raw_client.xrange(thread.keys.events)
    ]


def _kinds(raw_client, thread) -> list[str]:
    return [fields["k"].decode() for _, fields in _events(raw_client, thread)]


def test_a_hold_sent_again_is_a_replay_not_a_second_lease(make_thread, raw_client):
    thread = make_thread()
    request = _request(core.hold_turn(_inner(thread)._ref, "turn-1"))
    first = _send(thread, request)
    again = _send(thread, request)
    assert [int(x) for x in again] == [int(x) for x in first] == [1, 1]
    assert _kinds(raw_client, thread) == ["turn_started"]
    # The caller's lease is still the turn's: its writes go through.
    lease = thread.hold_turn("turn-1")
    assert lease.lease == 2
    assert _kinds(raw_client, thread) == ["turn_started", "turn_started"]


def test_a_first_attempt_run_after_its_retry_and_a_take_over_fences_no_one(make_thread, raw_client):
    """redis-py sent the hold twice; the retry ran, another worker took the turn over, then the
    first attempt ran: it answers the retry's lease, and takes none from the new holder."""
    thread = make_thread()
    request = _request(core.hold_turn(_inner(thread)._ref, "turn-1"))
    mine = _send(thread, request)
    theirs = thread.hold_turn("turn-1")
    late = _send(thread, request)
    assert int(late[1]) == int(mine[1]) == 1 and theirs.lease == 2
    thread.publish(theirs, "still mine")
    thread.append(AssistantMessage(content="reply"), turn_id=theirs)
    assert thread.finish_turn(theirs).reply_count == 1
    # Once the turn is finished, the hold sent again still answers what it answered.
    assert [int(x) for x in _send(thread, request)] == [1, 1]
    assert _kinds(raw_client, thread).count("turn_started") == 2


def test_a_caller_retrying_with_its_call_id_holds_and_publishes_once(make_thread, raw_client):
    thread = make_thread()
    lease = thread.hold_turn("turn-1", call_id="request-7:hold")
    assert thread.hold_turn("turn-1", call_id="request-7:hold") == lease
    cursor = thread.publish(lease, "Hel", call_id="request-7:delta-1")
    assert thread.publish(lease, "Hel", call_id="request-7:delta-1") == cursor
    assert thread.publish(lease, "lo", call_id="request-7:delta-2") != cursor
    assert _kinds(raw_client, thread) == ["turn_started", "delta", "delta"]
    for bad in ("", "a\tb", "x" * 257):
        with pytest.raises(errors.InvalidMessage):
            thread.publish(lease, "x", call_id=bad)
        with pytest.raises(errors.InvalidMessage):
            thread.hold_turn("turn-1", call_id=bad)
    assert len(_events(raw_client, thread)) == 3


def test_a_publish_sent_again_is_a_replay_even_once_the_turn_is_finished(make_thread, raw_client):
    thread = make_thread()
    lease = thread.hold_turn("turn-1")
    request = _request(core.publish(_inner(thread)._ref, lease, "Hel"))
    first = _send(thread, request)
    assert _send(thread, request) == first
    thread.finish_turn(lease)
    with pytest.raises(errors.TurnFinished):  # a finished turn refuses a new hold and delta...
        thread.hold_turn("turn-1")
    with pytest.raises(errors.TurnFinished):
        thread.publish(lease, "lo")
    assert _send(thread, request) == first  # ... but the delta sent again answers as it did
    assert _kinds(raw_client, thread) == ["turn_started", "delta", "turn_finished"]


def test_the_calls_a_turn_remembers_are_bounded(make_thread, raw_client):
    thread = make_thread()
    lease = thread.hold_turn("turn-1")
    for i in range(40):
        thread.publish(lease, f"d{i}", call_id=f"c{i}")
    remembered = raw_client.hget(thread.keys.turns, "turn-1\tdeltas")
    assert (
        remembered.count(b"\n") == 8 and b"\nc39\t" in remembered and b"\nc31\t" not in remembered
    )
    thread.publish(lease, "d39", call_id="c39")
    assert _kinds(raw_client, thread).count("delta") == 40


# ------------------------------------------------------------- each event's cursor


def _last_seq(raw_client, thread) -> int:
    return int(raw_client.hget(thread.keys.meta, "last_seq") or 0)


def test_a_take_overs_turn_started_names_the_threads_last_sequence(make_thread, raw_client):
    thread = make_thread(window_size=4, chunk_size=2)
    thread.append(UserMessage(content="question"), turn_id="turn-1")
    first = thread.hold_turn("turn-1")
    for i in range(5):
        thread.append(AssistantMessage(content=f"reply {i}"), turn_id=first)
    taken = thread.hold_turn("turn-1")  # another worker takes the turn over
    ((cursor, fields),) = _events(raw_client, thread)[-1:]
    assert fields["k"] == b"turn_started" and taken.lease == 2
    assert cursor.split("-")[1] == "6" == str(_last_seq(raw_client, thread))


def test_every_event_names_the_threads_last_sequence_when_it_was_written(make_thread, raw_client):
    """Each kind of write, and the stream's newest entry after it: its sequence is last_seq."""
    thread = make_thread(window_size=4, chunk_size=2, retained_message_limit=2)
    seen = []

    def check(name: str) -> None:
        cursor = _events(raw_client, thread)[-1][0]
        seen.append((name, int(cursor.split("-")[1]), _last_seq(raw_client, thread)))

    thread.append(UserMessage(content="q"), turn_id="t")
    check("append")
    thread.start_turn("t")
    check("start_turn")
    stored = thread.append([AssistantMessage(content=f"r{i}") for i in range(3)], turn_id="t")
    lease = thread.hold_turn("t")
    check("hold_turn")
    thread.publish(lease, "delta")
    check("publish")
    thread.finish_turn(lease)
    check("finish_turn")
    thread.replace(stored[0].id, AssistantMessage(content="again"))
    check("replace")
    thread.append(UserMessage(content="q2"), turn_id="u")
    thread.start_turn("u")
    thread.append(AssistantMessage(content="u1"), turn_id="u")
    thread.remove_turn("u")
    check("remove_turn")
    thread.compact("summary", last_sequence=4)
    check("compact")
    assert all(s == last for _, s, last in seen), seen


@pytest.mark.parametrize("trimmed", [False, True])
def test_a_watcher_resuming_from_a_take_overs_cursor_gets_no_message_again(
    server_only, backend, namespace, raw_client, trimmed
):
    store = make_sync_store(backend, StoreConfig(namespace=namespace))
    thread = store.thread("t")
    thread.append(UserMessage(content="question"), turn_id="turn-1")
    first = thread.hold_turn("turn-1")
    for i in range(5):
        thread.append(AssistantMessage(content=f"reply {i}"), turn_id=first)
    thread.hold_turn("turn-1")
    cursor = _events(raw_client, thread)[-1][0]
    late = thread.append(AssistantMessage(content="after the take-over"), turn_id="turn-1")
    if trimmed:
        # The stream lost every event after the cursor's up to a delta's: the watcher pages the
        # messages after the cursor's sequence, then goes on.
        thread.publish("turn-1", "more")
        raw_client.xtrim(
            thread.keys.events, minid=_events(raw_client, thread)[-1][0], approximate=False
        )
    with thread.watch(after=cursor, block_ms=200) as watch:
        event = next(iter(watch))
    assert isinstance(event, MessagesAdded)
    assert [m.seq_id for m in event.messages] == [late[0].seq_id]
    assert not isinstance(event, TurnStarted)
    store.close()


# ------------------------------------------------- timed out, cut off, and sent again


def _asleep(port: int) -> None:
    """Puts the server to sleep for 300 ms, and returns once it is asleep (a PING times out)."""
    sleeper = redis.Redis(port=port, single_connection_client=True)
    sleeper.connection.send_command("DEBUG", "SLEEP", "0.3")
    probe = redis.Redis(port=port, socket_timeout=0.02, retry=None)
    for _ in range(1000):
        try:
            probe.ping()
        except redis.TimeoutError:
            return
    raise AssertionError("the server did not go to sleep")


@pytest.mark.parametrize("kind", server_kinds())
def test_a_hold_and_a_publish_resent_by_redis_py_through_a_sleep_are_taken_once(kind):
    """A 50 ms socket timeout and redis-py's default retry: while the server sleeps, each call is
    sent several times, and every copy still in its socket runs when it wakes."""
    with dedicated_server(kind, "--enable-debug-command", "yes") as server:
        admin = redis.Redis(port=server.port)
        store = MessageStore(
            redis.Redis(port=server.port, socket_timeout=0.05), StoreConfig(namespace="n")
        )
        thread = store.thread("asleep")
        thread.start_turn("warm-up")  # loads the library
        sent = admin.info("stats")["total_connections_received"]
        answers = []
        for call in (lambda: thread.hold_turn("turn-1"), lambda: thread.publish("turn-1", "once")):
            _asleep(server.port)
            try:
                answers.append(call())
            except errors.OutcomeUnknown as unknown:
                answers.append(unknown.call_id)
        resent = admin.info("stats")["total_connections_received"] - sent
        assert resent >= 2, resent  # each call went out again, on a new connection
        assert _kinds(admin, thread) == ["turn_started", "turn_started", "delta"], answers
        assert admin.hget(thread.keys.turns, "turn-1\tlease") == b"1"
        store.close()


def test_calls_cut_off_at_every_await_and_sent_again_are_taken_once(
    server_only, backend, namespace, raw_client
):
    """An asyncio hold and publish cancelled after 0, 1, 2, ... turns of the event loop (before,
    while and after their command is sent), then sent again with the same call id; the last pair
    is cancelled only once it ended (a cancel that comes too late), whatever the machine's pace."""
    cuts, finished = 30, []

    async def cut_then_retry(call, cut: int | None):
        task = asyncio.create_task(call())
        if cut is None:
            for _ in range(5000):  # at most 5 s
                if task.done():
                    break
                await asyncio.sleep(0.001)
        for _ in range(cut or 0):
            await asyncio.sleep(0)
        task.cancel()
        try:
            first = await task
        except asyncio.CancelledError:
            first = None
        again = await call()
        assert first is None or again == first
        finished.append(first is not None)
        return again

    async def main():
        store = make_async_store(backend, StoreConfig(namespace=namespace))
        thread = store.thread("cut")
        leases = []
        for k, cut in enumerate([*range(cuts - 1), None]):
            lease = await cut_then_retry(
                lambda c=k: thread.hold_turn(f"turn-{c}", call_id=f"hold-{c}"), cut
            )
            await cut_then_retry(
                lambda c=k, lease=lease: thread.publish(lease, f"delta {c}", call_id=f"delta-{c}"),
                cut,
            )
            leases.append(lease)
        await store.close()
        return thread, leases

    thread, leases = asyncio.run(main())
    assert True in finished and False in finished  # cut off before the reply, and not
    assert [lease.lease for lease in leases] == [1] * cuts
    events = _events(raw_client, thread)
    assert [f["k"] for _, f in events] == [b"turn_started", b"delta"] * cuts
    assert [f["t"].decode() for _, f in events] == [
        f"turn-{k}" for k in range(cuts) for _ in range(2)
    ]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_take_over_catching_up_by_replays_keeps_its_lease(backend, namespace, mode):
    """A worker that takes a turn over re-sends what the first stored: each replay under its
    lease keeps the lease as any append under it does, so its next new reply is stored."""
    config = StoreConfig(namespace=namespace, turn_lease=1)
    replies = [AssistantMessage(content=f"part {i}", otid=f"r{i}") for i in range(4)]

    async def worker_b(thread) -> list[bool]:
        lease = await thread.hold_turn("turn-1")  # A's lease fenced: B takes over
        replayed = []
        for reply in replies:  # 4 x 0.4 s: past the 1 s lease unless the replays renew it
            await asyncio.sleep(0.4)
            replayed.append((await thread.append(reply, turn_id=lease)).replayed)
        await thread.append(AssistantMessage(content="new", otid="r4"), turn_id=lease)
        return replayed

    async def main() -> list[bool]:
        store = make_async_store(backend, config)
        thread = store.thread("t")
        lease = await thread.hold_turn("turn-1")
        await thread.append(replies, turn_id=lease)  # worker A stores them, then dies
        try:
            return await worker_b(thread)
        finally:
            await store.close()

    if mode == "sync":
        store = make_sync_store(backend, config)
        thread = store.thread("t")
        thread.append(replies, turn_id=thread.hold_turn("turn-1"))
        lease = thread.hold_turn("turn-1")
        replayed = []
        for reply in replies:
            time.sleep(0.4)
            replayed.append(thread.append(reply, turn_id=lease).replayed)
        thread.append(AssistantMessage(content="new", otid="r4"), turn_id=lease)
        contents = [m.content for m in thread.iter()]
        store.close()
    else:
        replayed = asyncio.run(main())
        store = make_sync_store(backend, config)
        contents = [m.content for m in store.thread("t").iter()]
        store.close()
    assert replayed == [True] * 4
    assert contents == [*(r.content for r in replies), "new"]
