"""Backup and restore of a thread: its state as a backup header records it, and the restore.

A backup holds the thread's state (:class:`BackupState`: the last sequence assigned, the
context summary, ``deleted_before``, the turn reply sequence, every turn record's result and the
system prompt retention kept aside, lua/includes/prompt.lua) and its messages, each with its sequence and turn. A restore writes the messages AT their
sequences (lua/restore.lua, one run of consecutive sequences of one turn per call, atomic),
then the state (lua/restore_state.lua). A message whose id is stored at its own sequence was
restored before and is skipped, so a restore interrupted anywhere is finished by running it
again; a thread holding other messages where the backup puts its own is refused
(``RestoreConflict``) with nothing written.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import errors
from ..messages import Message
from .bounds import MAX_SEQUENCE, bounded, check_sequence
from .layout import CURRENT, version
from .layout.formats import TurnRecord, manifest_tokens, split_chunk, turn_records
from .operation import Batch, Operation, ThreadRef, write
from .prepare import PreparedMessage
from .record import decode_records
from .replies import RestoreReply, stored_int
from .scripts import SCRIPTS
from .system_prompt import LEADING_SYSTEM_LIMIT
from .text import text as _text
from .tool_pairs import batch_pairs

# The most messages (and record bytes) one restore call sends.
RESTORE_RUN = 100
RESTORE_RUN_BYTES = 4 * 1024 * 1024
# The most turn records one restore_state call sends.
RESTORE_TURNS = 500


@dataclass(slots=True)
class BackupState:
    """A thread's state apart from its messages (docs/LAYOUT.md, meta and turns)."""

    last_seq: int = 0
    summary_last: int = 0
    summary_seq: int = 0
    deleted_before: int = 0
    turn_id: str = ""
    turn_seq: int = 0
    turn_outcome: str = ""
    gen: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    # Each turn's ranges of sequences (first, last, turn id), sorted: a message's turn.
    ranges: list[tuple[int, int, str]] = field(default_factory=list)
    # The system prompt retention kept aside (below deleted_before), and meta's `prompt`
    # ('open' | 'closed'; '' for none).
    prompt: list[BackedUpMessage] = field(default_factory=list)
    prompt_state: str = ""

    def check_prompt(self) -> None:
        """Refuses (InvalidMessage) a kept prompt restore_state cannot hold: at most
        LEADING_SYSTEM_LIMIT messages, in order, below deleted_before, with a state."""
        sequences = [item.sequence for item in self.prompt]
        if (
            self.prompt_state not in ("", "open", "closed")
            or (sequences and not self.prompt_state)
            or len(sequences) > LEADING_SYSTEM_LIMIT
            or sequences != sorted(set(sequences))
            or any(not 1 <= s < self.deleted_before for s in sequences)
        ):
            raise errors.InvalidMessage(
                f"the kept prompt ({self.prompt_state!r:.20}, sequences {sequences[:20]}) is not"
                f" one a backup holds: at most {LEADING_SYSTEM_LIMIT} messages in order below"
                " deleted_before"
            )

    def turn_of(self, sequence: int) -> str | None:
        """The turn whose ranges hold `sequence`, or None."""
        at = bisect.bisect_right(self.ranges, (sequence, float("inf"))) - 1
        if at >= 0 and self.ranges[at][0] <= sequence <= self.ranges[at][1]:
            return self.ranges[at][2]
        return None

    def same_moment(self, other: BackupState) -> bool:
        """No message was added, moved or deleted between the two reads."""
        return (self.last_seq, self.gen, self.summary_seq) == (
            other.last_seq,
            other.gen,
            other.summary_seq,
        )


def backup_state(thread: ThreadRef) -> Operation:
    """The thread's state, read in one round trip (meta, the turn records, the kept prompt);
    LayoutError, naming its layout, for a thread not in the current one."""
    keys = thread.keys
    meta, turns, (manifest, data), legacy = yield Batch(
        [
            ("HGETALL", keys.meta),
            ("HGETALL", keys.turns),
            ("MGET", keys.prompt_manifest, keys.prompt_data),
            ("EXISTS", keys.legacy),
        ]
    )
    fields = {_text(k): _text(v) for k, v in meta.items()}
    if "deleting" in fields:
        fields = {}
    _check_layout(fields.get("layout"), legacy)

    def number(name: str) -> int:
        return stored_int(fields.get(name) or 0, f"meta field {name}")

    state = BackupState(
        last_seq=number("last_seq"),
        summary_last=number("summary_last"),
        summary_seq=number("summary_seq"),
        deleted_before=number("deleted_before"),
        turn_id=fields.get("turn_id", ""),
        turn_seq=number("turn_seq"),
        turn_outcome=fields.get("turn_outcome", "") if fields.get("turn_id") else "",
        gen=number("gen"),
        prompt_state=fields.get("prompt", "") if fields else "",
    )
    if state.prompt_state:
        tokens = manifest_tokens(manifest)
        kept = sorted(split_chunk(manifest, data).items())
        state.prompt = [
            BackedUpMessage(m.seq_id, None, m, tokens.get(m.seq_id))
            for m in decode_records(kept)
            if m.seq_id is not None
        ]
    records = {_text(k): _text(v) for k, v in turns.items()}
    for record, ranges in turn_records(records, state.turn_id, state.turn_seq, state.turn_outcome):
        state.turns.append(record)
        state.ranges += [(a, b, record.turn_id) for a, b in ranges]
    state.ranges.sort()
    return state


def _check_layout(stored: str | None, legacy: Any) -> None:
    """Refuses (LayoutError, naming it) a thread in another layout than the current one: meta's
    `layout`, or layout 1 for a legacy hash without it (a thread no write has touched)."""
    try:
        layout = version(stored.encode() if stored is not None else None, legacy)
    except ValueError:  # not a number: no layout of kvstore's
        layout = CURRENT + 1
    if layout < CURRENT:
        raise errors.LayoutError(
            f"the thread is in layout {layout}: migrate it (kvstore migrate) before a backup"
        )
    if layout != CURRENT:
        raise errors.LayoutError(
            f"the thread's meta says layout {stored!r:.20}, which this version of kvstore does not"
            " write: upgrade kvstore"
        )


@dataclass(frozen=True, slots=True)
class BackedUpMessage:
    """One message of a backup: where it was stored, in which turn, and its token count (None:
    the restoring store counts it)."""

    sequence: int
    turn_id: str | None
    message: Message
    tokens: int | None = None


def restore_runs(items: Iterable[BackedUpMessage]) -> Iterator[list[BackedUpMessage]]:
    """The messages cut into runs one restore call can take: consecutive sequences of one turn
    (or none), at most RESTORE_RUN messages. Sequences must increase."""
    run: list[BackedUpMessage] = []
    previous = 0
    for item in items:
        if item.sequence <= previous:
            raise errors.InvalidMessage(
                f"sequence {item.sequence} follows {previous}: a backup lists sequences in order"
            )
        if run and (
            item.sequence != previous + 1
            or item.turn_id != run[0].turn_id
            or len(run) == RESTORE_RUN
        ):
            yield run
            run = []
        run.append(item)
        previous = item.sequence
    if run:
        yield run


def restore_run(
    thread: ThreadRef, run: list[BackedUpMessage], born: str = "", source: str = ""
) -> Operation:
    """Restores one run (consecutive sequences of one turn) at its sequences, in calls no larger
    than an append may be (the store's max_batch_messages and max_batch_bytes, at most
    RESTORE_RUN_BYTES of records); returns (restored, already stored). `born`: the incarnation
    the calls must find (restore_incarnation, lua/restore.lua), '' for any; `source`: a fork's
    mark of its source, which the thread keeps until the fork finishes."""
    turn_id = run[0].turn_id
    for item in run:
        check_sequence(
            item.sequence, "a backed-up message's sequence", errors.InvalidMessage, low=1
        )
    prepared = [
        PreparedMessage.of(
            thread.config,
            item.message,
            turn_id,
            None,
            f"message {item.sequence}",
            item.tokens,
            thread.count_tokens,
        )
        for item in run
    ]
    most = thread.config.max_batch_messages
    most_bytes = min(RESTORE_RUN_BYTES, thread.config.max_batch_bytes)
    restored = already = 0
    start = 0
    while start < len(prepared):
        end, size = start, 0
        while end < len(prepared) and (
            end == start or (end - start < most and size + len(prepared[end].record) <= most_bytes)
        ):
            size += len(prepared[end].record)
            end += 1
        strict = thread.config.history_checks == "strict"
        pairs = batch_pairs([item.message for item in prepared[start:end]]) if strict else ""
        args = SCRIPTS["restore"].args(
            limits=thread.limits(),
            turn_id=turn_id or "",
            first=run[start].sequence,
            pairs=pairs,
            born=born,
            source=source,
            messages=[
                (i.message.id, i.message.otid or "", i.media, i.tokens, i.record)
                for i in prepared[start:end]
            ],
        )
        reply = RestoreReply.decode((yield from write(thread, SCRIPTS["restore"], args)))
        restored += reply.restored
        already += reply.already_stored
        start = end
    return restored, already


def restore_state(
    thread: ThreadRef, state: BackupState, fork_of: str = "", fork_at: int = 0, born: str = ""
) -> Operation:
    """Sets the thread's state as the backup recorded it (after every message is restored); a
    fork also records the thread it was forked from and its fork point, and the incarnation its
    copy wrote (`born`, lua/restore_state.lua; an import sends the one it restores into). Only
    the last call ends the restore (and records the fork): one stopped before it is run again."""
    turns = state.turns or []
    numbers = [
        state.last_seq,
        state.summary_last,
        state.summary_seq,
        state.deleted_before,
        state.turn_seq,
        fork_at,
    ]
    for turn in turns:
        numbers += (turn.start, turn.replies, turn.first, turn.count, turn.first_seq, turn.last_seq)
    for value in numbers:
        if not bounded(value, 0, MAX_SEQUENCE):
            # As lua/restore_state.lua words it (KVS_BAD_BACKUP), before the socket.
            raise errors.InvalidMessage(
                f"number {value!r:.80} is not one a backup holds (an int from 0 to 2**50)"
            )
    prompt_index, prompt_records = _prompt_args(thread, state)
    starts = range(0, max(len(turns), 1), RESTORE_TURNS)
    for start in starts:
        last = start == starts[-1]
        part = turns[start : start + RESTORE_TURNS]
        args = SCRIPTS["restore_state"].args(
            limits=thread.limits(),
            last_seq=state.last_seq,
            summary_last=state.summary_last,
            summary_seq=state.summary_seq,
            deleted_before=state.deleted_before,
            turn_id=state.turn_id,
            turn_seq=state.turn_seq if state.turn_id else 0,
            turn_outcome=state.turn_outcome if state.turn_id else "",
            fork_of=fork_of,
            fork_at=fork_at,
            last=int(last),
            born=born,
            prompt_state=state.prompt_state if last else "",
            prompt_index=prompt_index if last else "",
            prompt_records=prompt_records if last else b"",
            turns=[
                (
                    t.turn_id,
                    t.start,
                    t.outcome,
                    t.replies,
                    t.first,
                    t.count,
                    t.first_seq,
                    t.last_seq,
                )
                for t in part
            ],
        )
        yield from write(thread, SCRIPTS["restore_state"], args)


def _prompt_args(thread: ThreadRef, state: BackupState) -> tuple[str, bytes]:
    """restore_state's kept prompt (lua/restore_state.lua: prompt_index, prompt_records),
    checked as the script checks it, before the socket."""
    state.check_prompt()
    prompt = [
        PreparedMessage.of(
            thread.config,
            item.message,
            None,
            None,
            f"prompt message {item.sequence}",
            item.tokens,
            thread.count_tokens,
        )
        for item in state.prompt
    ]
    index = ",".join(
        f"{item.sequence}:{p.tokens}:{len(p.record)}"
        for item, p in zip(state.prompt, prompt, strict=True)
    )
    return index, b"".join(p.record for p in prompt)


# Why a restore's later step finds another thread than its first step wrote (lua/restore.lua
# words the same refusal).
NOT_IN_PROGRESS = (
    "the thread is not the import or fork in progress this call started: deleted, its owner"
    " erased or made again since its first step (run it again to start over)"
)


def restore_incarnation(thread: ThreadRef, mid_restore: bool = False) -> Operation:
    """The incarnation (meta `born`) a restore's calls send, so that none of them writes into
    another thread of the same id (lua/restore.lua, lua/restore_state.lua): read before the
    first run, the thread's; None for no thread (the first run makes one: read it again after
    that run, with `mid_restore`); '' for a thread made before `born` was kept (not checked).
    With `mid_restore`, RestoreConflict unless the thread is mid-restore: it was deleted, its
    owner erased or it was made again since the run."""
    ((born, restoring, deleting), exists) = yield Batch(
        [
            ("HMGET", thread.keys.meta, "born", "restoring", "deleting"),
            ("EXISTS", thread.keys.meta),
        ]
    )
    if mid_restore and (restoring is None or deleting is not None):
        raise errors.RestoreConflict(NOT_IN_PROGRESS)
    if deleting is not None or not exists:
        return None  # a deletion its first run finishes: that run makes the thread
    return _text(born) if born is not None else ""


def stored_ids(thread: ThreadRef, ids: list[str]) -> Operation:
    """Which of `ids` the thread's id map holds, with their sequences."""
    if not ids:
        return {}
    (found,) = yield Batch([("HMGET", thread.keys.ids, *ids)])
    return {
        message_id: int(sequence)
        for message_id, sequence in zip(ids, found, strict=True)
        if sequence is not None
    }


def check_restore_target(thread: ThreadRef, first: BackedUpMessage) -> Operation:
    """Refuses (RestoreConflict) a thread that is neither empty nor a partial restore of this
    backup: one holding messages whose sequences the backup's first message does not start."""
    (meta, stored_at) = yield Batch(
        [
            ("HMGET", thread.keys.meta, "last_seq", "deleting"),
            ("HGET", thread.keys.ids, first.message.id),
        ]
    )
    last_seq = stored_int(meta[0] or 0, "meta field last_seq") if meta[1] is None else 0
    if last_seq == 0:
        return
    if stored_at is not None and stored_int(stored_at, "an id's sequence") == first.sequence:
        return  # restored in part before: the rest follows
    raise errors.RestoreConflict(
        f"the thread already holds messages up to sequence {last_seq} and they are not this backup's"
        f" (its first message, {first.message.id}, is at {first.sequence}): restore into an empty thread"
    )
