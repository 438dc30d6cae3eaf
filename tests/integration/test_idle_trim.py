"""A thread at rest holds its open chunk's records exact (lua/includes/layout3_store.lua,
open_chunk.trim).

`APPEND` grows a string greedily: below 1 MB each reallocation doubles what the string needs, so
an open chunk built by appends carries up to as many bytes again (more under jemalloc's size
classes). A finished turn and a compaction are where a thread goes quiet, so both leave the open
chunk's records string as exact as a `COPY` makes it: same bytes, same deadline, no slack, and
no key left behind (its manifest, a few hundred bytes, is left as it is). Memory is read with `MEMORY USAGE`, on the real servers only."""

from __future__ import annotations

import pytest

from kvstore import AssistantMessage, UserMessage

MESSAGES = 5  # 1 KB appends: the fifth reallocates to twice the bytes, leaving slack
# APPEND's slack is kilobytes here; an object's own header may differ from a fresh copy's by a
# few bytes, by how the server made it (Valkey 8 embeds the key in it: 16 bytes seen), never KBs.
EXACT = 256


def open_strings(thread):
    keys = thread.keys
    return keys.open_data, keys.open_manifest


def slack(client, key: str) -> int:
    """Bytes `key` holds beyond an exact copy of it (named as long: Redis counts the name too)."""
    probe = key[:-1] + "#"
    assert client.copy(key, probe)
    try:
        return client.memory_usage(key, samples=0) - client.memory_usage(probe, samples=0)
    finally:
        client.delete(probe)


def fill(thread, turn_id: str | None) -> int:
    last = 0
    for i in range(MESSAGES):
        message = (UserMessage if i % 2 == 0 else AssistantMessage)(content=f"{i} " + "x" * 1000)
        last = thread.append(message, turn_id=turn_id)[0].seq_id
    return last


def copies_made(client) -> int:
    """COPY commands the server ran so far (a script's own commands counted too)."""
    return int(client.info("commandstats").get("cmdstat_copy", {}).get("calls", 0))


def state(client, keys: tuple[str, str]) -> list[tuple[bytes, int]]:
    return [(client.get(key), client.pttl(key)) for key in keys]


@pytest.mark.parametrize("ttl", [None, 3600])
def test_a_finished_turn_leaves_the_open_chunk_exact(
    make_thread, raw_client, namespace, server_only, ttl
):
    thread = make_thread("quiet", thread_ttl=ttl)
    thread.start_turn("turn-1")
    fill(thread, "turn-1")
    keys = open_strings(thread)
    # The condition the trim removes: without it this test would pass vacuously.
    assert slack(raw_client, keys[0]) > 1024
    before = state(raw_client, keys)
    before_keys = set(raw_client.scan_iter(match=f"{namespace}:*"))

    thread.finish_turn("turn-1")

    assert slack(raw_client, keys[0]) < EXACT
    after = state(raw_client, keys)
    assert [value for value, _ in after] == [value for value, _ in before]
    for (_, ttl_before), (_, ttl_after) in zip(before, after, strict=True):
        if ttl is None:
            assert ttl_before == ttl_after == -1
        else:
            assert 0 < ttl_before - 10_000 <= ttl_after  # the deadline kept, or moved on
    assert set(raw_client.scan_iter(match=f"{namespace}:*")) == before_keys
    assert [m.seq_id for m in thread.list(limit=50).messages] == list(range(1, MESSAGES + 1))


def test_a_compaction_leaves_the_open_chunk_exact(make_thread, raw_client, server_only):
    thread = make_thread("compacted")
    last = fill(thread, None)
    thread.compact("the story so far", last_sequence=last)
    assert slack(raw_client, open_strings(thread)[0]) < EXACT
    assert thread.stats().stored_messages == MESSAGES + 1


def test_finishing_a_turn_twice_or_an_empty_thread_trims_nothing_wrong(
    make_thread, raw_client, namespace, server_only
):
    thread = make_thread("empty")
    thread.start_turn("turn-1")
    thread.finish_turn("turn-1")
    assert not raw_client.exists(*open_strings(thread))
    thread.start_turn("turn-2")
    fill(thread, "turn-2")
    thread.finish_turn("turn-2")
    first = state(raw_client, open_strings(thread))
    copies = copies_made(raw_client)
    thread.finish_turn("turn-2")  # a retry: the recorded result, the strings as they were
    assert state(raw_client, open_strings(thread)) == first
    assert copies_made(raw_client) == copies  # trimmed once, by the call that finished it
    assert slack(raw_client, open_strings(thread)[0]) < EXACT
