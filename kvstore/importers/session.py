"""One import run as steps: find the sessions, and store each session's messages the thread
does not hold yet (the package docstring says how)."""

from __future__ import annotations

import hashlib
import json
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
from .langchain import _from_langchain
from .llamaindex import _from_llamaindex
from .records import Source, message_id, split_fields

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
    ``MessageTooLarge``, ``InvalidThreadId``, ``ResponseError`` (the source key is not a list
    any more) …"""


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


class SourceRead(Step):
    """A read of the import's source client: ``source.<command>(*args)``."""

    __slots__ = ("args", "command")

    def __init__(self, command: str, args: tuple[Any, ...]) -> None:
        self.command, self.args = command, args

    def __call__(self, driver: Any) -> Any:
        return getattr(driver.source, self.command)(*self.args)


class StoreRun(Step):
    """A core operation, run by the store the import writes to."""

    __slots__ = ("operation",)

    def __init__(self, operation: Any) -> None:
        self.operation = operation

    def __call__(self, driver: Any) -> Any:
        return driver.store.run(self.operation)


def _find(pattern: str) -> Generator[Any, Any, list[str]]:
    keys: set[str] = set()
    cursor = 0
    while True:
        cursor, found = yield SourceRead("scan", (cursor, pattern, 1000, "list"))
        keys.update(text(key) for key in found)
        if int(cursor) == 0:
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
    for key in (yield from _find(pattern)):
        result = SessionImport(source_key=key)
        results.append(result)
        try:
            result.thread_id = check_thread_id(_named(thread_id, key))
            yield from _import_session(
                store.thread(result.thread_id)._ref, kind, key, result, batch_messages, progress
            )
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
    return results


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
    result: SessionImport,
    batch_messages: int,
    progress: Progress | None,
) -> Generator[Any, Any, None]:
    """Stores the session's messages the thread does not hold, after checking that those it holds
    are the session's as it is now (SourceChanged if not)."""
    total = yield SourceRead("llen", (key,))
    result.source_messages = total
    if total == 0:
        return
    if kind == "llamaindex" and not _is_llamaindex((yield SourceRead("lindex", (key, 0)))):
        raise errors.InvalidMessage(
            "not a LlamaIndex chat (its first element is not a ChatMessage)"
        )
    newest, resume, verified = yield from _resume_point(ref, kind, key, result, total)
    batch = _Batch(ref, key, result, batch_messages, progress)
    digest = b""
    for start in range(0, total, SOURCE_PAGE):
        page_records = yield from _page(kind, key, start, min(start + SOURCE_PAGE, total), total)
        for position, raw in enumerate(page_records, start):
            digest = _chain(digest, raw)
            if verified:
                yield from batch.add(_map(kind, key, position, _parse(key, position, raw), digest))
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


def _source_position(message: Message | None, kind: Source) -> int | None:
    metadata = (message.metadata or {}) if message is not None else {}
    position = metadata.get("source_position", "")
    return int(position) if metadata.get("source") == kind and position.isdigit() else None


def _ids(kind: Source, key: str, position: int, raw: bytes, digest: bytes) -> set[str]:
    """The ids an import gives the source message at `position` (none if it is not one)."""
    try:
        mapped = _map(kind, key, position, _parse(key, position, raw), digest)
        return {message.id for message in mapped if message.id is not None}
    except errors.InvalidMessage:
        return set()


def _sources_in(messages: list[Message]) -> int:
    return len({(message.metadata or {})["source_position"] for message in messages})


def _page(
    kind: Source, key: str, start: int, end: int, total: int
) -> Generator[Any, Any, list[bytes]]:
    """The session's messages at positions start..end-1, oldest first, as stored (JSON bytes)."""
    if kind == "langchain":  # newest first: position p is index -(p + 1), stable under LPUSH
        page: list[bytes] = (yield SourceRead("lrange", (key, -end, -start - 1)))[::-1]
    else:
        page = yield SourceRead("lrange", (key, start, end - 1))
    if len(page) != end - start:
        raise SourceChanged(f"{key} changed while it was read (LLEN {total}, then fewer)")
    return page


def _parse(key: str, position: int, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise errors.InvalidMessage(f"{key}, message {position}: not JSON ({exc})") from None


def _chain(digest: bytes, raw: bytes) -> bytes:
    """The digest of a session up to a message: of the one before it and of its record."""
    return hashlib.blake2b(digest + raw, digest_size=16).digest()


def _is_llamaindex(raw: bytes | None) -> bool:
    try:
        record = json.loads(raw) if raw is not None else None
    except ValueError:
        return False
    return (
        isinstance(record, dict)
        and "role" in record
        and ("blocks" in record or "content" in record)
    )


def _map(kind: Source, key: str, position: int, record: Any, digest: bytes) -> list[Message]:
    try:
        made, fields = (_from_langchain if kind == "langchain" else _from_llamaindex)(record)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # ValidationError included
        raise errors.InvalidMessage(
            f"{key}, message {position}: cannot be read as a {kind} message ({exc})"
        ) from None
    out = []
    for part, message in enumerate(made):
        metadata = {"source": kind, "source_position": str(position)}
        if part == 0 and fields:
            metadata.update(split_fields(fields, key, position))
        out.append(
            message.model_copy(
                update={"id": message_id(kind, key, position, part, digest), "metadata": metadata}
            )
        )
    return out
