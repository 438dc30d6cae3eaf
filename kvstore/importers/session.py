"""One import run as steps: find the sessions, and store each session's messages the thread
does not hold yet (the package docstring says how)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import Any

import redis
from pydantic import BaseModel

from .. import errors
from .._engine import core
from .._engine.drivers import Step
from .._engine.layout.keys import check_thread_id
from .._engine.text import text
from ..errors import SourceChanged
from ..messages import (
    Message,
)
from .records import Source, message_id
from .source import (
    SourceRead,
    _chain,
    _ids,
    _is_llamaindex,
    _map,
    _page,
    _parse,
    _source_position,
)

SOURCE_PAGE = 500
"""Source messages read per LRANGE."""
IMPORT_BATCH_BYTES = 4 * 1024 * 1024
"""The most JSON bytes of messages one import append carries (the store's own limits apply too)."""


class SessionImport(BaseModel):
    """What an import did with one source session.

    Example: ``SessionImport(source_key="message_store:s1", thread_id="s1", source_messages=12,
    imported=12, already=0, stored_messages=14)``"""

    source_key: str
    thread_id: str | None = None
    source_messages: int = 0
    """Messages the session held when it was read."""
    imported: int = 0
    """Source messages this run stored."""
    already: int = 0
    """Source messages found stored by an earlier run."""
    stored_messages: int = 0
    """kvstore messages this run stored (a source message with tool calls makes several)."""
    error: str | None = None
    """Why the session was not imported (in full), or None. The messages counted in `imported`
    before the error stay stored."""
    error_type: str | None = None
    """The class of that error: ``SourceChanged``, ``HistoryConflict``, ``InvalidMessage``,
    ``MessageTooLarge``, ``InvalidThreadId`` (the session's name is no thread id: rename it with
    ``thread_id=``), ``ResponseError`` (the source key is not a list any more) …"""
    source_ttl_ms: int | None = None
    """The source key's time to live when it was read, in milliseconds; None when it has none.
    The thread takes the store's ``thread_ttl`` (an idle expiry, as the sources' TTLs are: set
    again on each write), not this: a caller carrying a source's TTL over sets ``thread_ttl`` to
    it (``kvstore import-from --thread-ttl``)."""
    skipped: str | None = None
    """Why the session was left alone, or None: a list that is no chat of the source (LlamaIndex:
    its first element is no ChatMessage, or its first or last has a `type`). Nothing more is
    read, nothing is written, and it is no error."""


Progress = Callable[[str, int], None]
"""Called after each append with the session's key and the source messages it covered."""

# The server or the connection to it failed: every later session would meet it too, so it ends
# the import (the same call again finishes it). Any other error is one session's.
_ABORTS = (
    errors.ServerError,
    errors.OutcomeUnknown,
    errors.NotDurable,
    redis.ConnectionError,
    redis.TimeoutError,
)


# --- the import, as steps the sync and the async drivers take -----------------------------------
#
# Each generator below yields a SourceRead (a read of the source client) or a StoreRun (a core
# operation for the store to run), and receives its reply, or has its exception thrown in.


class StoreRun(Step):
    """A core operation, run by the store the import writes to."""

    __slots__ = ("operation",)

    def __init__(self, operation: Any) -> None:
        self.operation = operation

    def __call__(self, driver: Any) -> Any:
        return driver.store.run(self.operation)


def _find(pattern: str, not_utf8: list[str] | None = None) -> Generator[Any, Any, list[str]]:
    """The list keys matching `pattern`, sorted; a key that is not UTF-8 text names no thread
    and is read by no str: it goes to `not_utf8`, shown with its bad bytes escaped."""
    keys: set[str] = set()
    cursor = 0
    while True:
        cursor, found = yield SourceRead("scan", (cursor, pattern, 1000, "list"))
        for key in found:
            try:
                keys.add(text(key))
            except errors.RecordError:  # not UTF-8
                if not_utf8 is not None:
                    not_utf8.append(key.decode("utf-8", "backslashreplace"))
        if int(cursor) == 0:
            if not_utf8 is not None:
                not_utf8[:] = sorted(set(not_utf8))
            return sorted(keys)


def _append_new(ref: Any, messages: list[Message]) -> Generator[Any, Any, list[Message]]:
    """The messages append_missing stored now."""
    ids = [message.id for message in messages if message.id is not None]
    if len(ids) < len(messages):
        raise errors.InvalidMessage("append_missing needs every message's id set")
    for _ in range(3):
        stored = yield StoreRun(core.stored_ids(ref, ids))
        todo = [message for message in messages if message.id not in stored]
        if not todo:
            return []
        try:
            result = yield StoreRun(core.append(ref, todo, None))
        except errors.MessageIdRepeated:
            raise
        except errors.DuplicateMessageId:
            continue  # another process stored some of them meanwhile: look again
        return [] if result.replayed else todo
    raise errors.DuplicateMessageId(
        "messages kept being stored by another process while appending them"
    )


def _import(
    store: Any,
    kind: Source,
    pattern: str,
    thread_id: Callable[[str], str],
    batch_messages: int,
    progress: Progress | None,
    results: list[SessionImport],
) -> Generator[Any, Any, list[SessionImport]]:
    """Imports every session; `results` grows as they start (so a caller sees them if the import ends early)."""
    if not 1 <= batch_messages <= store.config.max_batch_messages:
        raise errors.ConfigError(f"batch_messages must be 1..{store.config.max_batch_messages}")
    not_utf8: list[str] = []
    for key in (yield from _find(pattern, not_utf8)):
        result = SessionImport(source_key=key)
        results.append(result)
        counted = _Counted(progress)
        try:
            yield from _session(store, kind, key, thread_id, result, batch_messages, counted)
        except (errors.KVStoreError, redis.RedisError) as exc:
            result.error, result.error_type = str(exc), type(exc).__name__
            if isinstance(exc, _ABORTS):
                raise
        except (
            BaseException
        ) as exc:  # KeyboardInterrupt, cancellation: the same call again finishes it
            result.error, result.error_type = (
                f"interrupted ({type(exc).__name__})",
                type(exc).__name__,
            )
            raise
        # A session failed or left alone is done with too: the progress reaches the total.
        counted(key, result.source_messages - counted.reported)
    for shown in not_utf8:
        results.append(
            SessionImport(
                source_key=shown,
                error=f"{shown}: the key is not UTF-8 text, so no thread id is made of it;"
                " rename it (RENAME) to import it",
                error_type="InvalidThreadId",
            )
        )
    return results


def _session(
    store: Any,
    kind: Source,
    key: str,
    thread_id: Callable[[str], str],
    result: SessionImport,
    batch_messages: int,
    progress: Progress,
) -> Generator[Any, Any, None]:
    """One session: counted first (so a session refused below still says what it holds), left
    alone if it is no chat of this source, else stored into its thread."""
    name = _named(thread_id, key)
    with contextlib.suppress(errors.InvalidThreadId):  # refused below, once the session is read
        result.thread_id = check_thread_id(name)
    result.source_messages = total = yield SourceRead("llen", (key,))
    ttl = yield SourceRead("pttl", (key,))
    result.source_ttl_ms = int(ttl) if int(ttl) > 0 else None
    if total == 0:
        return
    if kind == "llamaindex":
        first = yield SourceRead("lindex", (key, 0))
        last = (yield SourceRead("lindex", (key, -1))) if total > 1 else first
        if not _is_llamaindex(first, last):
            # Another list on the server (a LangChain or Agents SDK session, a queue ...): not
            # a chat to import. Its first and last elements tell: a half import helps no one.
            result.thread_id = None
            result.skipped = (
                "not a LlamaIndex chat (its first element is no ChatMessage, or an end has a type)"
            )
            return
    ref = store.thread(check_thread_id(name))._ref
    yield from _import_session(ref, kind, key, total, result, batch_messages, progress)


class _Counted:
    """A session's progress callback, counting what it reported."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress, self.reported = progress, 0

    def __call__(self, key: str, count: int) -> None:
        self.reported += count
        if self.progress and count > 0:
            self.progress(key, count)


def _named(thread_id: Callable[[str], str], key: str) -> str:
    try:
        return thread_id(key)
    except Exception as exc:  # the caller's function: its failure is this session's
        raise errors.InvalidThreadId(
            f"thread_id({key!r}) raised {type(exc).__name__}: {exc}"
        ) from exc


def _import_session(
    ref: Any,
    kind: Source,
    key: str,
    total: int,
    result: SessionImport,
    batch_messages: int,
    progress: Progress | None,
) -> Generator[Any, Any, None]:
    """Stores the session's messages the thread does not hold, after checking that those it holds
    are the session's as it is now (SourceChanged if not)."""
    newest, resume, verified = yield from _resume_point(ref, kind, key, result, total)
    batch = _Batch(ref, key, result, batch_messages, progress)
    digest = b""
    for start in range(0, total, SOURCE_PAGE):
        page_records = yield from _page(kind, key, start, min(start + SOURCE_PAGE, total), total)
        for position, raw in enumerate(page_records, start):
            digest = _chain(digest, raw)
            if verified:
                yield from batch.add((yield from _mapped(batch, kind, key, position, raw, digest)))
            elif resume is not None and position >= resume:
                if newest is None or newest.id not in _ids(kind, key, position, raw, digest):
                    raise SourceChanged(
                        _changed(
                            key,
                            result,
                            f"its newest message, the session's message {position}"
                            " when imported, is not the same (or one before it is not)",
                        )
                    )
                verified = True
                _covered(result, progress, key, position + 1)
    yield from batch.flush()
    if not verified:  # the thread's newest message is not the session's: fine if all is stored
        yield from _check_all_stored(ref, kind, key, total, digest, result)
        _covered(result, progress, key, total)


def _mapped(
    batch: _Batch, kind: Source, key: str, position: int, raw: bytes, digest: bytes
) -> Generator[Any, Any, list[Message]]:
    """The source message at `position` as kvstore messages; one that is none ends the session,
    the messages before it stored first (the report says they are)."""
    try:
        return _map(kind, key, position, _parse(key, position, raw), digest)
    except errors.InvalidMessage:
        yield from batch.flush()
        raise


def _resume_point(
    ref: Any, kind: Source, key: str, result: SessionImport, total: int
) -> Generator[Any, Any, tuple[Message | None, int | None, bool]]:
    """The thread's newest message, its position in the session if it was imported from it, and
    whether the thread is empty (so holds a prefix of the session as it is now)."""
    # The thread's newest message says where an earlier run stopped: the session's message at
    # `resume`, when it was imported from this source. Every id carries a digest of the session
    # up to its message, so finding that id, as the session is now, proves the whole prefix
    # unchanged; the messages after it are then the ones to store.
    page = yield StoreRun(core.list_page(ref, None, None, 1, "desc", None))
    empty = not page.messages and not page.unreadable
    newest = page.messages[0] if page.messages and not page.unreadable else None
    resume = _source_position(newest, kind)
    if resume is not None and resume >= total:
        raise SourceChanged(
            _changed(
                key,
                result,
                f"its newest message is the session's message {resume}, and the"
                f" session holds {total} now",
            )
        )
    return newest, resume, empty


def _check_all_stored(
    ref: Any, kind: Source, key: str, total: int, digest: bytes, result: SessionImport
) -> Generator[Any, Any, None]:
    if not (yield StoreRun(core.stored_ids(ref, [message_id(kind, key, total - 1, 0, digest)]))):
        raise SourceChanged(
            _changed(
                key,
                result,
                "it holds messages that are not the session's as it is now"
                " (its newest message was not imported from it)",
            )
        )


def _covered(result: SessionImport, progress: Progress | None, key: str, count: int) -> None:
    """The session's first `count` messages are found stored."""
    result.already = count
    if progress:
        progress(key, count)


class _Batch:
    """The messages of whole source messages waiting for one append (batch_messages and
    IMPORT_BATCH_BYTES at most, a source message never split between two appends)."""

    def __init__(
        self,
        ref: Any,
        key: str,
        result: SessionImport,
        batch_messages: int,
        progress: Progress | None,
    ) -> None:
        self.ref, self.key, self.result = ref, key, result
        self.limit, self.progress = batch_messages, progress
        self.messages: list[Message] = []
        self.covered = 0  # source messages in `messages`
        self.size = 0

    def add(self, messages: list[Message]) -> Generator[Any, Any, None]:
        """Adds one source message's messages, appending the batch first if they do not fit."""
        weight = sum(len(message.to_json()) for message in messages)
        if self.messages and (
            len(self.messages) + len(messages) > self.limit
            or self.size + weight > IMPORT_BATCH_BYTES
        ):
            yield from self.flush()
        self.messages.extend(messages)
        self.covered += 1
        self.size += weight

    def flush(self) -> Generator[Any, Any, None]:
        if self.messages:
            new = yield from _append_new(self.ref, self.messages)
            sources = _sources_in(
                new
            )  # an append is atomic: whole source messages are stored or not
            self.result.stored_messages += len(new)
            self.result.imported += sources
            self.result.already += self.covered - sources
            if self.progress:
                self.progress(self.key, self.covered)
        self.messages, self.covered, self.size = [], 0, 0


def _changed(key: str, result: SessionImport, why: str) -> str:
    return (
        f"{key} is not what thread {result.thread_id} holds: {why}. The session was cleared and refilled,"
        f" edited or cut since it was imported, or the thread went on without it; nothing was written."
        f" Import it into a fresh thread id (thread_id=, or the CLI's --namespace), or delete the thread"
        f" to import the session as it is now"
    )


def _sources_in(messages: list[Message]) -> int:
    return len({(message.metadata or {})["source_position"] for message in messages})
