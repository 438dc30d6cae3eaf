"""`kvstore import-from {langchain,llamaindex}` and `kvstore export --format langchain`.

The work is kvstore.importers'; here are the progress bar, the summary table and the export's
file (one JSON array, as LangChain's `messages_to_dict` makes)."""

from __future__ import annotations

import json
from typing import IO

import redis

from ..importers import (
    SessionImport,
    find_sessions,
    import_langchain,
    import_llamaindex,
    langchain_left_out,
    to_langchain,
)
from ..store import MessageStore
from .commands import existing_thread
from .progress import Progress, TextOut

TABLE_ROWS = 50  # sessions listed one a line; the rest are counted


def import_from(
    store: MessageStore,
    source: redis.Redis,
    kind: str,
    pattern: str | None,
    key_prefix: str,
    batch_messages: int,
    out: IO[str],
    progress_out: IO[str],
    every: float = 5.0,
) -> int:
    """Imports every session of `source` matching `pattern`, with a progress bar (source
    messages) and a summary table; returns the exit status (1 if a session failed). An import
    that a failed server or connection (or Ctrl-C) ends shows the sessions done, then raises."""
    pattern = pattern or (f"{key_prefix}*" if kind == "langchain" else "*")
    keys = find_sessions(source, pattern)
    total = _total(source, keys)
    bar = Progress("imported", total, progress_out, every)
    done = lambda key, count: bar.update(count)  # noqa: E731
    results: list[SessionImport] = []
    try:
        if kind == "langchain":
            import_langchain(
                store,
                source,
                pattern,
                key_prefix=key_prefix,
                batch_messages=batch_messages,
                progress=done,
                sessions=results,
            )
        else:
            import_llamaindex(
                store,
                source,
                pattern,
                batch_messages=batch_messages,
                progress=done,
                sessions=results,
            )
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
    return 1 if any(result.error for result in results) else 0


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
        status = f"failed: {result.error}" if result.error else "ok"
        print(
            f"{_cut(result.source_key, width):<{width}}  {_cut(result.thread_id or '-', width):<{width}}"
            f"  {result.source_messages:>9,}  {result.imported:>9,}  {result.already:>9,}  {status}",
            file=out,
        )
    if len(results) > TABLE_ROWS:
        print(f"... and {len(results) - TABLE_ROWS} more sessions", file=out)
    failed = sum(1 for r in results if r.error)
    print(
        f"{len(results)} sessions into namespace {namespace}, {sum(r.source_messages for r in results):,} source"
        f" messages: {sum(r.imported for r in results):,} imported, {sum(r.already for r in results):,} already"
        f" stored ({sum(r.stored_messages for r in results):,} kvstore messages written)"
        + (f"; {failed} failed" if failed else ""),
        file=out,
    )


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def export_langchain(store: MessageStore, thread_id: str, out: TextOut) -> tuple[int, int]:
    """Writes the thread as LangChain's message JSON: one array, a message a line. Returns
    (messages written, kvstore messages left out: no LangChain type)."""
    thread = existing_thread(store, thread_id)
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
