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
from ..limits import MAX_SEQUENCE as MAX_SEQUENCE
from ..limits import MAX_WAIT_MS as MAX_WAIT_MS

# Lua holds every integer exactly up to here, and no number the scripts keep gets near it.
EXACT = 2**53
# One message's token count (more than any model's context window).
MAX_MESSAGE_TOKENS = 2**31
# A thread's token total (meta `tokens`): the scripts refuse a write that would pass it, so
# a sum of it and one write's counts stays below EXACT.
MAX_THREAD_TOKENS = 2**52
# A page's sequence cursor: a bound of a range, which may lie past the thread's end; the
# scripts only compare it, so it may reach EXACT.
MAX_CURSOR = EXACT


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
