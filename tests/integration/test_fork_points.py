"""A fork's point is fixed once the fork is finished: the same call again is a replay, a call
with another point (or from another thread) into it is refused and writes nothing."""

from __future__ import annotations

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
