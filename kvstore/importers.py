"""Moving conversations in from the Redis chat histories in use, and back out to LangChain.

Sources
    LangChain community's ``RedisChatMessageHistory`` keeps a session in one Redis list,
    ``message_store:<session>``, each element a message as ``messages_to_dict`` writes it
    (``{"type": "human", "data": {...}}``), pushed with LPUSH: newest first. LlamaIndex's
    ``RedisChatStore`` keeps a chat in one list per key (the key as the caller named it), each
    element a ``ChatMessage`` as JSON (``{"role": "user", "additional_kwargs": {}, "blocks":
    [...]}``), pushed with RPUSH: oldest first.

    :func:`import_langchain` and :func:`import_llamaindex` find the sessions with SCAN (lists
    only, matching ``pattern``), and store each as a thread of the store (its namespace). The
    thread id is the session id (LangChain: the key without ``message_store:``) or the key
    (LlamaIndex), or what ``thread_id(key)`` returns. Source keys are only read (LLEN, LRANGE).

Types
    ==================================  ======================================================
    source                              kvstore
    ==================================  ======================================================
    human / user                        user_message (text; image parts as images)
    ai / assistant (chatbot, model)     assistant_message for its text, then one
                                        tool_call_message per tool call
    tool (and function)                 tool_return_message (``status`` error kept)
    system (and developer)              system_message
    LlamaIndex thinking block           reasoning_message, before the assistant's text
    LangChain ChatMessage (any role)    the message of its role: user, assistant, system, or
                                        user_message named after an unknown role
    ==================================  ======================================================

    Nothing is dropped. Every imported message carries ``metadata``: ``source``
    (``langchain`` / ``llamaindex``), ``source_position`` (the message's position in the
    session, the oldest 0) and, when the source message holds anything the kvstore messages do
    not (its LangChain ``id``, ``response_metadata``, ``usage_metadata``, an ``artifact``, a
    content block of another kind, a LlamaIndex audio or document block …), ``source_fields``:
    those fields as compact JSON, split over ``source_fields``, ``source_fields_2`` … (512
    characters each, the metadata limit) up to SOURCE_FIELDS_MAX characters. A message holding
    more than that is refused with InvalidMessage and its session reported as failed, never cut.

Bounded, idempotent, resumable
    Each session is read SOURCE_PAGE messages at a time and written in appends of at most
    ``batch_messages`` kvstore messages (and IMPORT_BATCH_BYTES), a source message never split
    between two appends. Every message id is made from the source, the key, the position and a
    digest of the session up to that message (``message-<uuid5>``), so running an import again
    stores nothing twice, and an id found stored proves the session unchanged up to it. A run
    reads the session and checks the thread's newest message: it is the session's message at its
    position (as the session is now), and the messages after it are appended; or every message
    of the session is stored (the thread went on after the import), and nothing is. Otherwise
    the session is reported ``SourceChanged`` and nothing of it written: it was cleared and
    refilled, edited or cut since it was imported (a list rewritten in place, as LlamaIndex's
    ``delete_message`` does, included), or the thread went on before the session's new
    messages. An interrupted run leaves each thread holding a prefix of its session; the next
    run finishes it. Positions count from the oldest message, which neither source moves when
    it appends.

Errors
    A session that cannot be imported is reported in its SessionImport (``error``,
    ``error_type``) and the next one is imported: any typed kvstore error (``HistoryConflict``
    in a strict store, ``InvalidMessage``, ``MessageTooLarge`` …), ``SourceChanged``, a source
    record that is not a message, a key that is no list any more (redis-py's ResponseError).
    A failure of the server or of a connection (ServerError and its ConnectionFailed,
    OutcomeUnknown, NotDurable, redis-py's ConnectionError and TimeoutError) ends the import
    with that error, as KeyboardInterrupt or a cancellation does; the next run finishes it.

Back out
    :func:`to_langchain` writes messages in LangChain's message JSON (``messages_to_dict``):
    an imported message gets back every field it had (``messages_from_dict`` of the output
    equals the original messages); a message stored natively maps as above, reversed, an
    assistant step (text and tool calls) making one ``ai`` message; reasoning, hidden reasoning,
    events and approvals have no LangChain type and are left out (:func:`langchain_left_out`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, Literal, NamedTuple

import redis
from pydantic import BaseModel

from . import errors
from ._engine import core
from ._engine.layout.keys import check_thread_id
from .convert import SUMMARY_PREFIX
from .errors import SourceChanged
from .messages import (
    ApprovalRequestMessage,
    ApprovalResponseMessage,
    AssistantMessage,
    Base64Image,
    BaseMessage,
    EventMessage,
    HiddenReasoningMessage,
    ImageContent,
    Message,
    ReasoningMessage,
    SummaryMessage,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolCallMessage,
    ToolReturnMessage,
    URLImage,
    UserMessage,
)

__all__ = [
    "IMPORT_BATCH_BYTES",
    "SOURCE_FIELDS_MAX",
    "SOURCE_PAGE",
    "SessionImport",
    "SourceChanged",
    "append_missing",
    "append_missing_async",
    "find_sessions",
    "import_langchain",
    "import_langchain_async",
    "import_llamaindex",
    "import_llamaindex_async",
    "langchain_left_out",
    "to_langchain",
]

Source = Literal["langchain", "llamaindex"]

SOURCE_PAGE = 500
"""Source messages read per LRANGE."""
IMPORT_BATCH_BYTES = 4 * 1024 * 1024
"""The most JSON bytes of messages one import append carries (the store's own limits apply too)."""
_FIELD_PIECE = 512  # messages.MAX_METADATA_VALUE_CHARS
_FIELD_PIECES = 14  # 16 metadata pairs, less `source` and `source_position`
SOURCE_FIELDS_MAX = _FIELD_PIECE * _FIELD_PIECES
"""The most characters of a source message's fields kvstore keeps in its metadata."""

# Ids of imported messages: uuid5 of (source, key, position, part, digest of the session up to
# the message) in this namespace.
_IMPORT_IDS = uuid.UUID("5d0f3b8e-7a2c-4f61-b9e4-3c8a1d6e2f70")
_LANGCHAIN_PREFIX = "message_store:"


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


def import_langchain(
    store: Any,
    source: redis.Redis,
    pattern: str | None = None,
    key_prefix: str = _LANGCHAIN_PREFIX,
    thread_id: Callable[[str], str] | None = None,
    batch_messages: int = 100,
    progress: Progress | None = None,
    *,
    sessions: list[SessionImport] | None = None,
) -> list[SessionImport]:
    """Imports every LangChain ``RedisChatMessageHistory`` session of ``source`` (a redis-py
    client) matching ``pattern`` (default ``<key_prefix>*``) into ``store`` (a MessageStore);
    returns one SessionImport per session, in key order. Idempotent and resumable (module
    docstring).

    A session that cannot be imported is reported with its ``error`` (and ``error_type``) and
    the others go on: a message the store refuses (``HistoryConflict`` in a strict store,
    ``InvalidMessage``, ``MessageTooLarge`` …), a source record that is not a message, a source
    that changed since an earlier import (``SourceChanged``), a key that is no list any more.
    A failure of the server or of a connection (ServerError, ConnectionFailed, OutcomeUnknown,
    NotDurable, redis-py's ConnectionError) ends the import with that error, the session it
    met reported with it too: run the import again to finish. Pass a list as ``sessions`` to
    see the sessions done until then: each SessionImport is added to it as its session starts.

    Example::

        for session in import_langchain(store, redis.Redis.from_url("redis://old:6379/0")):
            print(session.thread_id, session.imported, session.error or "ok")
    """
    return _drive(
        _langchain(
            store, pattern, key_prefix, thread_id, batch_messages, progress, _list(sessions)
        ),
        store,
        source,
    )


def import_llamaindex(
    store: Any,
    source: redis.Redis,
    pattern: str = "*",
    thread_id: Callable[[str], str] | None = None,
    batch_messages: int = 100,
    progress: Progress | None = None,
    *,
    sessions: list[SessionImport] | None = None,
) -> list[SessionImport]:
    """Imports every LlamaIndex ``RedisChatStore`` chat of ``source`` (one list per key) whose
    key matches ``pattern`` into ``store``; the thread id is the key (or ``thread_id(key)``).
    A list whose first element is not a LlamaIndex ``ChatMessage`` is reported as not a chat
    and left alone. Otherwise as :func:`import_langchain`.

    Example: ``import_llamaindex(store, source, pattern="chat:*")``"""
    return _drive(
        _import(
            store,
            "llamaindex",
            pattern,
            thread_id or _same,
            batch_messages,
            progress,
            _list(sessions),
        ),
        store,
        source,
    )


async def import_langchain_async(
    store: Any,
    source: Any,
    pattern: str | None = None,
    key_prefix: str = _LANGCHAIN_PREFIX,
    thread_id: Callable[[str], str] | None = None,
    batch_messages: int = 100,
    progress: Progress | None = None,
    *,
    sessions: list[SessionImport] | None = None,
) -> list[SessionImport]:
    """:func:`import_langchain` into an AsyncMessageStore, from a ``redis.asyncio`` client.
    Cancelled or timed out at any await, it leaves what a sync import interrupted leaves: the
    same call again finishes it.

    Example: ``await import_langchain_async(store, redis.asyncio.Redis.from_url(old_url))``"""
    return await _drive_async(
        _langchain(
            store, pattern, key_prefix, thread_id, batch_messages, progress, _list(sessions)
        ),
        store,
        source,
    )


async def import_llamaindex_async(
    store: Any,
    source: Any,
    pattern: str = "*",
    thread_id: Callable[[str], str] | None = None,
    batch_messages: int = 100,
    progress: Progress | None = None,
    *,
    sessions: list[SessionImport] | None = None,
) -> list[SessionImport]:
    """:func:`import_llamaindex` into an AsyncMessageStore, from a ``redis.asyncio`` client.

    Example: ``await import_llamaindex_async(store, source, pattern="chat:*")``"""
    return await _drive_async(
        _import(
            store,
            "llamaindex",
            pattern,
            thread_id or _same,
            batch_messages,
            progress,
            _list(sessions),
        ),
        store,
        source,
    )


def find_sessions(source: redis.Redis, pattern: str) -> list[str]:
    """The keys of ``source`` that match ``pattern`` and hold lists, sorted (SCAN, bounded replies)."""
    return _drive(_find(pattern), None, source)


def append_missing(thread: Any, messages: list[Message]) -> tuple[int, int]:
    """Appends, in one call, those of ``messages`` (each with its id set) that the thread does not
    hold yet; returns (stored, already). Made for messages whose ids are made from their source
    (an import, or ``from_chat_completions(..., id_prefix=...)`` of a resent conversation): the
    ones stored before are skipped, the rest appended after them.

    Example::

        new, old = append_missing(thread, from_chat_completions(request_messages, id_prefix=conversation_id))
    """
    new = _drive(_append_new(thread._ref, messages), thread._store, None)
    return len(new), len(messages) - len(new)


async def append_missing_async(thread: Any, messages: list[Message]) -> tuple[int, int]:
    """:func:`append_missing` on an AsyncThread.

    Example: ``new, old = await append_missing_async(thread, messages)``"""
    new = await _drive_async(_append_new(thread._ref, messages), thread._store, None)
    return len(new), len(messages) - len(new)


# --- the import, as steps the sync and the async drivers take -----------------------------------
#
# Each generator below yields a _Source step (a read of the source client) or a core operation
# (for the store to run), and receives its reply, or has its exception thrown in.


class _Source(NamedTuple):
    command: str
    args: tuple[Any, ...]


def _drive(steps: Generator[Any, Any, Any], store: Any, source: Any) -> Any:
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = steps.throw(failure) if failure is not None else steps.send(reply)
        except StopIteration as done:
            return done.value
        failure = None
        try:
            reply = (
                getattr(source, step.command)(*step.args)
                if isinstance(step, _Source)
                else store.run(step)
            )
        except BaseException as exc:  # the generator decides: one session's error, or the end
            failure = exc


async def _drive_async(steps: Generator[Any, Any, Any], store: Any, source: Any) -> Any:
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = steps.throw(failure) if failure is not None else steps.send(reply)
        except StopIteration as done:
            return done.value
        failure = None
        try:
            if isinstance(step, _Source):
                reply = await getattr(source, step.command)(*step.args)
            else:
                reply = await store.run(step)
        except BaseException as exc:  # cancellation included: the session says it was cut
            failure = exc


def _find(pattern: str) -> Generator[Any, Any, list[str]]:
    keys: set[str] = set()
    cursor = 0
    while True:
        cursor, found = yield _Source("scan", (cursor, pattern, 1000, "list"))
        keys.update(_text(key) for key in found)
        if int(cursor) == 0:
            return sorted(keys)


def _append_new(ref: Any, messages: list[Message]) -> Generator[Any, Any, list[Message]]:
    """The messages append_missing stored now."""
    ids = [message.id for message in messages]
    if any(message_id is None for message_id in ids):
        raise errors.InvalidMessage("append_missing needs every message's id set")
    for _ in range(3):
        stored = yield core.stored_ids(ref, ids)
        todo = [message for message in messages if message.id not in stored]
        if not todo:
            return []
        try:
            result = yield core.append(ref, todo, None)
        except errors.MessageIdRepeated:
            raise
        except errors.DuplicateMessageId:
            continue  # another process stored some of them meanwhile: look again
        return [] if result.replayed else todo
    raise errors.DuplicateMessageId(
        "messages kept being stored by another process while appending them"
    )


def _langchain(
    store: Any,
    pattern: str | None,
    key_prefix: str,
    thread_id: Callable[[str], str] | None,
    batch_messages: int,
    progress: Progress | None,
    results: list[SessionImport],
) -> Generator:
    def thread_of(key: str) -> str:
        return (
            key[len(key_prefix) :]
            if key.startswith(key_prefix) and len(key) > len(key_prefix)
            else key
        )

    return _import(
        store,
        "langchain",
        pattern or f"{_glob_escape(key_prefix)}*",
        thread_id or thread_of,
        batch_messages,
        progress,
        results,
    )


def _same(key: str) -> str:
    return key


def _list(sessions: list[SessionImport] | None) -> list[SessionImport]:
    return [] if sessions is None else sessions


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
    total = yield _Source("llen", (key,))
    result.source_messages = total
    if total == 0:
        return
    if kind == "llamaindex" and not _is_llamaindex((yield _Source("lindex", (key, 0)))):
        raise errors.InvalidMessage(
            "not a LlamaIndex chat (its first element is not a ChatMessage)"
        )
    # The thread's newest message says where an earlier run stopped: the session's message at
    # `resume`, when it was imported from this source. Every id carries a digest of the session
    # up to its message, so finding that id, as the session is now, proves the whole prefix
    # unchanged; the messages after it are then the ones to store.
    page = yield core.list_page(ref, None, None, 1, "desc", None)
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
    verified = empty  # the thread holds a prefix of the session as it is now
    digest = b""
    batch: list[Message] = []
    covered = 0  # source messages in `batch`
    size = 0

    def flush() -> Generator[Any, Any, None]:
        nonlocal batch, covered, size
        if batch:
            new = yield from _append_new(ref, batch)
            sources = _sources_in(
                new
            )  # an append is atomic: whole source messages are stored or not
            result.stored_messages += len(new)
            result.imported += sources
            result.already += covered - sources
            if progress:
                progress(key, covered)
        batch, covered, size = [], 0, 0

    for start in range(0, total, SOURCE_PAGE):
        page_records = yield from _page(kind, key, start, min(start + SOURCE_PAGE, total), total)
        for position, raw in enumerate(page_records, start):
            digest = _chain(digest, raw)
            if not verified:
                if resume is None or position < resume:
                    continue
                if newest.id not in _ids(kind, key, position, raw, digest):
                    raise SourceChanged(
                        _changed(
                            key,
                            result,
                            f"its newest message, the session's message {position}"
                            f" when imported, is not the same (or one before it"
                            f" is not)",
                        )
                    )
                verified = True
                result.already = position + 1
                if progress:
                    progress(key, position + 1)
                continue
            messages = _map(kind, key, position, _parse(key, position, raw), digest)
            weight = sum(len(message.to_json()) for message in messages)
            if batch and (
                len(batch) + len(messages) > batch_messages or size + weight > IMPORT_BATCH_BYTES
            ):
                yield from flush()
            batch.extend(messages)
            covered += 1
            size += weight
    yield from flush()
    if (
        not verified
    ):  # the thread's newest message is not the session's: fine if all of it is stored
        if not (yield core.stored_ids(ref, [_message_id(kind, key, total - 1, 0, digest)])):
            raise SourceChanged(
                _changed(
                    key,
                    result,
                    "it holds messages that are not the session's as it is now"
                    " (its newest message was not imported from it)",
                )
            )
        result.already = total
        if progress:
            progress(key, total)


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
        return {
            message.id for message in _map(kind, key, position, _parse(key, position, raw), digest)
        }
    except errors.InvalidMessage:
        return set()


def _sources_in(messages: list[Message]) -> int:
    return len({message.metadata["source_position"] for message in messages})


def _page(
    kind: Source, key: str, start: int, end: int, total: int
) -> Generator[Any, Any, list[bytes]]:
    """The session's messages at positions start..end-1, oldest first, as stored (JSON bytes)."""
    if kind == "langchain":  # newest first: position p is index -(p + 1), stable under LPUSH
        page = (yield _Source("lrange", (key, -end, -start - 1)))[::-1]
    else:
        page = yield _Source("lrange", (key, start, end - 1))
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


def _message_id(kind: Source, key: str, position: int, part: int, digest: bytes) -> str:
    return f"message-{uuid.uuid5(_IMPORT_IDS, f'{kind}:{position}:{part}:{digest.hex()}:{key}')}"


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
            metadata.update(_split_fields(fields, key, position))
        out.append(
            message.model_copy(
                update={"id": _message_id(kind, key, position, part, digest), "metadata": metadata}
            )
        )
    return out


def _split_fields(fields: dict[str, Any], key: str, position: int) -> dict[str, str]:
    text = json.dumps(fields, separators=(",", ":"), ensure_ascii=False)
    if len(text) > SOURCE_FIELDS_MAX:
        raise errors.InvalidMessage(
            f"{key}, message {position}: its fields without a kvstore equivalent take {len(text):,} characters"
            f" of JSON; at most {SOURCE_FIELDS_MAX:,} fit in a message's metadata"
        )
    pieces = [text[start : start + _FIELD_PIECE] for start in range(0, len(text), _FIELD_PIECE)]
    return {
        ("source_fields" if number == 1 else f"source_fields_{number}"): piece
        for number, piece in enumerate(pieces, 1)
    }


def _joined_fields(metadata: Mapping[str, str] | None) -> dict[str, Any]:
    if not metadata or "source_fields" not in metadata:
        return {}
    text = metadata["source_fields"]
    number = 2
    while f"source_fields_{number}" in metadata:
        text += metadata[f"source_fields_{number}"]
        number += 1
    return json.loads(text)


# --- LangChain --------------------------------------------------------------------------------

# What messages_from_dict fills in when a field is absent: a field at its default is not kept.
_LANGCHAIN_DEFAULTS: dict[str, Any] = {
    "additional_kwargs": {},
    "response_metadata": {},
    "name": None,
    "id": None,
    "example": False,
    "tool_calls": [],
    "invalid_tool_calls": [],
    "usage_metadata": None,
    "artifact": None,
    "status": "success",
    "tool_call_chunks": [],
    "chunk_position": None,
}
_MISSING = object()
_CORE_TYPES = ("human", "ai", "system", "tool")
_CHUNK_TYPES = {
    "AIMessageChunk": "ai",
    "HumanMessageChunk": "human",
    "SystemMessageChunk": "system",
    "ToolMessageChunk": "tool",
}
_CHAT_ROLES = {"user": "human", "human": "human", "assistant": "ai", "ai": "ai", "system": "system"}


def _from_langchain(record: Any) -> tuple[list[Message], dict[str, Any]]:
    """The kvstore messages of one LangChain record, and the source fields they do not carry:
    every field that their export (:func:`to_langchain`) would not give back as it was."""
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("type"), str)
        or not isinstance(record.get("data"), dict)
    ):
        raise ValueError("not a LangChain message record ({'type': ..., 'data': {...}})")
    kind, data = record["type"], record["data"]
    base = _CHUNK_TYPES.get(kind, kind)
    if base == "chat":
        base = _CHAT_ROLES.get(data.get("role"), "human")
    elif base == "function":
        base = "tool"
    elif base not in _CORE_TYPES:  # remove, or a type of a later LangChain: kept whole
        messages = [SystemMessage(content=_lc_text(data.get("content", "")))]
        return messages, {"type": kind, "data": data}
    messages = _lc_messages(base, data)
    if base == "human" and kind == "chat":
        messages[0].name = (
            data.get("role") if data.get("role") not in _CHAT_ROLES else data.get("name")
        )
    if kind in ("chat", "function"):
        return messages, {
            "type": kind,
            "data": data,
        }  # kept whole: their fields differ from the core types'
    rebuilt = _lc_data(base, messages)
    fields = {
        name: value
        for name, value in data.items()
        if name != "type" and rebuilt.get(name, _LANGCHAIN_DEFAULTS.get(name, _MISSING)) != value
    }
    if kind != base:
        fields["type"] = kind
    return messages, fields


def _lc_messages(base: str, data: dict[str, Any]) -> list[Message]:
    content = data.get("content", "")
    name = {"name": data["name"]} if isinstance(data.get("name"), str) else {}
    if base == "human":
        return [UserMessage(content=_lc_user_content(content), **name)]
    if base == "system":
        return [SystemMessage(content=_lc_text(content), **name)]
    if base == "tool":
        status = data.get("status") if data.get("status") in ("success", "error") else "success"
        return [
            ToolReturnMessage(
                status=status,
                tool_call_id=data.get("tool_call_id") or "",
                tool_return=_lc_text(content),
                **name,
            )
        ]
    made: list[Message] = []
    calls = [call for call in data.get("tool_calls") or [] if isinstance(call, dict)]
    if content not in ("", []) or not calls:
        made.append(AssistantMessage(content=_lc_assistant_content(content), **name))
    for call in calls:
        arguments = call.get("args")
        made.append(
            ToolCallMessage(
                tool_call=ToolCall(
                    name=str(call.get("name") or ""),
                    tool_call_id=str(call.get("id") or ""),
                    arguments=json.dumps(arguments, ensure_ascii=False)
                    if isinstance(arguments, dict)
                    else "{}",
                ),
                **name,
            )
        )
    return made


def _lc_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part
            if isinstance(part, str)
            else str(part.get("text", ""))
            if isinstance(part, dict) and part.get("type") == "text"
            else ""
            for part in content
        )
    return ""


def _lc_assistant_content(content: Any) -> str | list[TextContent]:
    if isinstance(content, str):
        return content
    return [
        TextContent(text=part if isinstance(part, str) else str(part.get("text", "")))
        for part in content or []
        if isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")
    ]


def _lc_user_content(content: Any) -> str | list[Any]:
    if isinstance(content, str):
        return content
    parts: list[Any] = []
    for part in content or []:
        if isinstance(part, str):
            parts.append(TextContent(text=part))
        elif isinstance(part, dict) and part.get("type") == "text":
            parts.append(TextContent(text=str(part.get("text", ""))))
        elif isinstance(part, dict) and (image := _lc_image(part)) is not None:
            parts.append(image)
        # anything else is kept with the source fields (the whole content differs)
    return parts


def _lc_image(part: dict[str, Any]) -> ImageContent | None:
    """An image part in OpenAI's shape (image_url) or LangChain's standard one (type image)."""
    from .convert import _image_source

    if part.get("type") == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        detail = image.get("detail") if isinstance(image, dict) else None
        if isinstance(url, str):
            return ImageContent(source=_image_source(url, detail))
    if part.get("type") == "image":
        if isinstance(part.get("url"), str):
            return ImageContent(source=URLImage(url=part["url"]))
        data = part.get("base64") or (
            part.get("data") if part.get("source_type") == "base64" else None
        )
        if isinstance(data, str):
            return ImageContent(
                source=Base64Image(data=data, media_type=part.get("mime_type") or "image/png")
            )
    return None


def _lc_data(base: str, messages: list[BaseMessage]) -> dict[str, Any]:
    """The LangChain `data` a group of kvstore messages makes (the core types' fields)."""
    first = messages[0]
    data: dict[str, Any] = {}
    if first.name:
        data["name"] = first.name
    if base == "human":
        data["content"] = _lc_content(first.content)
    elif base == "system":
        data["content"] = (
            first.content if isinstance(first, SystemMessage) else SUMMARY_PREFIX + first.summary
        )
    elif base == "tool":
        data.update(content=first.tool_return, tool_call_id=first.tool_call_id, status=first.status)
    else:
        text = next((m.content for m in messages if isinstance(m, AssistantMessage)), "")
        data["content"] = (
            text if isinstance(text, str) else [{"type": "text", "text": p.text} for p in text]
        )
        data["tool_calls"] = [
            {
                "name": call.name,
                "args": _arguments(call.arguments),
                "id": call.tool_call_id,
                "type": "tool_call",
            }
            for message in messages
            if isinstance(message, ToolCallMessage)
            for call in _calls(message)
        ]
    return data


def _lc_content(content: str | list[Any]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, TextContent):
            parts.append({"type": "text", "text": part.text})
        else:
            source = part.source
            if isinstance(source, URLImage):
                url = source.url
            elif source.data is not None:
                url = f"data:{source.media_type};base64,{source.data}"
            else:
                url = f"file:{source.file_id}"
            image = {"url": url}
            if getattr(source, "detail", None):
                image["detail"] = source.detail
            parts.append({"type": "image_url", "image_url": image})
    return parts


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}


def _calls(message: ToolCallMessage) -> list[ToolCall]:
    calls = message.tool_calls if isinstance(message.tool_calls, list) else [message.tool_call]
    return [call for call in calls if isinstance(call, ToolCall)]


_LC_LEFT_OUT = (
    ReasoningMessage,
    HiddenReasoningMessage,
    EventMessage,
    ApprovalRequestMessage,
    ApprovalResponseMessage,
)


def langchain_left_out(messages: Iterable[Message]) -> int:
    """How many of ``messages`` :func:`to_langchain` leaves out (no LangChain type)."""
    return sum(isinstance(message, _LC_LEFT_OUT) for message in messages)


def to_langchain(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The messages in LangChain's message JSON (what ``messages_to_dict`` writes), oldest first:
    ``messages_from_dict`` of the result gives LangChain messages. Imported messages get back
    every field they had; see the module docstring for the rest.

    Example::

        from langchain_core.messages import messages_from_dict
        history = messages_from_dict(to_langchain(thread.iter()))
    """
    out: list[dict[str, Any]] = []
    group: list[BaseMessage] = []

    def flush() -> None:
        if group:
            out.append(_lc_record(group))
            group.clear()

    for message in messages:
        if isinstance(message, _LC_LEFT_OUT):
            continue
        origin = _origin(message)
        if origin is None and isinstance(message, ToolReturnMessage) and message.tool_returns:
            flush()  # several tools' returns in one message: a LangChain tool message each
            out.extend(
                {
                    "type": "tool",
                    "data": {
                        "type": "tool",
                        "tool_call_id": item.tool_call_id,
                        "status": item.status,
                        "content": item.tool_return
                        if isinstance(item.tool_return, str)
                        else _lc_content(item.tool_return),
                    },
                }
                for item in message.tool_returns
            )
            continue
        if group:
            previous = group[-1]
            same_source = origin is not None and origin == _origin(previous)
            same_step = (
                origin is None
                and _origin(previous) is None
                and isinstance(message, ToolCallMessage)
                and isinstance(previous, (AssistantMessage, ToolCallMessage))
                and (
                    previous.step_id is None
                    or message.step_id is None
                    or previous.step_id == message.step_id
                )
            )
            if not (same_source or same_step):
                flush()
        group.append(message)
    flush()
    return out


def _origin(message: BaseMessage) -> tuple[str, str] | None:
    metadata = message.metadata or {}
    if metadata.get("source") == "langchain" and "source_position" in metadata:
        return metadata["source"], metadata["source_position"]
    return None


def _lc_record(group: list[BaseMessage]) -> dict[str, Any]:
    first = group[0]
    if isinstance(first, UserMessage):
        base = "human"
    elif isinstance(first, (SystemMessage, SummaryMessage)):
        base = "system"
    elif isinstance(first, ToolReturnMessage):
        base = "tool"
    else:
        base = "ai"
    fields = _joined_fields(first.metadata) if _origin(first) else {}
    if "data" in fields:  # a type kept whole
        return {"type": fields["type"], "data": fields["data"]}
    data = _lc_data(base, group)
    kind = fields.pop("type", base)
    data.update(fields)
    data["type"] = kind
    return {"type": kind, "data": data}


# --- LlamaIndex -------------------------------------------------------------------------------

_LLAMA_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "chatbot": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
}
_CONSUMED_KWARGS = ("tool_calls", "tool_call_id", "name")


def _from_llamaindex(record: Any) -> tuple[list[Message], dict[str, Any]]:
    """The kvstore messages of one LlamaIndex ChatMessage, and the fields they do not carry."""
    if not isinstance(record, dict) or "role" not in record:
        raise ValueError("not a LlamaIndex ChatMessage ({'role': ..., 'blocks': [...]})")
    role = record["role"]
    kind = _LLAMA_ROLES.get(role, "user")
    kwargs = record.get("additional_kwargs") or {}
    fields: dict[str, Any] = {}
    if kind != role:
        fields["role"] = role
    rest = {name: value for name, value in kwargs.items() if name not in _CONSUMED_KWARGS}
    if rest:
        fields["additional_kwargs"] = rest
    for name, value in record.items():
        if name not in ("role", "additional_kwargs", "blocks", "content") and value is not None:
            fields[name] = value
    blocks = record.get("blocks")
    if blocks is None:  # an older ChatMessage: `content` text
        blocks = (
            []
            if record.get("content") is None
            else [{"block_type": "text", "text": record["content"]}]
        )
    texts: list[TextContent | ImageContent] = []
    reasoning: list[Message] = []
    calls: list[ToolCall] = []
    kept: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        block_type = block.get("block_type") if isinstance(block, dict) else None
        if block_type == "text":
            texts.append(TextContent(text=block.get("text") or ""))
        elif (
            block_type == "image" and kind == "user" and (image := _llama_image(block)) is not None
        ):
            texts.append(image)
        elif block_type == "thinking" and kind == "assistant":
            reasoning.append(ReasoningMessage(reasoning=block.get("content") or ""))
            extra = {
                k: v
                for k, v in block.items()
                if k not in ("block_type", "content") and v not in (None, {})
            }
            if extra:
                kept.append({"index": index, "block": block})
        elif block_type == "tool_call" and kind == "assistant":
            arguments = block.get("tool_kwargs")
            calls.append(
                ToolCall(
                    name=str(block.get("tool_name") or ""),
                    tool_call_id=str(block.get("tool_call_id") or ""),
                    arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
                )
            )
        else:
            kept.append({"index": index, "block": block})
    if kept:
        fields["blocks"] = kept
    name = kwargs.get("name") if isinstance(kwargs.get("name"), str) else None
    named = {"name": name} if name else {}
    text_only = [part.text for part in texts if isinstance(part, TextContent)]
    if kind == "system":
        return [SystemMessage(content="\n".join(text_only), **named)], fields
    if kind == "tool":
        return [
            ToolReturnMessage(
                status="success",
                tool_call_id=str(kwargs.get("tool_call_id") or ""),
                tool_return="\n".join(text_only),
                **named,
            )
        ], fields
    if kind == "user":
        content: Any = (
            texts[0].text if len(texts) == 1 and isinstance(texts[0], TextContent) else texts
        )
        return [UserMessage(content=content, **named)], fields
    for call in kwargs.get("tool_calls") or []:
        function = call.get("function") or {} if isinstance(call, dict) else {}
        calls.append(
            ToolCall(
                name=str(function.get("name") or ""),
                tool_call_id=str(call.get("id") or ""),
                arguments=str(function.get("arguments") or "{}"),
            )
        )
    made: list[Message] = list(reasoning)
    if text_only or not calls:
        made.append(
            AssistantMessage(
                content=text_only[0]
                if len(text_only) == 1
                else [TextContent(text=text) for text in text_only],
                **named,
            )
        )
    made.extend(ToolCallMessage(tool_call=call, **named) for call in calls)
    return made, fields


def _llama_image(block: dict[str, Any]) -> ImageContent | None:
    detail = {"detail": block["detail"]} if isinstance(block.get("detail"), str) else {}
    if isinstance(block.get("image"), str):
        return ImageContent(
            source=Base64Image(
                data=block["image"],
                media_type=block.get("image_mimetype") or "application/octet-stream",
                **detail,
            )
        )
    if isinstance(block.get("url"), str) and not detail:
        return ImageContent(source=URLImage(url=block["url"]))
    return None


# --- helpers ----------------------------------------------------------------------------------


def _text(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key


def _glob_escape(text: str) -> str:
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)
