"""The watchers: the sync and asyncio drivers of core.watch (kvstore/_engine/event_stream.py).

Each watcher has its own connection, made from its store's client's settings and used only for
its blocking XREAD, so a watcher never holds one of the store's pooled connections while it
waits, and closing the watcher closes its connection. The messages an event names are read by
the store, as any read.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

from .. import errors
from ..events import ThreadEvent
from .drivers import wire
from .event_stream import Emit, Run, WatchStep, stream_entries

# A blocking read waits this long at most before it blocks again; the socket waits this much
# longer, so that a dead server is noticed.
DEFAULT_BLOCK_MS = 5000
_SOCKET_SLACK_S = 10


def _node_client(client: Any, key: str) -> Any:
    """The client of the server that owns `key`: `client` itself unless it is a cluster client."""
    if hasattr(client, "get_node_from_key"):
        node = client.get_node_from_key(key)
        if getattr(node, "redis_connection", None) is not None:
            return node.redis_connection
        return node  # asyncio cluster node: has connection_class and connection_kwargs
    return client


def _settings(client: Any, block_ms: int) -> tuple[Any, dict[str, Any]]:
    source = getattr(client, "connection_pool", client)
    kwargs = dict(source.connection_kwargs)
    kwargs["socket_timeout"] = block_ms / 1000 + _SOCKET_SLACK_S
    return source.connection_class, kwargs


def _xread(key: str, after: str, count: int, block_ms: int) -> tuple[Any, ...]:
    return ("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", key, after)


def _failed(exc: Exception) -> errors.KVStoreError:
    return errors.ConnectionFailed(
        f"watch: the event stream could not be read ({exc}); resume from the last cursor"
    )


class Watch:
    """The sync iterator of a thread's events (:meth:`Thread.watch`). Close it (``close()`` or
    ``with``) to close its connection; the iteration ends after a ThreadDeleted event."""

    def __init__(self, store: Any, steps: WatchStep, block_ms: int) -> None:
        self._store, self._steps, self._block_ms = store, steps, block_ms
        self._client: redis.Redis | None = None
        self._closed = False

    def _read(self, key: str, after: str, count: int) -> Any:
        if self._client is None:
            connection_class, kwargs = _settings(
                _node_client(self._store.client, key), self._block_ms
            )
            pool = redis.ConnectionPool(
                connection_class=connection_class, max_connections=1, **kwargs
            )
            self._client = redis.Redis(connection_pool=pool)
        try:
            command = _xread(key, after, count, self._block_ms)
            return self._client.execute_command(*wire(command))  # type: ignore[no-untyped-call]  # unannotated in redis-py
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise _failed(exc) from exc

    def __iter__(self) -> Watch:
        return self

    def __next__(self) -> ThreadEvent:
        if self._closed:
            raise StopIteration
        reply: Any = None
        try:
            while True:
                step = self._steps.send(reply)
                reply = None
                if isinstance(step, Emit):
                    return step.event
                if isinstance(step, Run):
                    reply = self._store.run(step.operation)
                else:
                    reply = stream_entries(self._read(step.key, step.after, step.count))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Closes the watcher's connection; the iteration ends."""
        self._closed = True
        self._steps.close()
        if self._client is not None:
            client, self._client = self._client, None
            client.close()
            client.connection_pool.disconnect()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncWatch:
    """The async iterator of a thread's events (:meth:`AsyncThread.watch`). Close it
    (``await aclose()`` or ``async with``); cancelling the task that awaits it closes its
    connection too."""

    def __init__(self, store: Any, steps: WatchStep, block_ms: int) -> None:
        self._store, self._steps, self._block_ms = store, steps, block_ms
        self._client: redis.asyncio.Redis | None = None
        self._closed = False

    async def _read(self, key: str, after: str, count: int) -> Any:
        if self._client is None:
            connection_class, kwargs = _settings(
                _node_client(self._store.client, key), self._block_ms
            )
            pool = redis.asyncio.ConnectionPool(
                connection_class=connection_class, max_connections=1, **kwargs
            )
            self._client = redis.asyncio.Redis(connection_pool=pool)
        try:
            command = _xread(key, after, count, self._block_ms)
            return await self._client.execute_command(*wire(command))  # type: ignore[no-untyped-call]  # unannotated in redis-py
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise _failed(exc) from exc

    def __aiter__(self) -> AsyncWatch:
        return self

    async def __anext__(self) -> ThreadEvent:
        if self._closed:
            raise StopAsyncIteration
        reply: Any = None
        try:
            while True:
                try:
                    step = self._steps.send(reply)
                except StopIteration:
                    raise StopAsyncIteration from None
                reply = None
                if isinstance(step, Emit):
                    return step.event
                if isinstance(step, Run):
                    reply = await self._store.run(step.operation)
                else:
                    reply = stream_entries(await self._read(step.key, step.after, step.count))
        except BaseException:  # cancellation too: the connection goes with the watcher
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Closes the watcher's connection; the iteration ends."""
        self._closed = True
        self._steps.close()
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
            await client.connection_pool.disconnect()

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
