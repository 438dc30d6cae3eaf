"""The one container reader: the native reads of the containers holding some sequences, their
records by sequence, cut to a range, and decoded.

Every read of stored messages comes here (pages, get, budgets, watch catch-up, views, fork,
backup and the CLI's export): :class:`Containers` names what to read (ranges of the window,
chunks by their first sequence, layout 3's open chunk, a layout-1 thread's legacy fields),
:func:`fetch` reads them in one round trip with the caller's checks (meta's gen, mostly; one
more for chunks that turn out to be layout-2 hashes on a layout-3 thread) and returns :class:`Found`,
:func:`cut` orders what was found inside a range, :func:`decode` makes the messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import errors
from ..operation import Batch, Operation, ThreadRef
from ..record import MISSING_RECORD, decode_records
from . import v1, v2, v3
from .formats import split_chunk
from .v2 import WindowRead

log = logging.getLogger("kvstore")


@dataclass(frozen=True, slots=True)
class Containers:
    """What one read fetches: ranges of the window, chunks (a chunk, or an oversized message's
    own chunk) by first sequence, a layout-1 thread's legacy fields by sequence, and the open
    chunk (layout 3).

    A chunk is read as layout 3's two strings, and with `hashes` as a layout-2 hash beside them
    in the same round trip; without, a chunk found in neither string is read as a hash in a
    second one (fetch)."""

    windows: Sequence[WindowRead] = ()
    chunks: Sequence[int] = ()
    legacy: Sequence[int] = ()
    # Keep each chunk's token counts from its manifest (Found.tokens).
    tokens: bool = False
    open: bool = False
    hashes: bool = True
    # Only the records of sequences keep[0]..keep[1] (the open chunk holds others).
    keep: tuple[int, int] | None = None
    # The sequences the caller expects in each chunk, by first sequence: a chunk found in no
    # form puts MISSING_RECORD there, so its messages read as unreadable, not as none.
    spans: dict[int, Sequence[int]] | None = None
    # Sequences known lost (lua/locate.lua's -4): read as MISSING_RECORD without a read.
    lost: Sequence[int] = ()

    def __bool__(self) -> bool:
        return bool(self.windows or self.chunks or self.legacy or self.open or self.lost)

    @classmethod
    def located(cls, places: Sequence[Any]) -> tuple[Containers, list[int]]:
        """The reads of the messages lua/locate.lua found, and their sequences in its order,
        from its (sequence, where) pairs: where -1 is the window, -2 the legacy hash, -3 the
        open chunk, -4 lost, a positive number the chunk starting there, 0 nowhere."""
        wanted: list[int] = []
        windows: list[WindowRead] = []
        chunks: list[int] = []
        legacy: list[int] = []
        in_open = False
        spans: dict[int, list[int]] = {}
        lost: list[int] = []
        for i in range(0, len(places), 2):
            sequence, where = int(places[i]), int(places[i + 1])
            if where > 0:
                spans.setdefault(where, []).append(sequence)
            if where == -1:
                windows.append(WindowRead(sequence, sequence, scores=False))
            elif where == -2:
                legacy.append(sequence)
            elif where == -3:
                in_open = True
            elif where > 0:
                chunks.append(where)
            elif where == -4:  # indexed, but its chunk's keys are gone
                lost.append(sequence)
            else:
                continue
            wanted.append(sequence)
        return cls(windows, chunks, legacy, open=in_open, spans=dict(spans), lost=lost), wanted

    def commands(self, thread: ThreadRef) -> list[tuple[Any, ...]]:
        keys = thread.keys
        commands: list[tuple[Any, ...]] = []
        for first in dict.fromkeys(self.chunks):
            commands.append(v3.chunk_read(keys, first))
            if self.hashes:
                commands.append(v2.chunk_read(keys, first))
        if self.open:
            commands.append(v3.open_read(keys))
        commands += [v2.window_read(keys, w) for w in self.windows]
        if self.legacy:
            commands.append(v1.legacy_read(keys, self.legacy))
        return commands

    def found(self, replies: Sequence[Any]) -> Found:
        """The records (and with `tokens` the counts) of the replies to :meth:`commands`."""
        found = Found()
        found.records.update((sequence, MISSING_RECORD) for sequence in self.lost)
        at = 0
        for first in dict.fromkeys(self.chunks):
            manifest, data = replies[at]
            at += 1
            if self.hashes:
                if manifest is None or data is None:
                    manifest, data = replies[at]
                at += 1
            elif manifest is None or data is None:
                found.hashes.append(first)
                continue
            if manifest is None or data is None:
                # Listed by the index, yet in neither form: its messages are lost, not absent.
                for sequence in (self.spans or {}).get(first, ()):
                    found.records[sequence] = MISSING_RECORD
                continue
            self._add(found, manifest, data)
        if self.open:
            self._add(found, *replies[at])
            at += 1
        for window in self.windows:
            found.records.update(v2.window_records(window, replies[at]))
            at += 1
        if self.legacy:
            found.records.update(v1.legacy_records(self.legacy, replies[at]))
        if self.keep is not None:
            a, b = self.keep
            found.records = {s: r for s, r in found.records.items() if a <= s <= b}
        return found

    def _add(self, found: Found, manifest: Any, data: Any) -> None:
        found.records.update(split_chunk(manifest, data, found.tokens if self.tokens else None))


@dataclass(slots=True)
class Found:
    """What a read found: records by sequence, the token counts its chunks' manifests list (with
    Containers.tokens), and the replies to the caller's checks, in order. `hashes`: the chunks
    found in no layout-3 string, to read as layout-2 hashes (fetch does)."""

    records: dict[int, bytes] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    checks: list[Any] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)


def just_appended(first: int, last: int) -> Containers:
    """Where messages first..last are while they are the newest: the open chunk (layout 3), or
    the window (a layout-2 thread). Found holds all of them, or not all when some moved on
    meanwhile (a close of the open chunk, retention, remove_turn)."""
    return Containers([WindowRead(first, last, scores=False)], open=True, keep=(first, last))


def fetch(
    thread: ThreadRef, containers: Containers, checks: Sequence[tuple[Any, ...]] = ()
) -> Operation:
    """Reads the containers and runs `checks` after them, in one round trip; returns Found."""
    commands = containers.commands(thread)
    replies = yield Batch([*commands, *checks])
    found = containers.found(replies[: len(commands)])
    found.checks = list(replies[len(commands) :])
    if found.hashes:
        # Chunks found in no layout-3 string: layout-2 hashes (read with the checks again; a
        # caller's gen read after both rounds covers the first round too: gen only grows).
        hashes = Containers(
            chunks=found.hashes,
            tokens=containers.tokens,
            keep=containers.keep,
            spans=containers.spans,
        )
        commands = hashes.commands(thread)
        replies = yield Batch([*commands, *checks])
        more = hashes.found(replies[: len(commands)])
        found.records.update(more.records)
        found.tokens.update(more.tokens)
        found.checks = list(replies[len(commands) :])
        found.hashes = []
    return found


def cut(records: dict[int, bytes], lo: int, hi: int, descending: bool = False) -> list[Any]:
    """The (sequence, record) pairs strictly between `lo` and `hi`, in order of sequence."""
    inside = sorted((s for s in records if lo < s < hi), reverse=descending)
    return [(sequence, records[sequence]) for sequence in inside]


Decoder = Callable[..., list[Any]]
"""How records become messages: record.decode_records (models), or record_dicts.decode_dicts."""


def decode(
    thread: ThreadRef,
    entries: list[tuple[int, bytes]],
    unreadable: list[int] | None = None,
    decoder: Decoder = decode_records,
) -> list[Any]:
    """The messages of `entries`; every read decodes here (docs/RELIABILITY.md, "One bad record").

    An unreadable record raises RecordError naming its sequence. Given `unreadable` (a page
    read), it is skipped instead, logged, and its sequence appended there in page order.
    `decoder` is record.decode_records (models), or record_dicts.decode_dicts (dicts where a
    record's shape allows), which report unreadable records alike.
    """
    if not entries:
        return []
    if unreadable is None:
        return decoder(entries)
    failed: list[errors.RecordError] = []
    messages = decoder(entries, failed)
    for error in failed:
        log.warning(
            "thread %s: skipped an unreadable record: %s",
            thread.keys.meta.rpartition(":")[0],
            error,
        )
        if error.sequence is not None:  # decode_records names each record's
            unreadable.append(error.sequence)
    return messages
