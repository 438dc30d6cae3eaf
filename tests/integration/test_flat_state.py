"""Every piece of per-message and per-turn state goes with retention: a long run of each feature
(turns, held turns and their deltas, otids, strict history checks, turns without messages),
compacted as it goes with retention keeping the newest messages, holds its keys and every
hash's, set's and stream's size flat. KVSTORE_LONG=1 runs ten times as many turns."""

from __future__ import annotations

import os

import pytest

from kvstore import AssistantMessage, StoreConfig, ToolCallMessage, ToolReturnMessage, UserMessage

from ..conftest import make_sync_store
from ..support.layout_check import check_layout

TURNS = 3000 if os.environ.get("KVSTORE_LONG") == "1" else 300
COMPACT_EVERY = 10
CONFIG = dict(window_size=8, chunk_size=4, retained_message_limit=20, events_max_len=50)


def plain_turn(thread, i: int) -> None:
    thread.append(UserMessage(content=f"question {i}", otid=f"q{i}"), turn_id=f"t{i}")
    thread.start_turn(f"t{i}")
    thread.append(AssistantMessage(content=f"answer {i}", otid=f"a{i}"), turn_id=f"t{i}")
    thread.finish_turn(f"t{i}")


def held_turn(thread, i: int) -> None:
    thread.append(UserMessage(content=f"question {i}"), turn_id=f"t{i}")
    lease = thread.hold_turn(f"t{i}")
    thread.publish(lease, "ans")
    thread.publish(lease, "wer")
    thread.append(AssistantMessage(content=f"answer {i}"), turn_id=lease)
    thread.finish_turn(lease)


def taken_over_turn(thread, i: int) -> None:
    """A turn held twice (a worker takes over from one that hangs)."""
    thread.append(UserMessage(content=f"question {i}"), turn_id=f"t{i}")
    thread.publish(thread.hold_turn(f"t{i}"), "ans")
    lease = thread.hold_turn(f"t{i}")
    thread.append(AssistantMessage(content=f"answer {i}"), turn_id=lease)
    thread.finish_turn(lease)


def checked_turn(thread, i: int) -> None:
    call = {"name": "weather", "arguments": "{}", "tool_call_id": f"call-{i}"}
    thread.append(UserMessage(content=f"question {i}"), turn_id=f"t{i}")
    lease = thread.hold_turn(f"t{i}")
    thread.append(ToolCallMessage(tool_call=call), turn_id=lease)
    thread.append(
        ToolReturnMessage(status="success", tool_call_id=f"call-{i}", tool_return="4 °C"),
        turn_id=lease,
    )
    thread.append(AssistantMessage(content=f"answer {i}"), turn_id=lease)
    thread.finish_turn(lease)


def turn_without_messages(thread, i: int) -> None:
    """A turn cancelled before its first message, between two that store some."""
    lease = thread.hold_turn(f"cancelled-{i}")
    thread.publish(lease, "thinking")
    thread.finish_turn(lease, outcome="cancelled")
    thread.start_turn(f"started-{i}")
    thread.finish_turn(f"started-{i}", outcome="cancelled")
    plain_turn(thread, i)


FEATURES = {
    "turns and otids": (plain_turn, {}),
    "held turns and deltas": (held_turn, {}),
    "taken-over turns": (taken_over_turn, {}),
    "strict history checks": (checked_turn, dict(history_checks="strict")),
    "turns without messages": (turn_without_messages, {}),
}


def state(raw_client, thread, namespace: str) -> dict[str, int]:
    keys = thread.keys
    return {
        "keys": sum(1 for _ in raw_client.scan_iter(match=f"{namespace}:*", count=1000)),
        "meta fields": raw_client.hlen(keys.meta),
        "turns fields": raw_client.hlen(keys.turns),
        "turns bytes": sum(len(k) + len(v) for k, v in raw_client.hgetall(keys.turns).items()),
        "ids": raw_client.hlen(keys.ids),
        "otids": raw_client.hlen(keys.otids),
        "pairs": raw_client.zcard(keys.pairs),
        "window": raw_client.zcard(keys.window),
        "wside": raw_client.hlen(keys.window_side),
        "chunks": raw_client.zcard(keys.chunk_index),
        "stored": int(raw_client.hget(keys.meta, "stored") or 0),
    }


@pytest.mark.parametrize("feature", FEATURES)
def test_state_stays_flat_under_retention(server_only, backend, namespace, raw_client, feature):
    one_turn, extra = FEATURES[feature]
    config = StoreConfig(namespace=namespace, **CONFIG, **extra)
    store = make_sync_store(backend, config)
    thread = store.thread("long")
    measured = []
    for i in range(TURNS):
        one_turn(thread, i)
        if (i + 1) % COMPACT_EVERY == 0:
            thread.compact(f"summary {i}", last_sequence=thread.stats().next_sequence - 1)
            measured.append(state(raw_client, thread, namespace))
            assert raw_client.xlen(thread.keys.events) <= 2 * config.events_max_len + 100
    # The same phases of the run come round in its second quarter and its last: each count's
    # highest there is the same (a leak of one field per turn would add hundreds).
    quarter = len(measured) // 4
    early, late = measured[quarter : 2 * quarter], measured[-quarter:]
    growth = {
        name: (max(m[name] for m in early), max(m[name] for m in late)) for name in measured[0]
    }
    # Bytes may grow by the digits of growing sequences and ids, no more.
    assert all(
        high <= (low * 1.1 if "bytes" in name else low) for name, (low, high) in growth.items()
    ), growth
    assert growth["stored"][1] <= 40
    check_layout(raw_client, thread.keys, config)
    store.close()


def test_a_turn_finished_after_retention_took_its_messages_goes_with_the_next(
    make_thread, raw_client, namespace
):
    config = dict(window_size=4, chunk_size=2, retained_message_limit=0)
    thread = make_thread(**config)

    def compact_all() -> int:
        for i in range(8):
            thread.append(UserMessage(content=f"filler {i}"))
        thread.compact("summary", last_sequence=thread.stats().next_sequence - 1)
        return thread.stats().deleted_before_sequence

    def fields_of(turn_id: str) -> list[bytes]:
        return [
            k for k in raw_client.hkeys(thread.keys.turns) if k.split(b"\t")[0] == turn_id.encode()
        ]

    lease = thread.hold_turn("t")
    thread.publish(lease, "thinking")
    thread.append([AssistantMessage(content=f"r{i}") for i in range(3)], turn_id=lease)
    assert compact_all() > 3
    assert sorted(fields_of("t")) == [
        b"t",
        b"t\tdeltas",
        b"t\texpires",
        b"t\tholds",
        b"t\tlease",
    ]  # open: kept
    assert thread.finish_turn(lease).reply_count == 0  # nothing of it is left
    assert fields_of("t")
    compact_all()
    assert fields_of("t") == []
    assert raw_client.hkeys(thread.keys.turns) == []
    check_layout(raw_client, thread.keys, StoreConfig(namespace=namespace, **config))


def test_without_retention_no_turn_is_listed_for_it(make_thread, raw_client):
    thread = make_thread(retained_message_limit=None)
    thread.finish_turn(thread.hold_turn("t"), outcome="cancelled")
    assert sorted(raw_client.hkeys(thread.keys.turns)) == [
        b"t",
        b"t\texpires",
        b"t\tholds",
        b"t\tlease",
    ]


def test_a_forked_turn_without_messages_goes_with_the_forks_retention(
    make_thread, raw_client, namespace
):
    """A finished turn with no message of its own is listed for retention by the restore that
    writes it (a fork, an import) as finish_turn lists it, so a fork keeps nothing of it for good."""
    config = dict(window_size=4, chunk_size=2, retained_message_limit=0)
    source = make_thread("source", **config)
    source.append(UserMessage(content="question"))
    source.finish_turn(source.hold_turn("t"), outcome="cancelled")
    last = source.append(UserMessage(content="again"))[-1].seq_id
    fork = source.fork("forked", at=last)
    assert [k for k in raw_client.hkeys(fork.keys.turns) if k.split(b"\t")[0] == b"t"]
    for i in range(8):
        fork.append(UserMessage(content=f"filler {i}"))
    fork.compact("summary", last_sequence=fork.stats().next_sequence - 1)
    assert [k for k in raw_client.hkeys(fork.keys.turns) if k.split(b"\t")[0] == b"t"] == []
    check_layout(raw_client, fork.keys, StoreConfig(namespace=namespace, **config))
