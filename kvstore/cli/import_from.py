"""`kvstore import-from {langchain,llamaindex,openai-agents}` and `kvstore export --format langchain`.

The work is kvstore.importers'; here are the progress bar, the summary table and the export's
file (one JSON array, as LangChain's `messages_to_dict` makes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO

import redis

from .. import errors
from ..admin import check_thread_id
from ..importers import (
    SessionImport,
    default_thread_id,
    find_sessions,
    import_langchain,
    import_llamaindex,
    import_openai_agents,
    langchain_left_out,
    to_langchain,
)
from ..importers.api import default_pattern
from ..importers.openai_agents import SESSION_KEY_PREFIX
from ..importers.records import Source
from ..store import MessageStore
from .commands import existing_thread
from .progress import Progress, TextOut

TABLE_ROWS = 50  # sessions listed one a line; the rest are counted


def import_from(
    store: MessageStore,
    source: redis.Redis,
    kind: str,
    pattern: str | None,
    key_prefix: str | None,
    batch_messages: int,
    out: IO[str],
    progress_out: IO[str],
    every: float = 5.0,
    renames: dict[str, str] | None = None,
) -> int:
    """Imports every session of `source` matching `pattern`, with a progress bar (source
    messages) and a summary table; returns the exit status (1 if a session failed, or a
    session `renames` names was not found). `renames` maps a source key to the thread id it
    is stored as (the others keep their default one). An import that a failed server or
    connection (or Ctrl-C) ends shows the sessions done, then raises."""
    renames = checked_renames(renames or {})
    source_kind = _SOURCES[kind]
    key_prefix = key_prefix if key_prefix is not None else _KEY_PREFIXES.get(source_kind, "")
    pattern = pattern or default_pattern(source_kind, key_prefix)
    keys = find_sessions(source, pattern)
    total = _total(source, keys)
    bar = Progress("imported", total, progress_out, every)
    done = lambda key, count: bar.update(count)  # noqa: E731
    results: list[SessionImport] = []
    try:
        _run(store, source, kind, pattern, key_prefix, batch_messages, renames, done, results)
    except BaseException as exc:
        bar.close()
        if results:  # what was done; main() says why it ended
            _table(results, store.config.namespace, out)
        if isinstance(exc, Exception):  # a failed server or connection (main() says so for Ctrl-C)
            print(
                "kvstore: the import ended early; run the same command again to finish it (nothing is stored"
                " twice)",
                file=progress_out,
                flush=True,
            )
        raise
    bar.close()
    _table(results, store.config.namespace, out)
    _say_ttl(results, store, progress_out)
    unknown = sorted(set(renames) - {result.source_key for result in results})
    if unknown:
        print(
            f"kvstore: --rename names {len(unknown)} key(s) no session matching the pattern has:"
            f" {', '.join(map(repr, unknown[:5]))}",
            file=progress_out,
        )
    return 1 if unknown or any(result.error for result in results) else 0


_SOURCES: dict[str, Source] = {
    "langchain": "langchain",
    "llamaindex": "llamaindex",
    "openai-agents": "openai_agents",
}
_KEY_PREFIXES: dict[Source, str] = {
    "langchain": "message_store:",
    "openai_agents": SESSION_KEY_PREFIX,
}


def _say_ttl(results: list[SessionImport], store: MessageStore, out: IO[str]) -> None:
    """Sources that expire keep expiring here only with the store's thread_ttl: said when unset."""
    ttls = [r.source_ttl_ms for r in results if r.source_ttl_ms is not None]
    if ttls and store.config.thread_ttl is None:
        print(
            f"kvstore: {len(ttls)} source session(s) had a time to live (up to"
            f" {max(ttls) // 1000:,} s left); the imported threads have none: pass --thread-ttl"
            " SECONDS (an idle expiry, as the source's) to carry it over",
            file=out,
        )


def _run(
    store: MessageStore,
    source: redis.Redis,
    kind: str,
    pattern: str,
    key_prefix: str,
    batch_messages: int,
    renames: dict[str, str],
    progress: Callable[[str, int], None],
    results: list[SessionImport],
) -> None:
    source_kind = _SOURCES[kind]

    def thread_id(key: str) -> str:
        return renames[key] if key in renames else default_thread_id(source_kind, key, key_prefix)

    if kind == "langchain":
        import_langchain(
            store,
            source,
            pattern,
            key_prefix=key_prefix,
            thread_id=thread_id,
            batch_messages=batch_messages,
            progress=progress,
            sessions=results,
        )
    elif kind == "openai-agents":
        import_openai_agents(
            store,
            source,
            pattern,
            key_prefix=key_prefix,
            thread_id=thread_id,
            batch_messages=batch_messages,
            progress=progress,
            sessions=results,
        )
    else:
        import_llamaindex(
            store,
            source,
            pattern,
            thread_id=thread_id,
            batch_messages=batch_messages,
            progress=progress,
            sessions=results,
        )


def checked_renames(renames: dict[str, str]) -> dict[str, str]:
    """`renames` checked before anything is read: each new name a thread id, no two the same."""
    seen: dict[str, str] = {}
    for key, thread_id in renames.items():
        try:
            check_thread_id(thread_id)
        except errors.InvalidThreadId as exc:
            raise errors.InvalidThreadId(f"--rename {key!r}: {exc}") from None
        if thread_id in seen:
            raise errors.ConfigError(
                f"--rename gives {seen[thread_id]!r} and {key!r} the same thread id {thread_id!r}"
            )
        seen[thread_id] = key
    return renames


def read_renames(pairs: list[list[str]] | None, path: str | None) -> dict[str, str]:
    """The renames of `--rename KEY THREAD` (each pair) and of `--rename-file` (a JSON object of
    source key to thread id), the pairs winning."""
    renames: dict[str, str] = {}
    if path:
        with open(path, "rb") as file:
            data = file.read()
        try:
            loaded = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise errors.ConfigError(
                f"--rename-file {path}: not UTF-8 text (at byte {exc.start})"
            ) from None
        except RecursionError:
            raise errors.ConfigError(f"--rename-file {path}: not JSON (nested too deep)") from None
        except ValueError as exc:
            raise errors.ConfigError(f"--rename-file {path}: not JSON ({exc})") from None
        if not isinstance(loaded, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in loaded.items()
        ):
            raise errors.ConfigError(
                f"--rename-file {path}: not a JSON object of source key to thread id"
            )
        renames.update(loaded)
    renames.update({key: thread_id for key, thread_id in pairs or []})
    return renames


def _total(source: redis.Redis, keys: list[str]) -> int:
    total = 0
    for start in range(0, len(keys), 1000):
        with source.pipeline(transaction=False) as pipe:
            for key in keys[start : start + 1000]:
                pipe.llen(key)
            # a key that is no list any more is reported by the import, as that session's error
            total += sum(
                count for count in pipe.execute(raise_on_error=False) if isinstance(count, int)
            )
    return total


def _table(results: list[SessionImport], namespace: str, out: IO[str]) -> None:
    if not results:
        print("no sessions found", file=out)
        return
    width = min(48, max(len(r.source_key) for r in results[:TABLE_ROWS]))
    print(
        f"{'source key':<{width}}  {'thread':<{width}}  {'messages':>9}  {'imported':>9}  {'already':>9}  status",
        file=out,
    )
    for result in results[:TABLE_ROWS]:
        status = (
            f"failed: {result.error}"
            if result.error
            else f"left alone: {result.skipped}"
            if result.skipped
            else "ok"
        )
        print(
            f"{_cut(result.source_key, width):<{width}}  {_cut(result.thread_id or '-', width):<{width}}"
            f"  {result.source_messages:>9,}  {result.imported:>9,}  {result.already:>9,}  {status}",
            file=out,
        )
    if len(results) > TABLE_ROWS:
        print(f"... and {len(results) - TABLE_ROWS} more sessions", file=out)
    failed = sum(1 for r in results if r.error)
    skipped = sum(1 for r in results if r.skipped)
    print(
        f"{len(results)} sessions into namespace {namespace}, {sum(r.source_messages for r in results):,} source"
        f" messages: {sum(r.imported for r in results):,} imported, {sum(r.already for r in results):,} already"
        f" stored ({sum(r.stored_messages for r in results):,} kvstore messages written)"
        + (f"; {skipped} left alone (not chats)" if skipped else "")
        + (f"; {failed} failed" if failed else ""),
        file=out,
    )
    misnamed = sum(1 for r in results if r.error_type == "InvalidThreadId")
    if misnamed:
        print(
            f"{misnamed} session(s) named by no valid thread id: import them under another name"
            " with --rename SOURCE_KEY THREAD_ID (or --rename-file FILE, a JSON object)",
            file=out,
        )


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def export_langchain(
    store: MessageStore, thread_id: str, out: TextOut, owner: str | None = None
) -> tuple[int, int]:
    """Writes the thread (the owner's, with `owner`) as LangChain's message JSON: one array, a
    message a line. Returns (messages written, kvstore messages left out: no LangChain type)."""
    thread = existing_thread(store, thread_id, owner)
    messages = list(thread.iter())
    records = to_langchain(messages)
    out.write("[")
    for number, record in enumerate(records):
        out.write(
            ("\n" if number == 0 else ",\n")
            + json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        )
    out.write("\n]\n")
    return len(records), langchain_left_out(messages)
