"""Each call's limits are its own: the library remembers a store's parsed limits by their key
(the last value of the `limits` argument, lua/includes/args.lua), so stores with other limits on the same server, called in
turn, and a call whose key does not name its values must each get exactly what they sent."""

from __future__ import annotations

import pytest

from kvstore import StoreConfig
from kvstore._engine.core import Eval
from kvstore._engine.record import encode_record
from kvstore._engine.scripts import SCRIPTS
from kvstore.messages import UserMessage

from ..conftest import make_sync_store
from ..reliability.support import run_one


def window_count(raw_client, thread) -> int:
    return raw_client.zcard(thread.keys.window)


@pytest.mark.parametrize("scripting", ["functions", "eval"])
def test_stores_with_other_limits_called_in_turn_keep_their_own(make_thread, raw_client, scripting):
    small = make_thread("small", window_size=4, chunk_size=2, scripting=scripting)
    large = make_thread("large", window_size=40, chunk_size=20, scripting=scripting)
    for i in range(60):
        small.append(UserMessage(content=f"s{i}"))
        large.append(UserMessage(content=f"l{i}"))
    # window_size + chunk_size - 1 at most, and at least window_size once anything rolled.
    assert 4 <= window_count(raw_client, small) <= 5
    assert 40 <= window_count(raw_client, large) <= 59
    assert [m.content for m in small.list(limit=60).messages] == [f"s{i}" for i in range(60)]
    assert [m.content for m in large.list(limit=60).messages] == [f"l{i}" for i in range(60)]


def test_a_key_that_does_not_name_its_values_is_not_remembered(backend, namespace, raw_client):
    # Limits no other test sends, so their key is new to the server's library.
    unique_bytes = 1_000_000 + int(namespace[1:7], 16) % 40_000
    store = make_sync_store(
        backend,
        StoreConfig(namespace=namespace, window_size=4, chunk_size=2, chunk_max_bytes=unique_bytes),
    )
    thread = store.thread("mismatch")
    ref = thread._ref
    honest = ref.limits()
    lying = (1000, *honest[1:])  # a window of 1000 under the honest key

    def append(limits, i):
        message = UserMessage(content=f"m{i}").model_copy(update={"id": f"message-{namespace}-{i}"})
        reply = run_one(
            store,
            Eval(
                SCRIPTS["append"],
                ref.script_keys,
                SCRIPTS["append"].args(
                    limits=limits,
                    turn_id="",
                    lease=0,
                    pairs="",
                    messages=[(message.id, "", 0, 1, encode_record(message))],
                ),
            ),
        )
        assert int(reply[0]) == 1

    try:
        for i in range(10):
            append(lying, i)  # parsed and used, never remembered: nothing rolls
        assert raw_client.zcard(thread.keys.window) == 10
        append(honest, 10)  # the key is parsed from its own values: window 4, chunks of 2
        assert raw_client.zcard(thread.keys.window) < 11
        assert [m.seq_id for m in thread.list(limit=20).messages] == list(range(1, 12))
    finally:
        store.close()
