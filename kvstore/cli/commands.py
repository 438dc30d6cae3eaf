"""What the `kvstore` subcommands do, apart from parsing arguments (kvstore/cli/main.py)."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Literal
from urllib.parse import urlsplit

import redis

from .. import admin, errors
from ..admin import CURRENT_LAYOUT as CURRENT
from ..admin import ChunkEntry, LargeEntry, check_thread_id
from ..config import StoreConfig
from ..store import MessageStore, Thread
from .progress import Progress
from .server import DataDirServer, data_dir_server


@contextmanager
def open_store(
    url: str | None,
    namespace: str,
    data_dir: str,
    history_checks: Literal["off", "strict"] = "off",
) -> Iterator[MessageStore]:
    """A store on `url`, or without a URL on the server over `data_dir`: the one already running
    there, or an embedded one this command starts and stops."""
    config = StoreConfig(namespace=namespace, history_checks=history_checks)
    if url is not None:  # an empty one is refused by connect, not taken as none
        client = connect(url)
        try:
            yield MessageStore(client, config)
        finally:
            client.close()
        return
    with data_dir_server(data_dir) as server:
        client = connect(server.url)
        try:
            print(f"kvstore: no --url: {_which(server, client)}", file=sys.stderr, flush=True)
            yield MessageStore(client, config)
        finally:
            client.close()


def _which(server: DataDirServer, client: redis.Redis) -> str:
    """The data dir's server, where its data lives and how long it runs: one line, so that a
    command meant for another server does not read an empty one without a word."""
    keys = f"{client.dbsize():,} keys"
    if server.started:
        return (
            f"started the embedded Valkey on {server.url}, data in {server.data_dir} (AOF on,"
            f" {keys}); it stops when this command ends (give --url for another server)"
        )
    return (
        f"using the embedded Valkey on {server.url} serving {server.data_dir} (pid {server.pid},"
        f" {keys}; give --url for another server)"
    )


def connect(url: str) -> redis.Redis:
    """A client on the server at `url` (refusing a bad URL or an unreachable server)."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3)
    except ValueError as exc:
        raise errors.ConfigError(f"bad URL {url!r}: {exc}") from None
    try:
        client.ping()
    except redis.RedisError as exc:
        raise errors.ServerError(f"cannot reach {url}: {exc}") from None
    return client


def shown_url(url: str) -> str:
    """The URL with its password, if any, masked."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


@contextmanager
def replaced_file(path: str) -> Iterator[IO[str]]:
    """A text file that replaces `path` whole, or not at all: it is written beside it and takes
    its place (its mode kept, a symlink to it followed) only once the block ends without an
    error; an error or Ctrl-C removes it, leaving `path` as it was. A path that is no regular
    file (a FIFO, /dev/stdout) is written in place: there is nothing there to keep."""
    real = os.path.realpath(path)
    if os.path.exists(real) and not os.path.isfile(real):
        with open(real, "w", encoding="utf-8") as out:
            yield out
        return
    directory, name = os.path.split(real)
    temporary = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
    try:  # 0o666 less the umask, as open() makes a new file
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:  # named by the file asked for, not by the temporary one
        raise OSError(exc.errno, exc.strerror, path) from None
    try:
        with open(fd, "w", encoding="utf-8") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())  # on disk before it replaces a good file
        with contextlib.suppress(FileNotFoundError):
            os.chmod(temporary, stat.S_IMODE(os.stat(real).st_mode))
        os.replace(temporary, real)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    """The rename made durable (best effort: not every file system lets a directory be fsynced)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def existing_thread(store: MessageStore, thread_id: str, owner: str | None = None) -> Thread:
    thread = store.thread(thread_id, owner=owner)
    if not admin.presence(store, thread_id, owner=owner).exists:
        raise errors.KVStoreError(
            f"thread {thread_id!r} not found in namespace {store.config.namespace!r}"
        )
    return thread


def inspect(
    store: MessageStore,
    thread_id: str,
    out: IO[str] | None = None,
    chunks: bool = False,
    owner: str | None = None,
) -> None:
    """A thread's layout: a summary of its chunks, or with `chunks` one line for each, to `out`
    (default: sys.stdout as it is when called, the CLI's guarded stream)."""
    out = out or sys.stdout
    thread = existing_thread(store, thread_id, owner)
    stats = thread.stats()
    found = admin.containers(store, thread_id, owner=owner)
    meta = found.meta
    print(
        f"thread {thread_id}{f' of owner {owner}' if owner else ''}"
        f" (namespace {store.config.namespace}, layout {stats.layout_version})",
        file=out,
    )
    print(
        f"  messages stored   {stats.stored_messages} ({stats.stored_bytes:,} record bytes)",
        file=out,
    )
    print(f"  next sequence     {stats.next_sequence}", file=out)
    if "restoring" in meta:
        print(
            "  restore           unfinished: run the same import or fork again (writes are refused until then)",
            file=out,
        )
    print(f"  deleted before    {stats.deleted_before_sequence or '-'}", file=out)
    print(f"  inline media      {stats.media_bytes:,} bytes", file=out)
    print(f"  tokens            {stats.tokens:,}", file=out)
    summary = meta.get("summary_last")
    print(
        f"  summary           {'covers ..' + summary + ' (message ' + meta['summary_seq'] + ')' if summary else '-'}",
        file=out,
    )
    if meta.get("turn_id"):
        print(
            f"  turn              {meta['turn_id']}: replies from {meta['turn_seq']}, {meta.get('turn_outcome', 'open')}",
            file=out,
        )
    else:
        print("  turn              -", file=out)
    _print_buffers(found, stats.layout_version, out)
    if found.legacy_messages:
        print(f"  legacy (layout 1) {found.legacy_messages} messages not yet migrated", file=out)
    chunk_entries = admin.chunk_entries(store, thread_id, owner=owner)
    large_entries = admin.oversized_entries(store, thread_id, owner=owner)
    if chunks:
        print(f"  chunks            {found.chunks} (+ {found.oversized} oversized)", file=out)
        _list_chunks(chunk_entries, large_entries, out)
    else:
        _sum_chunks(chunk_entries, large_entries, out)


def _print_buffers(found: admin.Containers, layout: int | None, out: IO[str]) -> None:
    """The window and the open chunk: where a thread's newest messages wait to be rolled up."""
    meta, window = found.meta, found.window_sequences
    # Layout 3 has no window but the one a layout-2 thread left, drained by its next writes.
    if window:
        print(
            f"  window            {len(window)} messages, {window[0]}..{window[-1]},"
            f" {found.window_bytes:,} bytes"
            f"{' (from layout 2, moved by the next writes)' if layout == 3 else ''}",
            file=out,
        )
    elif layout != 3:
        print("  window            empty", file=out)
    if int(meta.get("open_count", "0")) > 0:
        print(
            f"  open chunk        {meta['open_count']} messages, {meta['open_first']}..{meta['open_last']},"
            f" {int(meta.get('open_bytes', '0')):,} bytes",
            file=out,
        )
    elif layout == 3:
        print("  open chunk        empty", file=out)


def _list_chunks(
    chunk_entries: Iterable[ChunkEntry], large_entries: Iterable[LargeEntry], out: IO[str]
) -> None:
    for chunk in chunk_entries:
        print(
            f"    chunk {chunk.first:>8}  {chunk.first}..{chunk.last}  {chunk.count} messages"
            f"  {chunk.bytes:,} bytes  {chunk.media:,} media",
            file=out,
        )
    for entry in large_entries:
        print(
            f"    large {entry.sequence:>8}  1 message  {entry.bytes:,} bytes  {entry.media:,} media",
            file=out,
        )


def _sum_chunks(
    chunk_entries: Iterable[ChunkEntry], large_entries: Iterable[LargeEntry], out: IO[str]
) -> None:
    """Two lines for the chunks, one for the oversized messages, however many there are."""
    chunks = list(chunk_entries)
    if chunks:
        counts, sizes = [chunk.count for chunk in chunks], [chunk.bytes for chunk in chunks]
        print(
            f"  chunks            {len(chunks):,}: {sum(counts):,} messages"
            f" ({chunks[0].first}..{chunks[-1].last}), {sum(sizes):,} bytes,"
            f" {sum(chunk.media for chunk in chunks):,} media bytes",
            file=out,
        )
        print(
            f"                    each {_span(min(counts), max(counts))} messages,"
            f" {_span(min(sizes), max(sizes))} bytes",
            file=out,
        )
    else:
        print("  chunks            none", file=out)
    large = list(large_entries)
    if large:
        sequences = [entry.sequence for entry in large]
        shown = ", ".join(map(str, sequences[:5])) + (
            f" and {len(large) - 5} more" if len(large) > 5 else ""
        )
        where = "message in its own chunk" if len(large) == 1 else "messages in chunks of their own"
        print(
            f"  oversized         {len(large):,} {where} ({shown}),"
            f" {sum(e.bytes for e in large):,} bytes, {sum(e.media for e in large):,} media bytes",
            file=out,
        )
    else:
        print("  oversized         none", file=out)
    if chunks or large:
        print("  (--chunks lists each chunk)", file=out)


def _span(low: int, high: int) -> str:
    return f"{low:,}" if low == high else f"{low:,} to {high:,}"


def unmigrated_threads(store: MessageStore) -> list[str]:
    """Thread ids of the namespace migrate has work on (admin: needs +scan)."""
    return admin.unmigrated_threads(store)


def thread_ids_in(path: str) -> list[str]:
    """The thread ids of `--threads-from`: a UTF-8 file's, or standard input's for `-`."""
    if path == "-":
        # Read as bytes where it can be, so that standard input is UTF-8 as a file is.
        return thread_ids_from(_utf8_lines(getattr(sys.stdin, "buffer", sys.stdin), path))
    with open(path, "rb") as lines:
        return thread_ids_from(_utf8_lines(lines, path))


def _utf8_lines(lines: Iterable[bytes | str], path: str) -> Iterator[str]:
    for number, line in enumerate(lines, 1):
        try:
            text = line if isinstance(line, str) else line.decode("utf-8")
        except UnicodeDecodeError:
            raise errors.ConfigError(
                f"--threads-from {path}: line {number} is not UTF-8 text"
            ) from None
        yield text


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
    """Migrates the threads SCAN finds not yet in the current layout with an empty window
    (needs +scan)."""
    threads = unmigrated_threads(store)
    if not threads:
        print(f"no threads to migrate in this namespace (all in layout {CURRENT})", file=out)
        return 0
    _migrate(store, threads, out)
    print(f"migrated {len(threads)} threads to layout {CURRENT}", file=out)
    return len(threads)


def migrate_named(store: MessageStore, thread_ids: list[str], out: IO[str] = sys.stdout) -> int:
    """Migrates the named threads without SCAN: the app user's ACL is enough.

    Threads already in the current layout with an empty window are counted and left alone;
    threads not found are named in one error once the others are done.
    """
    for thread_id in thread_ids:
        check_thread_id(thread_id)
    todo, current, missing = [], 0, []
    for thread_id in dict.fromkeys(thread_ids):
        found = admin.presence(store, thread_id)
        if not found.exists:
            missing.append(thread_id)
        elif found.current:
            current += 1
        else:
            todo.append(thread_id)
    if todo:
        _migrate(store, todo, out)
    print(
        f"migrated {len(todo)} threads to layout {CURRENT} ({current} already in layout {CURRENT})",
        file=out,
    )
    if missing:
        names = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
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
