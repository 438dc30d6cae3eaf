"""A pooled connection the server closed before a call was sent on it (a restart, a failover, an
idle timeout): an idempotent call is sent again once, on a fresh connection, and goes through;
another call keeps its typed error (docs/RELIABILITY.md, "A stale pooled connection").

The server is restarted on its port with the store's one pooled connection open. The sync
client's pool sees the closed socket before it hands the connection out and reconnects; the
asyncio client sends on it, and the first read finds it closed ("Connection closed by server").
"""

from __future__ import annotations

import pytest

from kvstore import StoreConfig, UserMessage, errors

from .support import dedicated_server, fresh_namespace, thread_in_mode

PERSISTENT = ("--appendonly", "yes", "--appendfsync", "always")


def _idempotent_calls(thread) -> dict:
    return {
        "append": lambda: thread.append(UserMessage(content="plain")),
        "append with otids": lambda: thread.append(
            [UserMessage(content="a", otid="o-a"), UserMessage(content="b", otid="o-b")]
        ),
        "start_turn": lambda: thread.start_turn("turn-1"),
        "append to the turn": lambda: thread.append(
            UserMessage(content="in turn"), turn_id="turn-1"
        ),
        "finish_turn": lambda: thread.finish_turn("turn-1"),
        "compact": lambda: thread.compact("so far", 2),
        "list": lambda: thread.list(limit=5),
        "get_by_otid": lambda: thread.get_by_otid("o-a"),
        "context": thread.context,
        "stats": thread.stats,
        "snapshot": thread.snapshot,
    }


def test_after_a_restart_each_idempotent_call_goes_through(kind, mode):
    with dedicated_server(kind, *PERSISTENT) as server:
        config = StoreConfig(namespace=fresh_namespace())
        with thread_in_mode(mode, server.url, config, "restarted") as thread:
            thread.append(UserMessage(content="before"))
            failures = []
            for name, call in _idempotent_calls(thread).items():
                server.restart()  # the pooled connection is now closed by the server
                try:
                    call()
                except errors.KVStoreError as exc:
                    failures.append(f"{name}: {type(exc).__name__}: {exc}")
            stored = [m.content for m in thread.iter() if m.message_type == "user_message"]
    print(
        f"\n{len(_idempotent_calls(thread))} calls, each after a restart [{kind}, {mode}]: {failures}"
    )
    assert not failures, "\n".join(failures)
    assert stored == ["before", "plain", "a", "b", "in turn"], stored


@pytest.mark.parametrize("mode", ["async"])
def test_after_a_restart_a_call_that_is_not_idempotent_keeps_its_error(kind, mode):
    """delete sent again after it ran is not a replay (it would delete what was written in
    between): it is not re-sent, and the caller gets OutcomeUnknown as before. (replace and
    remove_turn start with a migration step, which is re-sent: their own call then goes out on
    a fresh connection.)"""
    with dedicated_server(kind, *PERSISTENT) as server:
        config = StoreConfig(namespace=fresh_namespace())
        with thread_in_mode(mode, server.url, config, "kept") as thread:
            thread.append(UserMessage(content="first"))
            server.restart()
            with pytest.raises(errors.OutcomeUnknown):
                thread.delete()
            # The next call opens a fresh connection and goes through.
            thread.delete()
            assert list(thread.iter()) == []
