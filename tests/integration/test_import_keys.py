"""Source keys an import meets that name no thread: a key that is not UTF-8 text is reported as
that session's failure, and every other session is imported (docs/MIGRATING.md: a session that
fails does not stop the others), from the CLI and the library, sync and async."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio

from kvstore import AsyncMessageStore, MessageStore, StoreConfig
from kvstore.cli.main import main as cli
from kvstore.importers import find_sessions, import_langchain, import_langchain_async

GOOD = b'{"type":"human","data":{"content":"fine"}}'


def _sessions(raw_client, namespace: str) -> tuple[bytes, str]:
    prefix = f"message_store:{namespace}-"
    raw_client.lpush(f"{prefix}a", GOOD)
    raw_client.lpush(prefix.encode() + b"caf\xe9", GOOD)  # Latin-1, as an old writer made it
    raw_client.lpush(f"{prefix}z", GOOD)
    return prefix.encode() + b"caf\xe9", prefix


def test_cli_reports_a_key_not_utf8_and_imports_the_others(
    backend, server_only, server, raw_client, namespace, capsys
):
    _, prefix = _sessions(raw_client, namespace)
    args = ["import-from", "langchain", "--url", server.url, "--namespace", namespace]
    assert cli([*args, "--pattern", f"{prefix}*"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert "caf\\xe9" in captured.out and "not UTF-8 text" in captured.out
    with MessageStore.from_url(server.url, StoreConfig(namespace=namespace)) as store:
        for name in ("a", "z"):
            assert [m.content for m in store.thread(f"{namespace}-{name}").iter()] == ["fine"]


def test_library_reports_a_key_not_utf8_and_imports_the_others(
    backend, server_only, server, raw_client, namespace, mode
):
    bad, prefix = _sessions(raw_client, namespace)
    config = StoreConfig(namespace=namespace)
    with redis.Redis.from_url(server.url) as source:
        assert find_sessions(source, f"{prefix}*") == [f"{prefix}a", f"{prefix}z"]
    if mode == "sync":
        with (
            MessageStore.from_url(server.url, config) as store,
            redis.Redis.from_url(server.url) as source,
        ):
            results = import_langchain(store, source, pattern=f"{prefix}*")
    else:

        async def run():
            store = AsyncMessageStore.from_url(server.url, config)
            source = redis.asyncio.Redis.from_url(server.url)
            try:
                return await import_langchain_async(store, source, pattern=f"{prefix}*")
            finally:
                await store.close()
                await source.aclose()

        results = asyncio.run(run())
    assert [(r.imported, r.error_type) for r in results] == [
        (1, None),
        (1, None),
        (0, "InvalidThreadId"),
    ]
    assert results[2].source_key == bad.decode("utf-8", "backslashreplace")
    assert raw_client.llen(bad) == 1  # the source is left as it was
