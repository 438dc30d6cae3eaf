"""The append benchmark's timed calls on its fixture: kvstore's appends with their client side and
their script alone, the native baselines with the same record bytes, and the page reads.

Each call's index (which pool thread, which field, which id) comes from a counter of its own
calls; whatever a call appends is a new message made before the clock starts (MessagePool).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import count
from typing import Any

from ._append_fixture import BATCH, PAGE, SMALL_THREAD_APPENDS, Bench
from ._common import TEXTS, MessagePool, Variant, send_script
from ._engine import core


def variants(bench: Bench) -> list[Variant]:
    """Every timed call, in the order of the latency table."""
    p, n = bench.params, f"{bench.params.big:,}"
    calls = {**_appends(bench), **_baselines(bench), **_reads(bench)}
    rows = [
        ("append_100", "append 1 KB, thread of 100"),
        ("append_big", f"append 1 KB, thread of {n}"),
        ("prepare", "  client side alone: prepare_batch"),
        ("prepare_batch", f"  client side alone: prepare_batch of {BATCH}"),
        ("append_script", "  its script alone: FCALL, args pre-built"),
        ("raw_hset", "raw HSET key field blob"),
        ("append_batch", f"append batch of {BATCH} x 1 KB, thread of 100"),
        ("raw_hset_batch", f"raw HSET key of {BATCH} fields"),
        ("bare_script", "bare EVALSHA, 4 writes"),
        ("page_100", "newest 50, kvstore, thread of 100"),
        ("page_big", f"newest 50, kvstore, thread of {n}"),
        ("list_page_100", "newest 50, JSON list of 100 (LRANGE -50 -1)"),
        ("list_page_big", f"newest 50, JSON list of {n} (LRANGE -50 -1)"),
    ]
    if not bench.pages_ok:  # kvstore's pages read back wrong: not timed (check() said so)
        rows = [row for row in rows if row[0] not in ("page_100", "page_big")]
    timed = [Variant(name, label, calls[name]) for name, label in rows]
    for size, whole_calls in p.whole_calls.items():
        key = bench.lists[size]
        timed.append(
            Variant(
                f"list_whole_{size}",
                f"whole JSON list of {size:,} (LRANGE 0 -1)",
                lambda key=key: bench.list_whole(key),
                every=max(1, p.calls // whole_calls),
            )
        )
    return timed


def _appends(bench: Bench) -> dict[str, Callable[[], Any]]:
    """kvstore's appends of one message and of a batch, the client side alone (prepare_batch)
    and the script alone."""
    calls = bench.params.warmup + bench.params.calls
    small, big = MessagePool(bench.texts, calls), MessagePool(bench.texts, calls)
    batches, prepared = MessagePool(bench.texts, calls * BATCH), MessagePool(bench.texts, calls)
    small_calls, batch_calls, script_calls, prepare_batch_calls = count(), count(), count(), count()
    small_pool, batch_pool, big_thread = bench.small_pool, bench.batch_pool, bench.big
    client, store, config, messages = bench.client, bench.store, bench.config, bench.messages
    requests = bench.script_requests
    batch_thread_calls = SMALL_THREAD_APPENDS // BATCH

    def prepare_batch() -> None:
        i = next(prepare_batch_calls)
        core.prepare_batch(config, [messages[(i + j) % TEXTS] for j in range(BATCH)], None)

    return {
        "append_100": lambda: small_pool[next(small_calls) // SMALL_THREAD_APPENDS].append(
            small.take()
        ),
        "append_big": lambda: big_thread.append(big.take()),
        "prepare": lambda: core.prepare_batch(config, prepared.take(), None),
        "prepare_batch": prepare_batch,
        "append_script": lambda: send_script(client, store, requests[next(script_calls)]),
        "append_batch": lambda: batch_pool[next(batch_calls) // batch_thread_calls].append(
            batches.take(BATCH)
        ),
    }


def _baselines(bench: Bench) -> dict[str, Callable[[], Any]]:
    """Native writes of the same record bytes: HSET of one field and of BATCH fields, and the bare
    4-write script."""
    client, blob, ids = bench.client, bench.blob, bench.ids
    raw_key, raw_batch_key = bench.raw_key, bench.raw_batch_key
    sha, keys = bench.script_sha, bench.script_keys
    hset_calls, hset_batch_calls, script_calls = count(), count(), count()

    def raw_hset_batch() -> None:
        i = next(hset_batch_calls)
        client.hset(raw_batch_key, mapping={i * BATCH + j: blob for j in range(BATCH)})

    return {
        "raw_hset": lambda: client.hset(raw_key, next(hset_calls), blob),
        "raw_hset_batch": raw_hset_batch,
        "bare_script": lambda: client.evalsha(sha, 4, *keys, ids[next(script_calls)], blob),
    }


def _reads(bench: Bench) -> dict[str, Callable[[], Any]]:
    """The newest page of 50 from kvstore's threads and from the JSON lists of the same sizes."""
    small, big = bench.read_small, bench.big
    list_100, list_big = bench.list_100, bench.lists[bench.params.big]
    return {
        "page_100": lambda: small.list(limit=PAGE, order="desc"),
        "page_big": lambda: big.list(limit=PAGE, order="desc"),
        "list_page_100": lambda: bench.list_page(list_100),
        "list_page_big": lambda: bench.list_page(list_big),
    }
