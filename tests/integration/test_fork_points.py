"""A fork's point is fixed once the fork is finished: the same call again is a replay, a call
with another point (or from another thread) into it is refused and writes nothing. A fork
meeting another worker's appends still copies every message with its count."""

from __future__ import annotations

import threading
import time

import pytest

from kvstore import UserMessage, errors


def users(n: int, tag: str = "u") -> list[UserMessage]:
    return [UserMessage(content=f"{tag}{i}") for i in range(n)]


def thread_keys_dump(raw_client, thread):
    prefix = thread.keys.meta.rsplit(":", 1)[0]
    return {k: raw_client.dump(k) for k in raw_client.scan_iter(match=prefix + "*")}


def test_a_finished_fork_called_again_with_a_later_point_is_refused(make_thread, raw_client):
    thread = make_thread()
    stored = thread.append(users(12))
    fork = thread.fork("thread-2", at=5)
    before = thread_keys_dump(raw_client, fork)

    for at in (10, stored[9].id, 3):  # later, later by id, earlier
        with pytest.raises(
            errors.RestoreConflict, match="already a fork of thread-1 at sequence 5"
        ):
            thread.fork("thread-2", at=at)
        assert thread_keys_dump(raw_client, fork) == before

    # The same point, by sequence or by id, is a replay of the finished fork.
    assert thread.fork("thread-2", at=stored[4].id).stats().fork_sequence == 5
    assert thread.fork("thread-2", at=5).stats().stored_messages == 5
    assert thread_keys_dump(raw_client, fork) == before


def test_a_finished_fork_is_not_made_the_fork_of_another_thread(make_thread, raw_client):
    """A fork of the fork holds the same messages at the same sequences: forking it into the
    first fork would silently rewrite where that one came from."""
    thread = make_thread()
    thread.append(users(6))
    first = thread.fork("thread-2", at=4)
    first.fork("thread-3", at=4)
    before = thread_keys_dump(raw_client, first)
    with pytest.raises(errors.RestoreConflict, match="already a fork of thread-1"):
        make_thread("thread-3").fork("thread-2", at=4)
    assert thread_keys_dump(raw_client, first) == before
    assert first.stats().forked_from == "thread-1"


def test_a_fork_reads_its_counts_in_one_step_when_every_optimistic_read_meets_a_writer(
    make_thread, monkeypatch
):
    """The copy keeps each message's stored token count (read optimistically from the side
    infos); when every attempt meets a writer closing chunks, the counts come from one
    consistent read instead of failing the fork (here: no optimistic attempt at all)."""
    source = make_thread("source", chunk_size=4, window_size=4, retained_message_limit=None)
    for i in range(6):
        source.append([UserMessage(content=f"m{i}.{j} " + "x" * (10 * j)) for j in range(9)])
    whole = source.fork("whole", at=54)
    monkeypatch.setattr("kvstore._engine.layout.v2.OPTIMISTIC_READS", 0)
    one_step = source.fork("one-step", at=54)
    assert one_step.stats().tokens == whole.stats().tokens == source.stats().tokens
    assert [m.to_json() for m in one_step.list(limit=100).messages] == [
        m.to_json() for m in whole.list(limit=100).messages
    ]


@pytest.mark.parametrize("mode", ["sync"])
def test_forks_succeed_while_another_worker_appends(make_thread, backend, server_only):
    """Small chunks close every few appends: a fork (and its counts' read) meets them."""
    config = {"chunk_size": 4, "window_size": 4, "retained_message_limit": None}
    source = make_thread("busy", **config)
    for i in range(5):
        source.append([UserMessage(content=f"m{i}.{j} " + "x" * 100) for j in range(100)])
    writer = make_thread("busy", **config)
    stop = threading.Event()

    def append_until_stopped() -> None:
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            writer.append(UserMessage(content="new " + "y" * 100))

    worker = threading.Thread(target=append_until_stopped)
    worker.start()
    try:
        forks = [source.fork(f"copy-{k}", at=400) for k in range(8)]
    finally:
        stop.set()
        worker.join()
    for fork in forks:
        assert fork.stats().stored_messages == 400
