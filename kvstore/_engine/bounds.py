"""The bound of every number that crosses into Lua (docs/LAYOUT.md, "Number bounds").

Lua 5.1 numbers are doubles: integers are exact to 2**53, and tostring writes 10**14 and up in
exponent form. So every number the scripts take has a bound, checked here before the socket,
small enough that every sum the scripts make stays exact: a thread's token total, its bytes
and media, its sequences and counters.
"""

from __future__ import annotations

import re
from typing import Any, cast

from .. import errors

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Lua holds every integer exactly up to here, and no number the scripts keep gets near it.
EXACT = 2**53
# One message's token count (more than any model's context window).
MAX_MESSAGE_TOKENS = 2**31
# A thread's token total (meta `tokens`): the scripts refuse a write that would pass it, so
# a sum of it and one write's counts stays below EXACT.
MAX_THREAD_TOKENS = 2**52
# Sequences, and the counters that grow by one per write (event numbers, leases): the scripts
# refuse a write past it (35 years of a million messages a second). A sequence given to name a
# message (at=, last_sequence, a watch cursor) is at most this too.
MAX_SEQUENCE = 2**50
# A page's sequence cursor: a bound of a range, which may lie past the thread's end; the
# scripts only compare it, so it may reach EXACT.
MAX_CURSOR = EXACT
# Milliseconds a call may wait on the server (watch's block_ms, durability_timeout_ms).
MAX_WAIT_MS = 2**31 - 1
# Seconds of thread_ttl and events_max_age (136 years): in milliseconds, 1.5 times over, far
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
}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def bounded(value: Any, low: int, high: int) -> bool:
    """Whether `value` is an int (not a bool) from `low` to `high`."""
    return is_int(value) and low <= value <= high


def check_sequence(value: Any, what: str, error: type[errors.KVStoreError], low: int = 0) -> int:
    """`value` when it is an int from `low` to MAX_SEQUENCE, else `error` naming `what`."""
    if not bounded(value, low, MAX_SEQUENCE):
        raise error(
            f"{what} must be an int from {low} to {MAX_SEQUENCE} (2**50), got {value!r:.80}"
        )
    return cast(int, value)


def check_lease(lease: Any) -> int:
    """A TurnLease's lease (hold_turn numbers them from 1), else InvalidMessage."""
    if not bounded(lease, 1, MAX_SEQUENCE):
        raise errors.InvalidMessage(
            f"a turn's lease is an int from 1 to {MAX_SEQUENCE} (2**50), got {lease!r:.80}"
        )
    return cast(int, lease)


def check_watch(after: Any, block_ms: Any) -> None:
    """watch()'s numbers, whatever the form of its cursor: each number of its position at most
    MAX_SEQUENCE (an event's number and a sequence), block_ms from 0 to MAX_WAIT_MS.
    InvalidCursor otherwise (the cursor's form is checked where it is read)."""
    if not bounded(block_ms, 0, MAX_WAIT_MS):
        raise errors.InvalidCursor(
            f"block_ms must be an int from 0 to {MAX_WAIT_MS}, got {block_ms!r:.80}"
        )
    # The thread's incarnation after '@' is an identity (the server's time in µs), not a position.
    position = after.partition("@")[0] if isinstance(after, str) else after
    numbers = (
        [str(position)]
        if is_int(position)
        else re.findall(r"[0-9]+", position)
        if isinstance(position, str)
        else []
    )
    if any(len(n) > 16 or int(n) > MAX_SEQUENCE for n in numbers):
        raise errors.InvalidCursor(
            f"a watch cursor's numbers are at most {MAX_SEQUENCE} (2**50), got {after!r:.80}"
        )
