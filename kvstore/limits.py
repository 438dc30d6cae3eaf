"""The bounds a store's numbers and names keep, shared by StoreConfig (kvstore/config.py) and the
engine (kvstore/_engine/bounds.py, which checks every number that crosses into Lua): the most
each StoreConfig int may be, and what a namespace may hold. Here, not in the engine, so the
config needs nothing of the engine.
"""

from __future__ import annotations

import re

from .errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Sequences, and the counters that grow by one per write (event numbers, leases): the scripts
# refuse a write past it (35 years of a million messages a second). A sequence given to name a
# message (at=, last_sequence, a watch cursor) is at most this too.
MAX_SEQUENCE = 2**50
# Milliseconds a call may wait on the server (watch's block_ms, durability_timeout_ms).
MAX_WAIT_MS = 2**31 - 1
# Seconds of thread_ttl, events_max_age and turn_lease (136 years): in milliseconds, 1.5 times over, far
# inside what PEXPIRE takes.
MAX_SECONDS = 2**32

# The most each StoreConfig int may be (the least is 1; retained_message_limit's is 0).
CONFIG_MAXIMA: dict[str, int] = {
    "window_size": 100_000,
    "chunk_size": 1000,
    "chunk_max_bytes": 8 * MiB,
    "max_message_bytes": 256 * MiB,  # the server's bulk limit is 512 MB
    "max_chunks_per_call": 10_000,
    "max_bytes_per_call": 1 * GiB,
    # A batch's ids go to one HMGET and HSET, whose arguments Lua unpacks onto its stack (8000
    # slots at most).
    "max_batch_messages": 2000,
    "max_batch_bytes": 512 * MiB,
    "retained_message_limit": MAX_SEQUENCE,
    "max_inline_part_bytes": 2**40,
    "max_inline_media_bytes": 2**40,
    "thread_ttl": MAX_SECONDS,
    "durability_replicas": 1000,
    "durability_timeout_ms": MAX_WAIT_MS,
    "events_max_len": 2**32,
    "events_max_age": MAX_SECONDS,
    "turn_lease": MAX_SECONDS,
}

_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def check_namespace(namespace: str) -> str:
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ConfigError(
            f"namespace {namespace!r} must be 1-64 characters of letters, digits and . _ : -,"
            " starting with a letter or digit"
        )
    return namespace
