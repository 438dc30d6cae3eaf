"""Each call's limits are its own: the library remembers a store's parsed limits by the `limits`
argument itself (the values joined by ':', lua/includes/args.lua), so stores with other limits
on the same server, called in turn, each get exactly what they sent, and an argument that is not
the thirteen values is refused before anything is written."""

from __future__ import annotations

import pytest

from kvstore import StoreConfig, errors
from kvstore._engine.core import Eval
from kvstore._engine.layout.formats import ChunkEntry
from kvstore._engine.record import encode_record
from kvstore._engine.scripts import SCRIPTS
from kvstore.messages import UserMessage

from ..conftest import make_sync_store
from ..reliability.support import run_one


def chunk_counts(raw_client, thread) -> list[int]:
    return [ChunkEntry.parse(m).count for m in raw_client.zrange(thread.keys.chunk_index, 0, -1)]


@pytest.mark.parametrize("scripting", ["functions", "eval"])
def test_stores_with_other_limits_called_in_turn_keep_their_own(make_thread, raw_client, scripting):
    small = make_thread("small", chunk_size=2, scripting=scripting)
    large = make_thread("large", chunk_size=20, scripting=scripting)
    for i in range(60):
        small.append(UserMessage(content=f"s{i}"))
        large.append(UserMessage(content=f"l{i}"))
    # Each thread's chunks close at its own chunk_size.
    assert chunk_counts(raw_client, small) == [2] * 29
    assert chunk_counts(raw_client, large) == [20, 20]
    assert [m.content for m in small.list(limit=60).messages] == [f"s{i}" for i in range(60)]
    assert [m.content for m in large.list(limit=60).messages] == [f"l{i}" for i in range(60)]


@pytest.mark.parametrize("limits", ["1:2:3", "", "a:b:c:d:e:f:g:h:i:j:k:l:m", "1:" * 13 + "1"])
def test_a_limits_argument_that_is_not_the_thirteen_values_is_refused(
    backend, namespace, raw_client, limits
):
    store = make_sync_store(backend, StoreConfig(namespace=namespace))
    thread = store.thread("malformed")
    ref = thread._ref
    message = UserMessage(content="m").model_copy(update={"id": f"message-{namespace}"})
    try:
        with pytest.raises(errors.ServerError, match="the limits argument must be 13 numbers"):
            run_one(
                store,
                Eval(
                    SCRIPTS["append"],
                    ref.script_keys,
                    (
                        limits,
                        *SCRIPTS["append"].args(
                            limits=ref.limits(),
                            turn_id="",
                            lease=0,
                            pairs="",
                            messages=[(message.id, "", 0, 1, encode_record(message))],
                        )[1:],
                    ),
                ),
            )
        assert raw_client.keys(f"{namespace}:*") == []
    finally:
        store.close()
