"""A thread's start as context() reads it in its first round trip: whether system messages lead
the thread (docs/HISTORY.md, "The system prompt"), settled from a few bytes where they can be.

Until retention begins, the messages a thread starts with are stored where every message is.
Sequence 1 is the first record of the first closed chunk (`chunk:1`), or of the open chunk
while none closed; a chunk's manifest lists its sequences in order, one line each. So context()
reads, beside its history, the first bytes of each of those records and of their manifests,
record first: a manifest starting ``1\\t`` holds sequence 1, and a record read just before it
whose packed type is not ``system_message`` means no prompt leads the thread. A chunk that
closed or was rewritten in between shows another first line, and any other form (an oversized
first message, a layout-2 thread, a version-1 record) is "not known": the start is read then.

A store keeps what its handles of a thread found (ThreadRef.hints, shared): that retention
began (no start is read again), that sequence 1 is in the first closed chunk (the open chunk's
bytes are not read), or the run of system messages itself (:class:`Run`: its manifest lines,
its records' size and stored count). With a run, the first round trip reads exactly the run's records and its manifest lines (and
the next line's start and the next record's first bytes): the lines equal to the run's mean the
same messages in the same places, read fresh; anything else drops the hint, and the start is
read again. A run is learnt from one atomic read of the chunk that holds it (``MGET``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import errors
from .layout import v3
from .layout.formats import manifest_tokens, split_chunk
from .operation import ThreadRef

# The leading system messages context() keeps at most: a prompt in a few parts, not a log.
LEADING_SYSTEM_LIMIT = 16

# A record's first bytes as the client packs a version-2 record: [2, {message_type: <fixstr>,
# ...}] (lua/includes/prompt.lua: is_system_record reads the same form); the group is the
# fixstr's header byte. What no record of this form starts with reads as "not known".
_RECORD_TYPE = re.compile(
    rb"[\x92\x93]\x02(?:[\x80-\x8f]|\xde..)\xacmessage_type([\xa0-\xbf])", re.S
)
# Bytes enough for that form and the longest type name a fixstr holds.
TYPE_PREFIX = 64

HINT = "context_start"
"""The handle's hint: "retained", "closed", a Run, or none."""

# (sequence, record, stored count) of the run's messages, in order.
Records = list[tuple[int, bytes, int]]


@dataclass(frozen=True, slots=True)
class Run:
    """The leading system messages as a read found them: in the first closed chunk or the open
    one, their manifest lines, the start of the line after them (``b""`` when the run is
    LEADING_SYSTEM_LIMIT long: nothing after it counts), their records' bytes, their stored
    count."""

    closed: bool
    lines: bytes
    next_line: bytes
    size: int
    tokens: int


class Learn:
    """The start is a system message in this container: read it whole (:func:`learn`)."""

    __slots__ = ("closed",)

    def __init__(self, closed: bool) -> None:
        self.closed = closed


PLAIN = "plain"  # no system message leads the thread
UNKNOWN = "unknown"  # the bytes settle nothing: read the start


def not_system(prefix: bytes) -> bool:
    """Whether a record's first bytes name a message type other than system_message."""
    match = _RECORD_TYPE.match(prefix)
    if match is None:
        return False
    start, size = match.end(), match.group(1)[0] & 0x1F
    kind = prefix[start : start + size]
    return len(kind) == size and kind != b"system_message"


def container_read(thread: ThreadRef, closed: bool) -> tuple[Any, ...]:
    """The atomic read of the first closed chunk (`closed`) or of the open one."""
    return v3.chunk_read(thread.keys, 1) if closed else v3.open_read(thread.keys)


def _container(thread: ThreadRef, closed: bool) -> tuple[str, str]:
    keys = thread.keys
    if closed:
        return keys.chunk_data(1), keys.chunk_manifest(1)
    return keys.open_data, keys.open_manifest


def hint_of(thread: ThreadRef) -> Any:
    """The handle's hint, read once per context(): its reads and their verdict use the same."""
    return thread.hints.get(HINT)


def start_reads(thread: ThreadRef, hint: Any) -> list[tuple[Any, ...]]:
    """The reads of the start `hint` leaves needed, each record before its manifest."""
    if hint == "retained":
        return []
    if isinstance(hint, Run):
        data, manifest = _container(thread, hint.closed)
        return [
            ("GETRANGE", data, 0, hint.size + TYPE_PREFIX - 1),
            ("GETRANGE", manifest, 0, len(hint.lines) + len(hint.next_line) - 1),
        ]
    reads: list[tuple[Any, ...]] = []
    for closed in (True, False) if hint != "closed" else (True,):
        data, manifest = _container(thread, closed)
        reads += [("GETRANGE", data, 0, TYPE_PREFIX - 1), ("GETRANGE", manifest, 0, 1)]
    return reads


def settle(thread: ThreadRef, hint: Any, deleted_before: Any, starts: list[Any]) -> Any:
    """What start_reads(thread, hint) read says: PLAIN, the Records of the run `hint` keeps
    (read fresh: it still stands), Learn, or UNKNOWN; and the handle's hint for its next read."""
    if deleted_before is not None:
        thread.hints[HINT] = "retained"
        return UNKNOWN
    if isinstance(hint, Run):
        records = _still(hint, *starts)
        if records is None:
            thread.hints.pop(HINT, None)
            return UNKNOWN
        return records
    for at in range(0, len(starts), 2):
        record, manifest = starts[at : at + 2]
        if manifest == b"1\t":
            if at == 0:
                thread.hints[HINT] = "closed"
            return PLAIN if not_system(record) else Learn(at == 0)
    thread.hints.pop(HINT, None)
    return UNKNOWN


def _still(run: Run, data: bytes, manifest: bytes) -> Records | None:
    """The run's records from the fresh `data`, when the fresh `manifest` shows the run's lines
    and the next line's start unchanged and the next record is still no system message."""
    if manifest != run.lines + run.next_line or len(data) < run.size:
        return None
    if run.next_line and not not_system(data[run.size : run.size + TYPE_PREFIX]):
        return None
    tokens = manifest_tokens(run.lines)
    found = split_chunk(run.lines, data[: run.size])
    return [(s, r, tokens[s]) for s, r in found.items()]


def learn(
    thread: ThreadRef,
    closed: bool,
    manifest: bytes | None,
    data: bytes | None,
    leading: Callable[[Records], list[tuple[Any, int]]],
) -> list[tuple[Any, int]] | None:
    """The leading system messages from one atomic read of the chunk that holds sequence 1 (its
    manifest and records), as `leading(records)` decodes them ((message, stored count)s); the
    run is kept as the handle's Run. None where that chunk alone cannot tell (a gap in its
    sequences: another container may hold one; the chunk ending within the run; a record after
    the run whose first bytes do not tell it is no system message)."""
    try:
        records = split_chunk(manifest, data)
        tokens = manifest_tokens(manifest)
    except errors.KVStoreError:
        return None  # the read of the start reports it
    first = sorted(records)[: LEADING_SYSTEM_LIMIT + 1]
    if first != list(range(1, len(first) + 1)):
        return None
    candidates = [(s, records[s], tokens[s]) for s in first[:LEADING_SYSTEM_LIMIT]]
    found = leading(candidates)
    count = len(found)
    if count == 0 or [m.seq_id for m, _ in found] != list(range(1, count + 1)):
        return None
    after = b""
    if count < LEADING_SYSTEM_LIMIT:
        if len(first) <= count or not not_system(records[count + 1][:TYPE_PREFIX]):
            return None
        after = b"%d\t" % (count + 1)
    lines = [line + b"\n" for line in (manifest or b"").split(b"\n")[:count]]
    if any(not line.startswith(b"%d\t" % (at + 1)) for at, line in enumerate(lines)):
        return None
    run = candidates[:count]
    thread.hints[HINT] = Run(
        closed, b"".join(lines), after, sum(len(r) for _, r, _ in run), sum(t for _, _, t in run)
    )
    return found
