"""The import and append entry points, sync and async, over one driver of the import's steps."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

import redis

from .._engine.drivers import AsyncDriver, SyncDriver
from ..messages import (
    Message,
)
from .openai_agents import MESSAGES_SUFFIX, SESSION_KEY_PREFIX, session_id_of
from .records import Source
from .session import Progress, SessionImport, _append_new, _find, _import

_LANGCHAIN_PREFIX = "message_store:"
_Result = TypeVar("_Result")  # what an import's steps return


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


def import_openai_agents(
    store: Any,
    source: redis.Redis,
    pattern: str | None = None,
    key_prefix: str = SESSION_KEY_PREFIX,
    thread_id: Callable[[str], str] | None = None,
    batch_messages: int = 100,
    progress: Progress | None = None,
    *,
    sessions: list[SessionImport] | None = None,
) -> list[SessionImport]:
    """Imports every OpenAI Agents SDK ``RedisSession`` of ``source`` (its items, the list at
    ``<key_prefix>:<session_id>:messages``; default pattern ``<key_prefix>:*:messages``) into
    ``store``; the thread id is the session id (or ``thread_id(key)``). Each item becomes the
    message ``KvstoreSession`` makes of it, so the adapter gives the items back as the SDK
    stored them. Otherwise as :func:`import_langchain`.

    Example: ``import_openai_agents(store, redis.Redis.from_url("redis://old:6379/0"))``"""
    return _drive(
        _openai_agents(
            store, pattern, key_prefix, thread_id, batch_messages, progress, _list(sessions)
        ),
        store,
        source,
    )


async def import_openai_agents_async(
    store: Any,
    source: Any,
    pattern: str | None = None,
    key_prefix: str = SESSION_KEY_PREFIX,
    thread_id: Callable[[str], str] | None = None,
    batch_messages: int = 100,
    progress: Progress | None = None,
    *,
    sessions: list[SessionImport] | None = None,
) -> list[SessionImport]:
    """:func:`import_openai_agents` into an AsyncMessageStore, from a ``redis.asyncio`` client.

    Example: ``await import_openai_agents_async(store, redis.asyncio.Redis.from_url(old_url))``"""
    return await _drive_async(
        _openai_agents(
            store, pattern, key_prefix, thread_id, batch_messages, progress, _list(sessions)
        ),
        store,
        source,
    )


def find_sessions(source: redis.Redis, pattern: str) -> list[str]:
    """The keys of ``source`` that match ``pattern`` and hold lists, sorted (SCAN, bounded
    replies); a key that is not UTF-8 text is left out (an import reports it as failed)."""
    return _drive(_find(pattern), None, source)


def default_thread_id(kind: Source, key: str, key_prefix: str | None = None) -> str:
    """The thread id an import gives the session at ``key`` without ``thread_id=``: LangChain's
    session id (the key without ``key_prefix``), LlamaIndex's key, the Agents SDK's session id
    (``<key_prefix>:<session_id>:messages``; its ``key_prefix`` defaults to ``agents:session``).

    Example: ``default_thread_id("langchain", "message_store:s1") == "s1"``"""
    if kind == "openai_agents":
        return session_id_of(key, SESSION_KEY_PREFIX if key_prefix is None else key_prefix)
    key_prefix = _LANGCHAIN_PREFIX if key_prefix is None else key_prefix
    if kind == "langchain" and key.startswith(key_prefix) and len(key) > len(key_prefix):
        return key[len(key_prefix) :]
    return key


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


class _Import(SyncDriver):
    """Makes an import's steps: reads on `source`, core operations on `store`."""

    def __init__(self, store: Any, source: Any) -> None:
        self.store, self.source = store, source


class _AsyncImport(AsyncDriver):
    """Awaits an import's steps: reads on `source`, core operations on `store`."""

    def __init__(self, store: Any, source: Any) -> None:
        self.store, self.source = store, source


def _drive(steps: Generator[Any, Any, _Result], store: Any, source: Any) -> _Result:
    return _Import(store, source)._finish(steps)


async def _drive_async(steps: Generator[Any, Any, _Result], store: Any, source: Any) -> _Result:
    return await _AsyncImport(store, source)._finish(steps)


def _langchain(
    store: Any,
    pattern: str | None,
    key_prefix: str,
    thread_id: Callable[[str], str] | None,
    batch_messages: int,
    progress: Progress | None,
    results: list[SessionImport],
) -> Generator[Any, Any, list[SessionImport]]:
    def thread_of(key: str) -> str:
        return default_thread_id("langchain", key, key_prefix)

    return _import(
        store,
        "langchain",
        pattern or default_pattern("langchain", key_prefix),
        thread_id or thread_of,
        batch_messages,
        progress,
        results,
    )


def _openai_agents(
    store: Any,
    pattern: str | None,
    key_prefix: str,
    thread_id: Callable[[str], str] | None,
    batch_messages: int,
    progress: Progress | None,
    results: list[SessionImport],
) -> Generator[Any, Any, list[SessionImport]]:
    def thread_of(key: str) -> str:
        return session_id_of(key, key_prefix)

    return _import(
        store,
        "openai_agents",
        pattern or default_pattern("openai_agents", key_prefix),
        thread_id or thread_of,
        batch_messages,
        progress,
        results,
    )


def _same(key: str) -> str:
    return key


def _list(sessions: list[SessionImport] | None) -> list[SessionImport]:
    return [] if sessions is None else sessions


def default_pattern(kind: Source, key_prefix: str) -> str:
    """The SCAN pattern of a source's sessions under `key_prefix` (taken as it is: a glob
    character in it is escaped); LlamaIndex's keys have no prefix: every key, sniffed."""
    if kind == "langchain":
        return f"{_glob_escape(key_prefix)}*"
    if kind == "openai_agents":
        return f"{_glob_escape(key_prefix)}:*{MESSAGES_SUFFIX}"
    return "*"


def _glob_escape(text: str) -> str:
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)
