"""The one container reader: the native reads of the containers holding some sequences, their
records by sequence, cut to a range, and decoded.

Every read of stored messages comes here (pages, get, budgets, watch catch-up, views, fork,
backup and the CLI's export): :class:`Containers` names what to read (ranges of the window,
chunks by their first sequence, a layout-1 thread's legacy fields), :func:`fetch` reads them in
one round trip with the caller's checks (meta's gen, mostly) and returns :class:`Found`,
:func:`cut` orders what was found inside a range, :func:`decode` makes the messages.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import errors
from ...messages import Message
from ..operation import Batch, Operation, ThreadRef
from ..record import decode_records
from . import v1, v2
from .v2 import WindowRead

log = logging.getLogger("kvstore")


@dataclass(frozen=True, slots=True)
class Containers:
    """What one read fetches: ranges of the window, chunks (a chunk, or an oversized message's
    own chunk) by first sequence, and a layout-1 thread's legacy fields by sequence."""

    windows: Sequence[WindowRead] = ()
    chunks: Sequence[int] = ()
    legacy: Sequence[int] = ()
    # Keep each chunk's token counts from its manifest (Found.tokens).
    tokens: bool = False

    def __bool__(self) -> bool:
        return bool(self.windows or self.chunks or self.legacy)

    @classmethod
    def located(cls, places: Sequence[Any]) -> tuple[Containers, list[int]]:
        """The reads of the messages lua/locate.lua found, and their sequences in its order,
        from its (sequence, where) pairs: where -1 is the window, -2 the legacy hash, a positive
        number the chunk starting there, 0 nowhere."""
        wanted: list[int] = []
        windows: list[WindowRead] = []
        chunks: list[int] = []
        legacy: list[int] = []
        for i in range(0, len(places), 2):
            sequence, where = int(places[i]), int(places[i + 1])
            if where == -1:
                windows.append(WindowRead(sequence, sequence, scores=False))
            elif where == -2:
                legacy.append(sequence)
            elif where > 0:
                chunks.append(where)
            else:
                continue
            wanted.append(sequence)
        return cls(windows, chunks, legacy), wanted

    def commands(self, thread: ThreadRef) -> list[tuple[Any, ...]]:
        keys = thread.keys
        commands = [v2.chunk_read(keys, first) for first in dict.fromkeys(self.chunks)]
        commands += [v2.window_read(keys, w) for w in self.windows]
        if self.legacy:
            commands.append(v1.legacy_read(keys, self.legacy))
        return commands

    def found(self, replies: Sequence[Any]) -> Found:
        """The records (and with `tokens` the counts) of the replies to :meth:`commands`."""
        found = Found()
        at = 0
        for _first in dict.fromkeys(self.chunks):
            manifest, data = replies[at]
            found.records.update(v2.chunk_records(manifest, data))
            if self.tokens:
                found.tokens.update(v2.manifest_tokens(manifest))
            at += 1
        for window in self.windows:
            found.records.update(v2.window_records(window, replies[at]))
            at += 1
        if self.legacy:
            found.records.update(v1.legacy_records(self.legacy, replies[at]))
        return found


@dataclass(slots=True)
class Found:
    """What a read found: records by sequence, the token counts its chunks' manifests list (with
    Containers.tokens), and the replies to the caller's checks, in order."""

    records: dict[int, bytes] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    checks: list[Any] = field(default_factory=list)


def just_appended(first: int, last: int) -> Containers:
    """Where messages first..last are while they are the newest: the window (layout 2). Found
    holds all of them, or none when some moved on meanwhile."""
    return Containers([WindowRead(first, last, scores=False)])


def fetch(
    thread: ThreadRef, containers: Containers, checks: Sequence[tuple[Any, ...]] = ()
) -> Operation:
    """Reads the containers and runs `checks` after them, in one round trip; returns Found."""
    commands = containers.commands(thread)
    replies = yield Batch([*commands, *checks])
    found = containers.found(replies[: len(commands)])
    found.checks = list(replies[len(commands) :])
    return found


def cut(records: dict[int, bytes], lo: int, hi: int, descending: bool = False) -> list[Any]:
    """The (sequence, record) pairs strictly between `lo` and `hi`, in order of sequence."""
    inside = sorted((s for s in records if lo < s < hi), reverse=descending)
    return [(sequence, records[sequence]) for sequence in inside]


def decode(
    thread: ThreadRef, entries: list[tuple[int, bytes]], unreadable: list[int] | None = None
) -> list[Message]:
    """The messages of `entries`; every read decodes here (docs/RELIABILITY.md, "One bad record").

    An unreadable record raises RecordError naming its sequence. Given `unreadable` (a page
    read), it is skipped instead, logged, and its sequence appended there in page order.
    """
    if not entries:
        return []
    if unreadable is None:
        return decode_records(entries)
    failed: list[errors.RecordError] = []
    messages = decode_records(entries, failed)
    for error in failed:
        log.warning(
            "thread %s: skipped an unreadable record: %s",
            thread.keys.meta.rpartition(":")[0],
            error,
        )
        if error.sequence is not None:  # decode_records names each record's
            unreadable.append(error.sequence)
    return messages
