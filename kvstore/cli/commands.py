"""What the `kvstore` subcommands do, apart from parsing arguments (kvstore/cli/main.py)."""

from __future__ import annotations

import itertools
import json
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

import redis

from .. import errors
from .server import data_dir_server
from .._engine import core
from .._engine.keys import check_thread_id
from .._engine.requests import ThreadRef
from .._engine.wire import ChunkEntry, LargeEntry
from ..config import StoreConfig
from ..messages import Message, parse_message
from ..store import MessageStore

IMPORT_BATCH = 100


@contextmanager
def open_store(url: str | None, namespace: str, data_dir: str) -> Iterator[MessageStore]:
    """A store on `url`, or without a URL on the server over `data_dir`: the one already running
    there, or an embedded one this command starts and stops."""
    config = StoreConfig(namespace=namespace)
    if url:
        client = _connect(url)
        try:
            yield MessageStore(client, config)
        finally:
            client.close()
        return
    with data_dir_server(data_dir) as server:
        client = _connect(server.url)
        try:
            yield MessageStore(client, config)
        finally:
            client.close()


def _connect(url: str) -> redis.Redis:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3)
    except ValueError as exc:
        raise errors.ConfigError(f"bad URL {url!r}: {exc}") from None
    try:
        client.ping()
    except redis.RedisError as exc:
        raise errors.ServerError(f"cannot reach {url}: {exc}") from None
    return client


def _existing_thread(store: MessageStore, thread_id: str):
    thread = store.thread(thread_id)
    keys = thread.keys
    if not store.client.exists(keys.meta, keys.legacy):
        raise errors.KVStoreError(
            f"thread {thread_id!r} not found in namespace {store.config.namespace!r}"
        )
    return thread


# Index members read per ZRANGE: a thread of millions of messages is summed without one huge reply.
INDEX_PAGE = 5000


def inspect(store: MessageStore, thread_id: str, out: IO[str] = sys.stdout, chunks: bool = False) -> None:
    """A thread's layout: a summary of its chunks, or with `chunks` one line for each."""
    thread = _existing_thread(store, thread_id)
    keys, client = thread.keys, store.client
    stats = thread.stats()
    meta = {k.decode(): v.decode() for k, v in client.hgetall(keys.meta).items()}
    window = client.zrange(keys.window, 0, -1, withscores=True)
    print(f"thread {thread_id} (namespace {store.config.namespace}, layout {stats.layout_version})", file=out)
    print(f"  messages stored   {stats.stored_messages} ({stats.stored_bytes:,} record bytes)", file=out)
    print(f"  next sequence     {stats.next_sequence}", file=out)
    print(f"  deleted before    {stats.deleted_before_sequence or '-'}", file=out)
    print(f"  inline media      {stats.media_bytes:,} bytes", file=out)
    summary = meta.get("summary_last")
    print(f"  summary           {'covers ..' + summary + ' (message ' + meta['summary_seq'] + ')' if summary else '-'}", file=out)
    if meta.get("turn_id"):
        print(f"  turn              {meta['turn_id']}: replies from {meta['turn_seq']}, {meta.get('turn_outcome', 'open')}", file=out)
    else:
        print("  turn              -", file=out)
    if window:
        size = sum(len(member) for member, _ in window)
        print(f"  window            {len(window)} messages, {int(window[0][1])}..{int(window[-1][1])}, {size:,} bytes", file=out)
    else:
        print("  window            empty", file=out)
    legacy = client.hlen(keys.legacy)
    if legacy:
        print(f"  legacy (layout 1) {legacy} messages not yet migrated", file=out)
    chunk_entries = map(ChunkEntry.parse, _index(client, keys.chunk_index))
    large_entries = map(LargeEntry.parse, _index(client, keys.large_index))
    if chunks:
        print(f"  chunks            {client.zcard(keys.chunk_index)} (+ {client.zcard(keys.large_index)} oversized)",
              file=out)
        _list_chunks(chunk_entries, large_entries, out)
    else:
        _sum_chunks(chunk_entries, large_entries, out)


def _index(client: redis.Redis, key: str) -> Iterator[bytes]:
    """An index's members in order of score (a sequence), INDEX_PAGE at a time, each page after
    the last score read, so that members retention deletes meanwhile shift nothing."""
    low: str | float = "-inf"
    while True:
        page = client.zrangebyscore(key, low, "+inf", start=0, num=INDEX_PAGE, withscores=True)
        yield from (member for member, _ in page)
        if len(page) < INDEX_PAGE:
            return
        low = f"({int(page[-1][1])}"


def _list_chunks(chunk_entries: Iterable[ChunkEntry], large_entries: Iterable[LargeEntry], out: IO[str]) -> None:
    for chunk in chunk_entries:
        print(f"    chunk {chunk.first:>8}  {chunk.first}..{chunk.last}  {chunk.count} messages"
              f"  {chunk.bytes:,} bytes  {chunk.media:,} media", file=out)
    for entry in large_entries:
        print(f"    large {entry.sequence:>8}  1 message  {entry.bytes:,} bytes  {entry.media:,} media", file=out)


def _sum_chunks(chunk_entries: Iterable[ChunkEntry], large_entries: Iterable[LargeEntry], out: IO[str]) -> None:
    """Two lines for the chunks, one for the oversized messages, however many there are."""
    count = messages = size = media = 0
    first = last = None
    fewest = most = smallest = largest = None
    for chunk in chunk_entries:
        count += 1
        messages += chunk.count
        size += chunk.bytes
        media += chunk.media
        first = chunk.first if first is None else first
        last = chunk.last
        fewest = chunk.count if fewest is None else min(fewest, chunk.count)
        most = chunk.count if most is None else max(most, chunk.count)
        smallest = chunk.bytes if smallest is None else min(smallest, chunk.bytes)
        largest = chunk.bytes if largest is None else max(largest, chunk.bytes)
    if count:
        print(f"  chunks            {count:,}: {messages:,} messages ({first}..{last}), {size:,} bytes,"
              f" {media:,} media bytes", file=out)
        print(f"                    each {_span(fewest, most)} messages, {_span(smallest, largest)} bytes", file=out)
    else:
        print("  chunks            none", file=out)
    large = list(large_entries)
    if large:
        sequences = [entry.sequence for entry in large]
        shown = ", ".join(map(str, sequences[:5])) + (f" and {len(large) - 5} more" if len(large) > 5 else "")
        where = "message in its own chunk" if len(large) == 1 else "messages in chunks of their own"
        print(f"  oversized         {len(large):,} {where} ({shown}),"
              f" {sum(e.bytes for e in large):,} bytes, {sum(e.media for e in large):,} media bytes", file=out)
    else:
        print("  oversized         none", file=out)
    if count or large:
        print("  (--chunks lists each chunk)", file=out)


def _span(low: int, high: int) -> str:
    return f"{low:,}" if low == high else f"{low:,} to {high:,}"


BACKUP_FORMAT = 1


class Progress:
    """Progress of a long command on standard error: a bar redrawn in place on a terminal, and
    one line every `every` seconds (and a last one) elsewhere, so a log gets lines, not one line
    of carriage returns."""

    def __init__(self, label: str, total: int | None, out: IO[str], every: float = 5.0,
                 terminal: bool | None = None, unit: str = "messages") -> None:
        self.label, self.total, self.out, self.every, self.unit = label, total, out, every, unit
        self.terminal = out.isatty() if terminal is None else terminal
        self.done = self.already = 0
        self._last = time.monotonic()
        self._shown_at: int | None = None  # the count last shown

    def update(self, new: int, already: int = 0) -> None:
        self.done += new + already
        self.already += already
        now = time.monotonic()
        if now - self._last >= (0.1 if self.terminal else self.every):
            self._last = now
            self._show()

    def close(self) -> None:
        """The last count, once (a terminal's bar only if it was drawn), then the bar's newline."""
        if self._shown_at != self.done and (self._shown_at is not None or not self.terminal):
            self._show()
        if self.terminal and self._shown_at is not None:
            print(file=self.out, flush=True)

    def _show(self) -> None:
        self._shown_at = self.done
        total = self.total
        counted = f"{self.done:,}/{total:,}" if total else f"{self.done:,}"
        if self.terminal:
            width = 30
            filled = int(width * min(self.done, total) / total) if total else 0
            print(f"\r  {self.label} [{'#' * filled}{'.' * (width - filled)}] {counted}", end="", file=self.out, flush=True)
        else:
            share = f" ({100 * min(self.done, total) // total}%)" if total else ""
            print(f"  {self.label}: {counted} {self.unit}{share}", file=self.out, flush=True)


def export(store: MessageStore, thread_id: str, out: IO[str], progress_out: IO[str] | None = None,
           every: float = 5.0) -> int:
    """Writes a backup of the thread: a header line with its state (BackupState), then one line
    per kept message, oldest first: the message in the list API's shape (its seq_id is its
    sequence) with `turn_id` added for a message of a turn. Refuses (nothing to trust) if the
    thread changed while it was read."""
    thread = _existing_thread(store, thread_id)
    ref = ThreadRef.of(store.config, thread_id)
    state = store.run(core.backup_state(ref))
    stats = thread.stats()
    header = {
        "kvstore_backup": BACKUP_FORMAT,
        "thread": thread_id,
        "messages": stats.stored_messages,
        "last_seq": state.last_seq,
        "summary_last": state.summary_last,
        "summary_seq": state.summary_seq,
        "deleted_before": state.deleted_before,
        "turn": {"id": state.turn_id, "seq": state.turn_seq, "outcome": state.turn_outcome} if state.turn_id else None,
        "turns": [
            {"id": t.turn_id, "start": t.start, "outcome": t.outcome, "replies": t.replies, "first": t.first,
             "count": t.count, "first_seq": t.first_seq, "last_seq": t.last_seq}
            for t in state.turns
        ],
    }
    out.write(json.dumps(header, separators=(",", ":")) + "\n")
    progress = Progress("exported", stats.stored_messages, progress_out or sys.stderr, every)
    count = 0
    unreadable: list[int] = []
    for page in store.stream(core.pages(ref)):
        unreadable += page.unreadable
        for message in page.messages:
            line = message.to_dict()
            turn_id = state.turn_of(message.seq_id)
            if turn_id is not None:
                line["turn_id"] = turn_id
            out.write(json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n")
            count += 1
        progress.update(len(page.messages) + len(page.unreadable))
    progress.close()
    if unreadable:
        shown = ", ".join(map(str, unreadable[:10])) + (" ..." if len(unreadable) > 10 else "")
        raise errors.RecordError(
            f"{len(unreadable)} stored records of {thread_id!r} could not be read and are not in the backup"
            f" (sequences {shown}; docs/RELIABILITY.md, 'One bad record')"
        )
    if not state.same_moment(store.run(core.backup_state(ref))):
        raise errors.KVStoreError(
            f"thread {thread_id!r} changed while it was exported: the file is not one state of it; export it"
            " again while nothing writes to it"
        )
    return count


@dataclass
class ImportProgress:
    """How far an import got, for a report when it is interrupted."""

    stored: int = 0  # messages the server stored now
    already: int = 0  # messages found already stored (an earlier import, or a replay)
    lines: int = 0  # lines read
    sending: int = 0  # messages of the call in flight (stored or not: unknown if interrupted)


def import_lines(store: MessageStore, thread_id: str, lines: IO[str], progress: ImportProgress | None = None,
                 progress_out: IO[str] | None = None, every: float = 5.0, total: int | None = None) -> int:
    """Imports a file `export` wrote (a backup: restored at its sequences, with its summary,
    turns and deleted_before) or plain JSON-lines messages (appended). Either way a message
    already stored is skipped and counted as such, so an import interrupted anywhere is finished
    by running it again. Returns the messages stored now."""
    check_thread_id(thread_id)
    progress = progress or ImportProgress()
    numbered = _numbered(lines, progress)
    first = next(numbered, None)
    if first is None:
        return 0
    number, text = first
    try:
        head = json.loads(text)
    except ValueError:
        head = None
    bar_out = progress_out or sys.stderr
    if isinstance(head, dict) and "kvstore_backup" in head:
        if head["kvstore_backup"] != BACKUP_FORMAT:
            raise errors.InvalidMessage(f"line {number}: backup format {head['kvstore_backup']!r} is not one this"
                                        f" version reads ({BACKUP_FORMAT})")
        bar = Progress("restored", head.get("messages"), bar_out, every)
        _restore(store, thread_id, head, numbered, progress, bar)
    else:
        bar = Progress("imported", total, bar_out, every)
        _append_plain(store, thread_id, itertools.chain([first], numbered), progress, bar)
    bar.close()
    return progress.stored


def _numbered(lines: Iterable[str], progress: ImportProgress) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(lines, 1):
        progress.lines = number
        if line.strip():
            yield number, line


def _restore(store: MessageStore, thread_id: str, head: dict, numbered: Iterator[tuple[int, str]],
             progress: ImportProgress, bar: Progress) -> None:
    ref = ThreadRef.of(store.config, thread_id)
    turn = head.get("turn") or {}
    state = core.BackupState(
        last_seq=int(head["last_seq"]), summary_last=int(head.get("summary_last") or 0),
        summary_seq=int(head.get("summary_seq") or 0), deleted_before=int(head.get("deleted_before") or 0),
        turn_id=turn.get("id", ""), turn_seq=int(turn.get("seq") or 0), turn_outcome=turn.get("outcome", ""),
        turns=[core.TurnRecord(t["id"], t["start"], t["outcome"], t["replies"], t["first"], t["count"],
                               t["first_seq"], t["last_seq"]) for t in head.get("turns", [])],
    )

    def items() -> Iterator[core.BackedUpMessage]:
        for number, text in numbered:
            try:
                body = json.loads(text)
                turn_id = body.pop("turn_id", None) if isinstance(body, dict) else None
                message = parse_message(body)
            except (ValueError, errors.InvalidMessage) as exc:
                raise errors.InvalidMessage(f"line {number}: {exc}") from None
            if message.seq_id is None:
                raise errors.InvalidMessage(f"line {number}: a backup's message must have its seq_id")
            yield core.BackedUpMessage(message.seq_id, turn_id, message)

    checked = False
    for run in core.restore_runs(items()):
        if not checked:
            store.run(core.check_restore_target(ref, run[0]))
            checked = True
        progress.sending = len(run)
        new, already = store.run(core.restore_run(ref, run))
        progress.sending = 0
        progress.stored += new
        progress.already += already
        bar.update(new, already)
    if not checked and state.last_seq:
        # A backup without messages (all deleted or removed) restores over an empty thread only.
        stats = store.thread(thread_id).stats()
        if stats.next_sequence > 1 and stats.next_sequence - 1 != state.last_seq:
            raise errors.RestoreConflict(f"thread {thread_id!r} already holds messages: restore into an empty thread")
    store.run(core.restore_state(ref, state))


def _append_plain(store: MessageStore, thread_id: str, numbered: Iterable[tuple[int, str]],
                  progress: ImportProgress, bar: Progress) -> None:
    """Plain message lines (an older export, or a file of your own), appended in batches. A
    message without an id gets one made from its line's text (and how many identical lines came
    before), so importing the same file again finds it stored."""
    thread = store.thread(thread_id)
    ref = ThreadRef.of(store.config, thread_id)
    seen: dict[str, int] = {}

    def send(batch: list[Message]) -> None:
        stored = store.run(core.stored_ids(ref, [m.id for m in batch]))
        todo = [m for m in batch if m.id not in stored]
        count(0, len(batch) - len(todo))
        if not todo:
            return
        progress.sending = len(todo)
        try:
            result = thread.append(todo)
            progress.sending = 0
            count(0, len(todo)) if result.replayed else count(len(todo), 0)
        except (errors.OtidConflict, errors.DuplicateMessageId):
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
        update: dict = {"seq_id": None}
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


def layout_1_threads(store: MessageStore) -> list[str]:
    """Thread ids of the namespace that still hold a layout-1 legacy hash (SCAN, no KEYS).

    The operator's path: SCAN needs +scan, which the app user's ACL does not grant (it would list
    every namespace's keys).
    """
    prefix = f"{store.config.namespace}:{{"
    found = []
    try:
        for key in store.client.scan_iter(match=f"{store.config.namespace}:{{*}}:messages", count=1000):
            text = key.decode()
            found.append(text[len(prefix) : text.rindex("}:messages")])
    except redis.exceptions.NoPermissionError:
        raise errors.PermissionDenied(
            "finding layout-1 threads needs SCAN, which this user may not run: name the threads"
            " (kvstore migrate THREAD ... or --threads-from FILE), or run it as an admin user with +scan"
        ) from None
    return sorted(found)


def thread_ids_from(lines: Iterable[str]) -> list[str]:
    """One thread id a line (blank lines and # comments skipped), all checked before any is used."""
    ids = []
    for number, line in enumerate(lines, 1):
        thread_id = line.strip()
        if not thread_id or thread_id.startswith("#"):
            continue
        try:
            check_thread_id(thread_id)
        except errors.InvalidThreadId as exc:
            raise errors.InvalidThreadId(f"line {number}: {exc}") from None
        ids.append(thread_id)
    return ids


def migrate_all(store: MessageStore, out: IO[str] = sys.stdout) -> int:
    """Migrates the layout-1 threads SCAN finds (needs +scan)."""
    threads = layout_1_threads(store)
    if not threads:
        print("no layout-1 threads in this namespace", file=out)
        return 0
    _migrate(store, threads, out)
    print(f"migrated {len(threads)} threads to layout 2", file=out)
    return len(threads)


def migrate_named(store: MessageStore, thread_ids: list[str], out: IO[str] = sys.stdout) -> int:
    """Migrates the named threads without SCAN: the app user's ACL is enough.

    Threads already in layout 2 are counted and left alone; threads not found are named in one
    error once the others are done.
    """
    for thread_id in thread_ids:
        check_thread_id(thread_id)
    todo, current, missing = [], 0, []
    for thread_id in dict.fromkeys(thread_ids):
        keys = store.thread(thread_id).keys
        if store.client.exists(keys.legacy):
            todo.append(thread_id)
        elif store.client.exists(keys.meta):
            current += 1
        else:
            missing.append(thread_id)
    if todo:
        _migrate(store, todo, out)
    print(f"migrated {len(todo)} threads to layout 2 ({current} already in layout 2)", file=out)
    if missing:
        names = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise errors.KVStoreError(
            f"{len(missing)} of {len(todo) + current + len(missing)} threads not found in namespace"
            f" {store.config.namespace!r}: {names}"
        )
    return len(todo)


def _migrate(store: MessageStore, threads: list[str], out: IO[str], every: float = 5.0) -> None:
    """Migrates each thread to the end, with progress by thread (a bar on a terminal, else a line
    every `every` seconds)."""
    progress = Progress("migrated", len(threads), out, every, unit="threads")
    for thread_id in threads:
        thread = store.thread(thread_id)
        while thread.migrate(max_calls=10) == 10:
            progress.update(0)  # a long thread: the bar or the line may be due
        progress.update(1)
    progress.close()
