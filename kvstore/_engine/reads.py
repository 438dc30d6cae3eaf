"""Reads of messages named by sequence, id or otid, and the consistent read (read_range).

lua/locate.lua says where each message lives (the window, a chunk or a layout-1 thread's legacy
hash); the container reader (layout/reader.py) then fetches the records in one pipeline,
checked against meta's gen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .. import errors
from ..messages import Message
from .layout.reader import Containers, decode, fetch
from .layout.v2 import stored_tokens as side_tokens
from .operation import (
    OPTIMISTIC_READS,
    ChangedUnderReads,
    Eval,
    Operation,
    ThreadRef,
    int_or_zero,
)
from .scripts import SCRIPTS
from .text import sendable


def fetch_sequences(
    thread: ThreadRef,
    sequences: Sequence[int],
    missing_ok: bool = False,
    unreadable: list[int] | None = None,
) -> Operation[list[Message]]:
    """Reads messages by sequence, in the order given (`unreadable`: as in decode)."""
    return (
        yield from _fetch_located(
            thread, "seq", [str(s) for s in sequences], missing_ok, unreadable
        )
    )


def get(thread: ThreadRef, message_id: str) -> Operation[Message]:
    return (yield from _get_one(thread, "id", message_id))


def get_by_otid(thread: ThreadRef, otid: str) -> Operation[Message]:
    return (yield from _get_one(thread, "otid", otid))


def _get_one(thread: ThreadRef, kind: Literal["id", "otid"], value: str) -> Operation[Message]:
    name = "message id" if kind == "id" else "otid"
    if not isinstance(value, str) or not value or not sendable(value):
        raise errors.InvalidCursor(f"{name} must be a non-empty str, got {value!r}")
    found = yield from _fetch_located(thread, kind, [value], missing_ok=True)
    if not found:
        raise errors.MessageNotFound(f"no stored message has {kind} {value!r}")
    if getattr(found[0], kind) not in (value, None):
        # The index entry names another message's sequence (something else wrote it); a record
        # naming none (written without) is the side info's, which the index was written from.
        raise errors.RecordError(
            f"the {kind}s index names sequence {found[0].seq_id} for {kind} {value!r}, whose"
            f" record has {kind} {getattr(found[0], kind)!r}"
        )
    return found[0]


def _fetch_located(
    thread: ThreadRef,
    kind: str,
    targets: list[str],
    missing_ok: bool,
    unreadable: list[int] | None = None,
) -> Operation[list[Message]]:
    entries = yield from locate_records(thread, kind, targets)
    if len(entries) < len(targets) and not missing_ok:
        raise errors.MessageNotFound(f"{len(targets) - len(entries)} messages are not stored")
    return decode(thread, entries, unreadable)


def locate_records(thread: ThreadRef, kind: str, targets: list[str]) -> Operation:
    """(sequence, record) of each target that is stored, by sequence or by id, in order.

    When messages moved between the locate and the fetch under each try, the records are read
    by their sequences in one step each run of them (lua/read_range.lua): a message keeps its
    sequence wherever it moves."""
    for _ in range(OPTIMISTIC_READS):
        reply = yield Eval(
            SCRIPTS["locate"],
            thread.script_keys,
            SCRIPTS["locate"].args(kind=kind, targets=[(target,) for target in targets]),
        )
        if len(reply) % 2:
            # Lua drops a nil from the reply's table: meta's gen or deleted_before is no number.
            raise errors.RecordError(
                "meta field gen or deleted_before holds a value that is not a number kvstore writes"
            )
        gen, places = reply[0], reply[2:]
        containers, wanted = Containers.located(places)
        fetched = yield from fetch(thread, containers, [("HGET", thread.keys.meta, "gen")])
        if int_or_zero(fetched.checks[0]) != int(gen):
            continue
        return [(s, fetched.records[s]) for s in wanted if s in fetched.records]
    sequences = [int(places[i]) for i in range(0, len(places), 2) if int(places[i]) > 0]
    found: dict[int, bytes] = {}
    for first, last in _runs(sorted(set(sequences))):
        read = yield from read_range(thread, ("seq", str(first - 1)), ("seq", str(last + 1)), "up")
        found.update((sequence, record) for sequence, record, _ in read.records)
    return [(sequence, found[sequence]) for sequence in sequences if sequence in found]


def stored_tokens(thread: ThreadRef, sequences: list[int]) -> Operation[dict[int, int]]:
    """The stored token counts of these sequences (a sequence not stored is left out): read
    from their side infos (layout.v2.side_tokens, two round trips), or, when every attempt met
    a writer moving messages (small chunks close every few appends), in one step each run of
    them (lua/read_range.lua), as locate_records reads records."""
    try:
        counted: dict[int, int] = yield from side_tokens(thread, sequences)
        return counted
    except ChangedUnderReads:
        pass
    wanted, counts = set(sequences), dict[int, int]()
    for first, last in _runs(sorted(wanted)):
        read = yield from read_range(thread, ("seq", str(first - 1)), ("seq", str(last + 1)), "up")
        counts.update(
            (sequence, tokens) for sequence, _, tokens in read.records if sequence in wanted
        )
    return counts


# Sequences this close together are read by one read_range call (the gap's records with them).
RUN_GAP = 64


def _runs(sequences: list[int]) -> list[tuple[int, int]]:
    """Sorted sequences as (first, last) runs, a gap of at most RUN_GAP inside each."""
    runs: list[tuple[int, int]] = []
    for sequence in sequences:
        if runs and sequence - runs[-1][1] <= RUN_GAP:
            runs[-1] = (runs[-1][0], sequence)
        else:
            runs.append((sequence, sequence))
    return runs


# ----------------------------------------------------------------------- consistent read

# (sequence, record, stored token count)
Counted = tuple[int, bytes, int]


@dataclass(frozen=True, slots=True)
class RangeRead:
    """What lua/read_range.lua read in one step: the range's records in walk order (whole
    containers: at least what the walk needs), and with a 'summary' bound the summary and the
    records at and before its range, newest first."""

    deleted_before: int
    summary_last: int | None
    summary_seq: int | None
    summary: Counted | None
    records: list[Counted]
    lookback: list[Counted]
    # With extras 'snapshot': meta's fields and values, and the window's, chunk index's, large
    # index's and legacy hash's sizes (what stats() reads).
    stats: tuple[list[Any], int, int, int, int] | None = None


def read_range(
    thread: ThreadRef,
    low: tuple[str, str],
    high: tuple[str, str],
    walk: str,
    need: int = 0,
    max_tokens: int = 0,
    lookback: int = 0,
    extras: str = "",
) -> Operation:
    """The consistent read: one read-only script call (lua/read_range.lua). `low` may be
    ("summary", ""): the range after the context summary's last sequence."""
    reply = yield Eval(
        SCRIPTS["read_range"],
        thread.script_keys,
        SCRIPTS["read_range"].args(
            lo_kind=low[0],
            lo=low[1],
            hi_kind=high[0],
            hi=high[1],
            walk=walk,
            need=need,
            max_tokens=max_tokens,
            lookback=lookback,
            extras=extras,
        ),
    )
    deleted_before, summary_last, summary_seq, summary_record, summary_tokens = reply[:5]
    at = 5
    sections: list[list[Counted]] = []
    for _ in range(2):
        n = int(reply[at])
        flat = reply[at + 1 : at + 1 + 3 * n]
        sections.append(
            [(int(flat[i]), flat[i + 1], int(flat[i + 2])) for i in range(0, len(flat), 3)]
        )
        at += 1 + 3 * n
    summary_seq = int(summary_seq) or None
    return RangeRead(
        deleted_before=int(deleted_before),
        summary_last=int(summary_last) if summary_seq else None,
        summary_seq=summary_seq,
        summary=(summary_seq, summary_record, int(summary_tokens))
        if summary_seq and summary_record
        else None,
        records=sections[0],
        lookback=sections[1],
        stats=(reply[at + 1 : at + 1 + int(reply[at])], *map(int, reply[at + 1 + int(reply[at]) :]))
        if extras
        else None,
    )
