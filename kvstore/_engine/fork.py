"""A fork: a new thread holding a thread's history up to a message (docs/HISTORY.md).

The copy is a restore (backup.py) of the source's messages up to the fork point, at their own
sequences, a run of at most RESTORE_RUN messages per call: the two threads live in their own
hash slots, so no one step can write both. Each step is idempotent (a message stored at its own
sequence is skipped), so a fork interrupted anywhere is finished by running it again. The last
step writes the fork's state (summary, retention and turns as of the fork point) and its origin
(``fork_of``, ``fork_at`` in meta), which also marks the fork finished.

A finished fork keeps its point: the same fork again (the same source and point, by id or
sequence) is a replay, and any other fork into it is refused (RestoreConflict) before a write.
The check reads the target's origin once, at the start: it holds for every call that starts
after the fork finished (a retry, a second call with a later point). Two calls with different
points into one new thread id, both started before either finished, are not told apart: each
copies the source's own messages at their own sequences, so the target ends a whole fork at
the later point, never a mix; the earlier call is refused (restore_state.lua refuses a thread
holding sequences past its last) unless it finished first.

Another worker may delete the source or the target (or erase their owner) between two steps.
Each page is checked against the source's incarnation before its runs are written: a source
gone or made again fails the fork (MessageNotFound) and takes the copy so far with it. Every
write after the first names the target's incarnation, which the scripts check before writing:
a target deleted, erased or made again fails the fork (RestoreConflict), never finished.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .. import errors
from .backup import (
    RESTORE_RUN,
    BackedUpMessage,
    BackupState,
    backup_state,
    check_restore_target,
    restore_incarnation,
    restore_run,
    restore_runs,
    restore_state,
)
from .bounds import MAX_SEQUENCE
from .layout.formats import TurnRecord
from .layout.keys import OwnerKeys
from .lifecycle import delete, migrate
from .operation import Batch, Operation, ThreadRef
from .pages import list_page
from .reads import get, stored_tokens
from .text import sendable
from .text import text as _text


@dataclass(slots=True)
class _Copy:
    """What one fork call knows as it copies: where from and to, the point, the source's state
    and incarnation when it started, and the target's incarnation once known ('' before)."""

    source: ThreadRef
    source_id: str
    target: ThreadRef
    at_seq: int
    state: BackupState
    source_mark: tuple[Any, ...]
    held: bool  # the target held something of its own before any message: it stays
    born: str = ""


def fork(source: ThreadRef, source_id: str, target: ThreadRef, at: str | int) -> Operation:
    """Copies `source`'s history up to and including message `at` (an id, or a sequence) into
    the empty thread `target`; returns the fork point's sequence."""
    if target.keys.meta == source.keys.meta:
        raise errors.InvalidCursor("a thread cannot be forked into itself")
    _check_point(at)
    replies = yield Batch(_target_reads(target, at))
    fork_of, fork_at, last_seq, born, restoring, copied_from = (
        _text(v) if v is not None else None for v in replies[0]
    )
    # The target keeps the fork's ids: a finished fork is found by its point whatever became of
    # the source since (deleted, expired, or retention past the point).
    point_in_target = _text(replies[2]) if isinstance(at, str) and replies[2] else None
    if fork_of == source_id and fork_at is not None and fork_at in (str(at), point_in_target):
        return int(fork_at)  # finished before: a retried or repeated fork
    # What the target holds of its own, which a fork does not write: a turn started before any
    # message (meta without one), or an owned thread's title or metadata.
    held = (bool(replies[1]) and last_seq in (None, "0")) or (
        target.owner is not None and bool(replies[-1])
    )
    yield from migrate(source)
    at_seq = yield from _fork_point(source, at)
    if fork_of is not None:
        # A finished fork keeps its point: copying on would silently extend it (or leave it
        # holding messages past its point), and another source would rewrite its origin.
        raise errors.RestoreConflict(
            f"the thread is already a fork of {fork_of} at sequence {fork_at}; a fork of"
            f" {source_id} at sequence {at_seq} goes into a new thread id (or delete this one first)"
        )
    # The mark before the state: a source made again in between is seen by the first check.
    mark = yield from _source_mark(source)
    state = yield from backup_state(source)
    if at_seq > state.last_seq or at_seq < state.deleted_before:
        raise errors.MessageNotFound(
            f"sequence {at_seq} is not stored in the thread (deleted by retention, or not given out yet)"
        )
    # A restore stopped mid-way (an earlier call of this fork) is continued as it is, if the
    # source is still what that call copied from.
    mid_restore = born if born is not None and restoring is not None else ""
    if mid_restore and copied_from not in (None, _mark_text(mark)):
        yield from _start_again(target, held)
        mid_restore = ""
    copy = _Copy(source, source_id, target, at_seq, state, mark, held, mid_restore)
    try:
        yield from _copy(copy)
    except errors.QuotaExceeded:
        # A fork its owner's quota refuses leaves no thread: the copy so far (this call's or an
        # interrupted one's) goes, with its counts. Unless the target held something of its own
        # before any message (a title or metadata, a turn started): that stays, and so does
        # what the fork copied, which the fork run again finishes.
        if target.owner is not None and not held:
            yield from delete(target)
        raise
    return at_seq


def _target_reads(target: ThreadRef, at: str | int) -> list[tuple[Any, ...]]:
    """The fork's first read of `target`: its fork marks, last sequence and incarnation,
    whether its meta exists, where it stores message `at` (an id), and for an owned thread
    whether its owner's info hash has its title or metadata."""
    meta = target.keys.meta
    reads: list[tuple[Any, ...]] = [
        ("HMGET", meta, "fork_of", "fork_at", "last_seq", "born", "restoring", "fork_source"),
        ("EXISTS", meta),
        ("HGET", target.keys.ids, at) if isinstance(at, str) else ("EXISTS", meta),
    ]
    if target.owner is not None:
        info = OwnerKeys.of(target.config.namespace, target.owner).info
        reads.append(("HEXISTS", info, target.thread_id))
    return reads


def _copy(copy: _Copy) -> Operation[None]:
    """The fork's runs of messages up to its point, then its state: the steps of fork(). Every
    page is checked against the source's incarnation before its runs are written, and every
    write after the first names the target's (lua/restore.lua refuses another)."""
    copied = 0
    cursor: int | None = None
    while True:
        page = yield from list_page(copy.source, after=cursor, limit=RESTORE_RUN, order="asc")
        bad = [sequence for sequence in page.unreadable if sequence <= copy.at_seq]
        if bad:
            # A fork without them would be a different history: replace() them, then fork again.
            error = errors.RecordError(
                f"the record at sequence {bad[0]} cannot be read: the fork stops before it"
            )
            error.sequence = bad[0]
            raise error
        # A listed message has its sequence (seq_id): decode sets it.
        kept = [
            (m.seq_id, m) for m in page.messages if m.seq_id is not None and m.seq_id <= copy.at_seq
        ]
        # Each message keeps its stored count (a message the source moved or removed since the
        # page was read is counted by the fork's store).
        counts = yield from stored_tokens(copy.source, [s for s, _ in kept])
        yield from _check_source(copy)
        items = [BackedUpMessage(s, copy.state.turn_of(s), m, counts.get(s)) for s, m in kept]
        if items and not copied:
            yield from check_restore_target(copy.target, items[0])
        for run in restore_runs(items):
            yield from restore_run(copy.target, run, copy.born, _mark_text(copy.source_mark))
            if not copy.born:
                # The incarnation the fork's first write made (or found) mid-restore.
                copy.born = yield from restore_incarnation(copy.target, mid_restore=True)
        copied += len(items)
        if page.next_cursor is None or len(items) < len(page.messages):
            break
        cursor = page.next_cursor
    if not copied:
        raise errors.MessageNotFound(
            f"no message up to sequence {copy.at_seq} is stored in the thread"
        )
    state = forked_state(copy.state, copy.at_seq)
    yield from restore_state(copy.target, state, copy.source_id, copy.at_seq, copy.born)


def _source_mark(source: ThreadRef) -> Operation:
    """What must not change while a fork copies: the source's incarnation (absent once it is
    deleted or expired; another once it is made again), its retention and summary, and its
    in-place edits (meta `edits`: a replace, a remove_turn)."""
    (mark,) = yield Batch(
        [
            (
                "HMGET",
                source.keys.meta,
                "born",
                "last_seq",
                "deleting",
                "deleted_before",
                "summary_seq",
                "edits",
            )
        ]
    )
    return tuple(mark)


def _mark_text(mark: tuple[Any, ...]) -> str:
    """The mark a fork's runs leave in the target (meta `fork_source`): the source's
    incarnation, retention, summary and edits, which a later call of the fork compares."""
    born, _, _, *moving = mark
    return ":".join(_text(v) if v is not None else "" for v in (born, *moving))


def _start_again(target: ThreadRef, held: bool) -> Operation[None]:
    """An earlier call's copy is of the source as it was (retention, a compaction or an edit
    moved it since): it holds messages retention has deleted, or as they were before an edit.
    The copy starts over, so that the fork is the one made now."""
    if held:
        # What the target held of its own would go with it.
        raise errors.RestoreConflict(
            "the fork in progress in this thread copied its source as it was before a"
            " compaction or an edit: delete the thread, then fork again"
        )
    yield from delete(target)


def _check_source(copy: _Copy) -> Operation[None]:
    """Fails the fork unless the source is still what it was when the fork started (the page
    just read, read since the start, is then the source's as the fork found it)."""
    mark = yield from _source_mark(copy.source)
    born, last_seq, deleting, *retention = mark
    if last_seq is None or deleting is not None or born != copy.source_mark[0]:
        # Its messages are gone, or another thread's now: the copy can never be finished.
        if not copy.held:
            yield from _drop_partial(copy.target, copy.born)
        raise errors.MessageNotFound(
            f"thread {copy.source_id} was deleted (or expired, or made again) during the fork:"
            f" its messages up to sequence {copy.at_seq} are not stored any more"
        )
    if retention != list(copy.source_mark[3:]):
        # A compaction (and its retention), a replace or a remove_turn ran while the copy read:
        # its pages may miss messages it deleted, or mix a message's old and new text. The run
        # again copies the source as it is then (_start_again).
        raise errors.ServerError(
            "the thread was compacted during the fork (or had a message replaced or a turn"
            " removed); run the fork again"
        )


def _drop_partial(target: ThreadRef, born: str) -> Operation[None]:
    """Deletes the copy a fork of a vanished source made, if the target is still that copy."""
    if not born:
        return
    ((now, restoring),) = yield Batch([("HMGET", target.keys.meta, "born", "restoring")])
    if restoring is not None and now is not None and _text(now) == born:
        yield from delete(target)


def _check_point(at: str | int) -> None:
    if (
        isinstance(at, bool)
        or not isinstance(at, (str, int))
        or (isinstance(at, int) and not 1 <= at <= MAX_SEQUENCE)
        or at == ""
        or (isinstance(at, str) and not sendable(at))
    ):
        raise errors.InvalidCursor(
            f"at must be a message id or a sequence from 1 to {MAX_SEQUENCE} (2**50), got {at!r:.80}"
        )


def _fork_point(source: ThreadRef, at: str | int) -> Operation:
    if isinstance(at, int):
        return at
    # Read as get reads it: an index entry naming another message's sequence is a RecordError,
    # never a fork at that other message.
    return (yield from get(source, at)).seq_id


def forked_state(state: BackupState, at: int) -> BackupState:
    """The source's state as of sequence `at`: its summary only if stored by then, its retention
    (and the system prompt retention kept) as it is, and the turns that had started by then; a turn with messages after `at` is open
    again in the fork (its reply and result counts start over)."""
    turns: list[TurnRecord] = []
    crossing: set[str] = set()
    for turn in state.turns:
        spans = [(a, b) for a, b, turn_id in state.ranges if turn_id == turn.turn_id]
        started = 0 < turn.start <= at or any(a <= at for a, _ in spans)
        if not started:
            continue
        if any(b > at for _, b in spans) or turn.last_seq > at or turn.start > at:
            # Open again, with the replies it had at the fork point (those from its start on).
            crossing.add(turn.turn_id)
            start = turn.start if turn.start <= at else 0
            replies = [
                (max(a, start), min(b, at)) for a, b in spans if start and b >= start and a <= at
            ]
            turn = replace(
                turn,
                start=start,
                outcome="open",
                replies=sum(b - a + 1 for a, b in replies),
                first=replies[0][0] if replies else 0,
                count=0,
                first_seq=0,
                last_seq=0,
            )
        turns.append(turn)
    # Meta keeps the current summary only: an older one in force at `at` is not found without
    # reading the history back (docs/HISTORY.md, "Forks"), so the fork then carries none.
    summary = 0 < state.summary_seq <= at
    current = state.turn_id if state.turn_id and 0 < state.turn_seq <= at else ""
    return BackupState(
        last_seq=at,
        summary_last=state.summary_last if summary else 0,
        summary_seq=state.summary_seq if summary else 0,
        deleted_before=state.deleted_before,
        turn_id=current,
        turn_seq=state.turn_seq if current else 0,
        turn_outcome=("open" if current in crossing else state.turn_outcome) if current else "",
        turns=turns,
        # The kept prompt is older than every sequence the fork may start at (deleted_before).
        prompt=state.prompt,
        prompt_state=state.prompt_state,
    )
