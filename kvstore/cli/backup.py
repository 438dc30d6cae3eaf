"""`kvstore export` and `kvstore import`: a thread's backup, and its restore.

A backup is JSON lines: a header with the thread's state, then one line per kept message in the
list API's shape with its sequence and turn, then an end line with the count of message lines and
the checksum of every line before it (docs/LAYOUT.md, "Backup and restore"). Its restore writes
each message at its own sequence, resumably, and ends (makes the thread writable) only once the
end line proves the file whole; a file of plain message lines is appended.
"""

from __future__ import annotations

import itertools
import json
import sys
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from .. import admin, errors
from ..admin import check_thread_id
from ..messages import Message, parse_message
from ..store import MessageStore
from .backup_file import (
    BACKUP_END,
    BACKUP_FORMAT,
    READ_FORMATS,
    add_line,
    check_whole,
    entry,
    header_info,
    header_line,
    header_state,
    is_end_line,
    is_header,
    line_digest,
    numbered_lines,
    read_entry,
)
from .commands import existing_thread
from .progress import Progress, TextOut

IMPORT_BATCH = 100


def export(
    store: MessageStore,
    thread_id: str,
    out: TextOut,
    progress_out: IO[str] | None = None,
    every: float = 5.0,
    owner: str | None = None,
) -> int:
    """Writes a backup of the thread: a header line with its state (BackupState), then one line
    per kept message, oldest first: the message in the list API's shape (its seq_id is its
    sequence) under `message`, beside it `turn_id` for a message of a turn and `tokens`, its
    stored token count; then the end line, written only once the whole thread was read as one
    state: the count of message lines and the SHA-256 of every line before it. Refuses (nothing
    to trust, and no end line) if the thread changed while it was read."""
    thread = existing_thread(store, thread_id, owner)
    state = admin.backup_state(store, thread_id, owner=owner)
    stats = thread.stats()
    header = header_line(thread_id, stats.stored_messages, state, thread.info() if owner else None)
    digest = line_digest()

    def write(line: str) -> None:
        out.write(line)
        add_line(digest, line)

    write(json.dumps(header, separators=(",", ":")) + "\n")
    progress = Progress("exported", stats.stored_messages, progress_out or sys.stderr, every)
    count = 0
    unreadable: list[int] = []
    for page in admin.pages(store, thread_id, owner=owner):
        unreadable += page.unreadable
        # A listed message has its sequence (seq_id).
        listed = [(m.seq_id, m) for m in page.messages if m.seq_id is not None]
        counts = admin.stored_tokens(
            store, thread_id, [sequence for sequence, _ in listed], owner=owner
        )
        for sequence, message in listed:
            line = entry(message.to_dict(), state.turn_of(sequence), counts.get(sequence))
            write(json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n")
            count += 1
        progress.update(len(page.messages) + len(page.unreadable))
    progress.close()
    _check_whole(store, thread_id, state, count, unreadable, owner)
    end = {BACKUP_END: BACKUP_FORMAT, "messages": count, "sha256": digest.hexdigest()}
    out.write(json.dumps(end, separators=(",", ":")) + "\n")
    return count


def _check_whole(
    store: MessageStore,
    thread_id: str,
    state: admin.BackupState,
    count: int,
    unreadable: list[int],
    owner: str | None,
) -> None:
    """Refuses an export no end line may vouch for: records it could not read, a thread that
    changed while it was read, or fewer messages listed than the thread stores."""
    if unreadable:
        shown = ", ".join(map(str, unreadable[:10])) + (" ..." if len(unreadable) > 10 else "")
        raise errors.RecordError(
            f"{len(unreadable)} stored records of {thread_id!r} could not be read and are not in the backup"
            f" (sequences {shown}; docs/RELIABILITY.md, 'One bad record')"
        )
    if not state.same_moment(admin.backup_state(store, thread_id, owner=owner)):
        raise errors.KVStoreError(
            f"thread {thread_id!r} changed while it was exported: the file is not one state of it; export it"
            " again while nothing writes to it"
        )
    # Counted after the pages: retention since the first count stores fewer, never more. A
    # shortfall is messages stored but not listed (damaged data).
    stored = existing_thread(store, thread_id, owner).stats().stored_messages
    if count < stored:
        raise errors.RecordError(
            f"{count} messages of {thread_id!r} were exported, it stores {stored}: the backup is"
            " not whole (kvstore inspect, and docs/RELIABILITY.md, 'One bad record')"
        )


@dataclass
class ImportProgress:
    """How far an import got, for a report when it is interrupted."""

    stored: int = 0  # messages the server stored now
    already: int = 0  # messages found already stored (an earlier import, or a replay)
    lines: int = 0  # lines read
    sending: int = 0  # messages of the call in flight (stored or not: unknown if interrupted)


def import_lines(
    store: MessageStore,
    thread_id: str,
    lines: IO[str],
    progress: ImportProgress | None = None,
    progress_out: IO[str] | None = None,
    every: float = 5.0,
    total: int | None = None,
    allow_untrailed: bool = False,
    owner: str | None = None,
) -> int:
    """Imports a file `export` wrote (a backup: restored at its sequences, with its summary,
    turns and deleted_before) or plain JSON-lines messages (appended). Either way a message
    already stored is skipped and counted as such, so an import interrupted anywhere is finished
    by running it again. Returns the messages stored now.

    A backup's restore is finished (its state set, the thread writable again) only when its end
    line proves the file whole; otherwise BackupIncomplete is raised and the thread refuses
    writes (RestoreIncomplete) until the whole file is imported. A backup written before end
    lines existed is refused unless `allow_untrailed`, and then its header's message count must
    be the file's."""
    check_thread_id(thread_id)
    progress = progress or ImportProgress()
    numbered = numbered_lines(lines, progress)
    first = next(numbered, None)
    if first is None:
        return 0
    number, text = first
    try:
        head = json.loads(text)
    except (ValueError, RecursionError):  # nested past the parser's depth: not a header
        head = None
    bar_out = progress_out or sys.stderr
    if is_header(head):
        assert isinstance(head, dict)
        form = head["kvstore_backup"]
        if isinstance(form, bool) or not isinstance(form, int) or form not in READ_FORMATS:
            raise errors.InvalidMessage(
                f"line {number}: backup format {head['kvstore_backup']!r} is not one this"
                f" version reads ({', '.join(map(str, READ_FORMATS))})"
            )
        bar = Progress("restored", head.get("messages"), bar_out, every)
        _restore(store, (thread_id, owner), head, text, numbered, progress, bar, allow_untrailed)
    else:
        bar = Progress("imported", total, bar_out, every)
        plain = itertools.chain([first], numbered)
        _append_plain(store, (thread_id, owner), plain, progress, bar)
    bar.close()
    return progress.stored


def _restore(
    store: MessageStore,
    target: tuple[str, str | None],
    head: dict[str, Any],
    head_text: str,
    numbered: Iterator[tuple[int, str]],
    progress: ImportProgress,
    bar: Progress,
    allow_untrailed: bool,
) -> None:
    thread_id, owner = target  # the thread's id and owner (None: none)
    state, info = header_state(head), header_info(head)
    for item in state.prompt:
        # Encoded as restore_state will (its size and parts against this store's limits), so
        # that its last step cannot refuse it after every message is written.
        what = f"line 1: the kept prompt's message {item.sequence}"
        admin.check_restorable(store, item.message, item.tokens, what)
    digest = line_digest()
    add_line(digest, head_text)
    read: dict[str, Any] = {"messages": 0, "end": None}

    items = _backup_items(numbered, digest, read, state.last_seq, head["kvstore_backup"])
    checked, born = _restore_runs(store, target, items, progress, bar)
    if not checked and state.last_seq:
        # A backup without messages (all deleted or removed) restores over an empty thread only,
        # or over one it restored before: no message stored and the same last sequence. A
        # thread holding messages is another thread, whatever its last sequence.
        stats = store.thread(thread_id, owner=owner).stats()
        if stats.stored_messages or (
            stats.next_sequence > 1 and stats.next_sequence - 1 != state.last_seq
        ):
            raise errors.RestoreConflict(
                f"thread {thread_id!r} already holds messages: restore into an empty thread"
            )
    check_whole(head, read["messages"], read["end"], digest.hexdigest(), allow_untrailed)
    admin.restore_state(store, thread_id, state, owner=owner, born=born or "")
    if info is not None and owner is not None:  # an unowned thread has no title or metadata
        store.thread(thread_id, owner=owner).set_info(title=info[0], metadata=info[1])


def _restore_runs(
    store: MessageStore,
    target: tuple[str, str | None],
    items: Iterable[admin.BackedUpMessage],
    progress: ImportProgress,
    bar: Progress,
) -> tuple[bool, str | None]:
    """Restores the backup's messages, run by run: (whether there were any, the incarnation the
    restore wrote into). Every call after the first names the thread's incarnation, the first
    too when the thread was there before: one deleted, erased or made again under the import
    is refused (RestoreConflict), nothing more written, never finished with part of the backup.
    """
    thread_id, owner = target  # the thread's id and owner (None: none)
    checked, born = False, None
    for run in admin.restore_runs(items):
        if not checked:
            admin.check_restore_target(store, thread_id, run[0], owner=owner)
            _check_nothing_before(store, target, run[0].sequence)
            born = admin.restore_incarnation(store, thread_id, owner=owner)
            checked = True
        progress.sending = len(run)
        new, already = admin.restore_run(store, thread_id, run, owner=owner, born=born or "")
        progress.sending = 0
        progress.stored += new
        progress.already += already
        bar.update(new, already)
        if born is None:  # the first run made the thread: its incarnation, mid-restore
            born = admin.restore_incarnation(store, thread_id, owner=owner, mid_restore=True)
    return checked, born


def _check_nothing_before(store: MessageStore, target: tuple[str, str | None], first: int) -> None:
    """Refuses (RestoreConflict, before any write) a thread that lists a message before the
    backup's first: an older restore of the same thread, say, holding what retention deleted
    from the source since; the backup's state would leave it counted but deleted."""
    thread_id, owner = target
    oldest = store.thread(thread_id, owner=owner).list(limit=1).messages
    if oldest and oldest[0].seq_id is not None and oldest[0].seq_id < first:
        raise errors.RestoreConflict(
            f"thread {thread_id!r} holds messages from sequence {oldest[0].seq_id}, before the"
            f" backup's first ({first}): it is no restore of this backup; restore into an empty"
            " thread"
        )


def _backup_items(
    numbered: Iterator[tuple[int, str]],
    digest: Any,
    read: dict[str, Any],
    last_seq: int,
    form: int,
) -> Iterator[admin.BackedUpMessage]:
    """A backup's message lines (of format `form`) as messages, each line added to `digest` and
    checked as append checks its ids (before the run holding it is sent); `read` counts them and
    keeps the end line (number, body) when it comes."""
    for number, text in numbered:
        if read["end"] is not None:
            raise errors.BackupIncomplete(
                f"line {number}: a line after the backup's end line (line {read['end'][0]})"
            )
        try:
            body = json.loads(text)
            if is_end_line(body, form):
                read["end"] = (number, body)
                continue
            add_line(digest, text)
            read["messages"] += 1
            fields, turn_id, tokens = read_entry(body, form)
            message = parse_message(fields)
            _check_ids(message, turn_id, last_seq)
        except RecursionError:
            raise errors.InvalidMessage(f"line {number}: nested too deep to read") from None
        except (ValueError, errors.InvalidMessage) as exc:
            raise errors.InvalidMessage(f"line {number}: {exc}") from None
        assert message.seq_id is not None  # _check_ids
        yield admin.BackedUpMessage(message.seq_id, turn_id, message, tokens)


def _check_ids(message: Message, turn_id: str | None, last_seq: int) -> None:
    """A backed-up message's id, otid and turn id as append takes them, its sequence one of the
    header's (restore_state refuses a thread holding sequences past its last_seq)."""
    if message.seq_id is None or message.id is None:
        # The id is how a restore run again finds the message stored.
        raise errors.InvalidMessage("a backup's message must have its seq_id and id")
    admin.check_token("message id", message.id)
    if message.otid is not None:
        admin.check_token("otid", message.otid)
    if turn_id is not None:
        admin.check_token("turn_id", turn_id)
    if not 1 <= message.seq_id <= last_seq:
        raise errors.InvalidMessage(
            f"sequence {message.seq_id} is not from 1 to the header's last_seq {last_seq}"
        )


def _append_plain(
    store: MessageStore,
    target: tuple[str, str | None],
    numbered: Iterable[tuple[int, str]],
    progress: ImportProgress,
    bar: Progress,
) -> None:
    """Plain message lines (an older export, or a file of your own), appended in batches. A
    message without an id gets one made from its line's text (and how many identical lines came
    before), so importing the same file again finds it stored."""
    thread_id, owner = target
    thread = store.thread(thread_id, owner=owner)
    seen: dict[str, int] = {}

    def send(batch: list[Message]) -> None:
        # Each has its id: its own, or the one made from its line below.
        ids = [m.id for m in batch if m.id is not None]
        stored = admin.stored_ids(store, thread_id, ids, owner=owner)
        todo = [m for m in batch if m.id not in stored]
        count(0, len(batch) - len(todo))
        if not todo:
            return
        progress.sending = len(todo)
        try:
            result = thread.append(todo)
            progress.sending = 0
            count(0, len(todo)) if result.replayed else count(len(todo), 0)
        except (errors.OtidConflict, errors.DuplicateMessageId) as exc:
            if isinstance(exc, (errors.OtidRepeated, errors.MessageIdRepeated)):
                raise  # two lines of the file with one id or otid: the file's own fault
            # Some of them were stored by another cut of the same messages: one at a time,
            # each is new or a replay.
            for message in todo:
                progress.sending = 1
                replayed = thread.append(message).replayed
                progress.sending = 0
                count(0, 1) if replayed else count(1, 0)

    def count(new: int, already: int) -> None:
        progress.stored += new
        progress.already += already
        bar.update(new, already)

    batch: list[Message] = []
    for number, text in numbered:
        try:
            message = parse_message(text)
        except errors.InvalidMessage as exc:
            raise errors.InvalidMessage(f"line {number}: {exc}") from None
        update: dict[str, Any] = {"seq_id": None}
        if message.id is None:
            occurrence = seen.get(text.strip(), 0)
            seen[text.strip()] = occurrence + 1
            update["id"] = f"message-{uuid.uuid5(_IMPORT_IDS, f'{occurrence}:{text.strip()}')}"
        batch.append(message.model_copy(update=update))
        if len(batch) == IMPORT_BATCH:
            send(batch)
            batch = []
    if batch:
        send(batch)


# Ids of imported messages that had none: uuid5 of the line in this namespace.
_IMPORT_IDS = uuid.UUID("6f1c3a52-9a64-4b8e-9c55-2d1f0e8b7a31")
