"""Shared by the reliability tests: dedicated servers, keyspace snapshots, one-call drivers.

Importable by worker processes (no pytest at import time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import redis

from kvstore import MessageStore
from kvstore._engine.core import Batch, Eval, ThreadRef
from kvstore._engine.layout.keys import ThreadKeys
from kvstore._engine.scripts import SCRIPTS

from ..support.facade import SyncFacade
from ..support.servers import ServerProcess, server_binaries


def server_kinds() -> list[str]:
    """The real servers of this run's matrix (tests/support/servers.py): Valkey always, Debian
    Redis where installed, the extra kinds CI names."""
    return list(server_binaries())


def binary_of(kind: str) -> str:
    return server_binaries()[kind]


def new_server(kind: str, *extra_args: str) -> ServerProcess:
    return ServerProcess(kind, binary_of(kind), extra_args=list(extra_args)).start()


@contextlib.contextmanager
def dedicated_server(kind: str, *extra_args: str) -> Iterator[ServerProcess]:
    server = new_server(kind, *extra_args)
    try:
        yield server
    finally:
        server.cleanup()


def fresh_namespace() -> str:
    return f"r{uuid.uuid4().hex[:12]}"


def key_fields() -> list[str]:
    """The names of a thread's fixed keys, read from ThreadKeys itself (not a copy of the list)."""
    return [f.name for f in dataclasses.fields(ThreadKeys) if f.name != "chunk_prefix"]


Keyspace = dict[bytes, tuple[bytes, int]]


def keyspace(client: Any, namespace: str) -> Keyspace:
    """DUMP and absolute expiry (PEXPIRETIME) of every key of the namespace."""
    state: Keyspace = {}
    for key in client.scan_iter(match=f"{namespace}:*", count=1000):
        state[key] = (client.dump(key), int(client.execute_command("PEXPIRETIME", key)))
    return state


def keyspace_diff(before: Keyspace, after: Keyspace) -> list[str]:
    changed = []
    for key in sorted(set(before) | set(after)):
        if key not in after:
            changed.append(f"{key.decode()} deleted")
        elif key not in before:
            changed.append(f"{key.decode()} created")
        elif before[key] != after[key]:
            changed.append(f"{key.decode()} changed")
    return changed


def run_one(store: MessageStore, request: Eval) -> Any:
    """Sends exactly one script call through the store's executor (mapping, NOSCRIPT reload)."""

    def operation():
        return (yield request)

    return store.run(operation())


def first_request(operation, store: MessageStore | None = None) -> Eval:
    """The first script call a core operation would send; the native reads before it (a
    compact's pair-boundary read) are answered by `store`."""
    request = next(operation)
    while isinstance(request, Batch) and store is not None:
        request = operation.send(run_one(store, request))
    operation.close()
    return request


def with_limits(request: Eval, ref: ThreadRef) -> Eval:
    """The same call with `ref`'s limits (the `limits` argument of every writing script)."""
    args = request.script.args(**{**request.named(), "limits": ref.limits()})
    return Eval(request.script, request.keys, args)


def script_call(name: str, ref: ThreadRef, **args: Any) -> Eval:
    """A call of the script `name` on `ref`'s thread, its arguments by name."""
    keys = ref.script_keys() if callable(ref.script_keys) else ref.script_keys
    return Eval(SCRIPTS[name], keys, SCRIPTS[name].args(**args))


@contextlib.contextmanager
def thread_in_mode(
    mode: str, url: str, config: Any, thread_id: str, client: Any = None
) -> Iterator[Any]:
    """A thread of a sync store, or of an async store behind a SyncFacade; closed afterwards."""
    import asyncio

    from kvstore import AsyncMessageStore

    if mode == "sync":
        store = (
            MessageStore(client, config)
            if client is not None
            else MessageStore.from_url(url, config)
        )
        try:
            yield store.thread(thread_id)
        finally:
            store.close()
        return
    loop = asyncio.new_event_loop()
    store = (
        AsyncMessageStore(client, config)
        if client is not None
        else AsyncMessageStore.from_url(url, config)
    )
    try:
        yield SyncFacade(store.thread(thread_id), loop)
    finally:
        loop.run_until_complete(store.close())
        loop.close()


def free_port_client(**kwargs: Any) -> redis.Redis:
    """A client of a loopback port nothing listens on."""
    from ..support.servers import free_port

    return redis.Redis(host="127.0.0.1", port=free_port(), **kwargs)
