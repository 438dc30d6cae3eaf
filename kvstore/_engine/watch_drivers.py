"""The watchers: the sync and asyncio drivers of core.watch (kvstore/_engine/event_stream.py).

Each watcher has its own connection, made from its store's client's settings and used only for
its blocking XREAD, so a watcher never holds one of the store's pooled connections while it
waits, and closing the watcher closes its connection. The messages an event names are read by
the store, as any read.

On a cluster client the watcher follows the thread's slot (kvstore/_engine/watch_recovery.py):
a read refused (MOVED when the slot moved or its primary was failed over, ASK, TRYAGAIN,
CLUSTERDOWN, UNBLOCKED) or a connection lost (a failover, a dead primary) drops the watcher's
connection, reads the client's slot map again and sends the same XREAD, from the same cursor, to
the slot's primary then: no event is lost or repeated. It backs off while the slot has no
primary that answers, for RECOVERY_SECONDS at most, then raises ConnectionFailed. A standalone
client's watcher does not retry: its read's failure is raised at once, as ConnectionFailed (the
connection) or ServerError (a refusal).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import RedisClusterException, RedisError

from ..events import ThreadEvent
from .drivers import cancels, wire
from .event_stream import Emit, Run, WatchStep
from .failures import is_cluster
from .stream_replies import AfterRecovery, stream_entries
from .watch_recovery import Recovery, failed, reads, recoverable, refresh, refresh_async

# A blocking read waits this long at most before it blocks again; the socket waits this much
# longer, so that a dead server is noticed.
DEFAULT_BLOCK_MS = 5000
_SOCKET_SLACK_S = 10
# How long aclose(), and an async store's close() for each of its watchers, waits at most for
# the read it cancelled to end.
WATCHER_STOP_SECONDS = 1.0


def _node_client(client: Any, key: str) -> Any:
    """The client of the server that owns `key`: `client` itself unless it is a cluster client."""
    if hasattr(client, "get_node_from_key"):
        node = client.get_node_from_key(key)
        if hasattr(client, "get_redis_connection"):  # sync: the node's client, made if need be
            return client.get_redis_connection(node)
        return node  # asyncio cluster node: has connection_class and connection_kwargs
    return client


def _settings(client: Any, block_ms: int) -> tuple[Any, dict[str, Any]]:
    source = getattr(client, "connection_pool", client)
    kwargs = dict(source.connection_kwargs)
    kwargs["socket_timeout"] = block_ms / 1000 + _SOCKET_SLACK_S
    return source.connection_class, kwargs


def _xread(key: str, after: str, count: int, block_ms: int | None) -> tuple[Any, ...]:
    """The watcher's read; without `block_ms` it does not wait: the first read on the node a
    recovery found returns at once, so that the watcher checks the thread there (a failover
    may have taken back events it delivered: event_stream.py, `taken_back`) before it blocks."""
    if block_ms is None:
        return ("XREAD", "COUNT", count, "STREAMS", key, after)
    return ("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", key, after)


def _entries(reply: Any, recovered: bool) -> Any:
    entries = stream_entries(reply)
    return AfterRecovery(entries) if recovered else entries


def _register(store: Any, watcher: Any) -> None:
    """Has the store's close() stop `watcher` (Executor keeps a weak set of its watchers)."""
    watchers = getattr(store, "_watchers", None)
    if watchers is not None:
        watchers.add(watcher)


class Watch:
    """The sync iterator of a thread's events (:meth:`Thread.watch`). Close it (``close()`` or
    ``with``) to close its connection; the iteration ends after a ThreadDeleted event, and when
    its store is closed (from any thread: a blocked read is cut off)."""

    def __init__(self, store: Any, steps: WatchStep, block_ms: int) -> None:
        self._store, self._steps, self._block_ms = store, steps, block_ms
        self._client: redis.Redis | None = None
        self._closed = self._stopped = False
        self._reading = False  # a read is sent or awaited now (in the iterating thread)
        self._connection: Any = None  # the connection of the watcher's client, once made
        # close() of the store may run in another thread: an event is handed out under this
        # lock, so none is handed out once stop() returned.
        self._lock = threading.Lock()
        self._woken = threading.Event()  # set by stop(): a pause between attempts ends
        _register(store, self)

    def _connect(self, key: str) -> redis.Redis:
        """The watcher's client, on the server that owns `key` now (made if it has none)."""
        if self._client is None:
            connection_class, kwargs = _settings(
                _node_client(self._store.client, key), self._block_ms
            )
            kwargs["redis_connect_func"] = self._on_connect(kwargs.get("redis_connect_func"))
            pool = redis.ConnectionPool(
                connection_class=connection_class, max_connections=1, **kwargs
            )
            with self._lock:  # stop() disconnects the client it finds
                if self._stopped:
                    raise StopIteration
                self._client = redis.Redis(connection_pool=pool)
        return self._client

    def _on_connect(self, then: Any) -> Any:
        """The watcher's connection's handshake: refused once the watcher is stopped, so that a
        read that was about to be sent when close() or stop() cut the connection in another
        thread does not connect again (and block for block_ms) but fails, and ends the watch."""

        def on_connect(connection: Any) -> None:
            if self._stopped:
                raise redis.ConnectionError("the watcher was closed")
            self._connection = connection
            if then is not None:
                then(connection)
            else:
                connection.on_connect()

        return on_connect

    def _read(self, key: str, after: str, count: int) -> Any:
        """The XREAD's reply; on a cluster, sent again (see the module's doc) until it is read."""
        recovery = Recovery()
        block: int | None = self._block_ms
        while True:
            with self._lock:
                if self._stopped:
                    raise StopIteration
                self._reading = True
            try:
                command = _xread(key, after, count, block)
                try:
                    reply = self._connect(key).execute_command(*wire(command))  # type: ignore[no-untyped-call]  # unannotated in redis-py
                finally:
                    with self._lock:
                        self._reading = False
                return _entries(reply, recovered=block is None)
            except (RedisError, RedisClusterException) as exc:
                if self._stopped or not recoverable(self._store.client, exc):
                    raise failed(exc) from exc
                self._drop()
                self._woken.wait(recovery.pause(exc))
                refresh(self._store.client, recovery.failed_at)
                block = None

    def _drop(self) -> None:
        """Closes the watcher's connection (the next read makes one)."""
        client, self._client = self._client, None
        if client is not None:
            client.close()
            client.connection_pool.disconnect()

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
                    with self._lock:
                        if self._stopped:
                            raise StopIteration
                        return step.event
                if isinstance(step, Run):
                    reply = self._store.run(reads(self._store, step.operation))
                else:
                    reply = self._read(step.key, step.after, step.count)
        except BaseException as exc:
            stopped = self._stopped  # before close(), which stops the watcher too
            self.close()
            if stopped and isinstance(exc, Exception):
                # The watcher or its store was closed: whatever its reads met then, the
                # iteration just ends.
                raise StopIteration from None
            raise

    def stop(self) -> None:
        """Ends the iteration from any thread (the store's close()): a read blocked now is cut
        off at once, and no event is handed out after this returns."""
        if not self._halt() and self._client is not None:
            self._client.connection_pool.disconnect()

    def _halt(self) -> bool:
        """Marks the watcher stopped (no event is handed out after this returns) and wakes it,
        cutting off a read blocked now in the iterating thread; whether one was."""
        with self._lock:
            self._stopped = self._closed = True
            reading = self._reading
        self._woken.set()
        if reading:
            self._cut()
        return reading

    def _cut(self) -> None:
        """Wakes the read blocked now in the iterating thread: its socket is shut down, not
        closed (a socket closed under a read in another thread may have its descriptor reused by
        another connection, which the read then waits on); the read fails, and the iterating
        thread closes the connection on its way out. A read not connected yet cannot connect
        (_on_connect)."""
        sock = getattr(self._connection, "_sock", None)
        if sock is not None:
            # ValueError: fakeredis's socket, whose read cannot be cut off from another thread.
            with contextlib.suppress(OSError, ValueError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Closes the watcher's connection; the iteration ends, with no error, also when it
        is called from another thread while the watcher waits (its read is cut off, as by
        stop())."""
        if self._halt():  # in another thread: its way out (__next__) closes the rest
            return
        # ValueError: running in the iterating thread now; its way out (__next__) closes it.
        with contextlib.suppress(ValueError):
            self._steps.close()
        self._drop()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cancelling() -> bool:
    """Whether the current task itself is being cancelled (not only a task it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class AsyncWatch:
    """The async iterator of a thread's events (:meth:`AsyncThread.watch`). Close it
    (``await aclose()`` or ``async with``); cancelling the task that awaits it closes its
    connection too. The iteration ends, with no error, when its store is closed."""

    def __init__(self, store: Any, steps: WatchStep, block_ms: int) -> None:
        self._store, self._steps, self._block_ms = store, steps, block_ms
        self._client: redis.asyncio.Redis | None = None
        self._closed = self._stopped = False
        self._pending: asyncio.Future[Any] | None = None  # the XREAD awaited now
        _register(store, self)

    async def _connect(self, key: str) -> redis.asyncio.Redis:
        """The watcher's client, on the server that owns `key` now (made if it has none)."""
        if self._client is None:
            client = self._store.client
            if is_cluster(client):
                await client.initialize()  # the slot map, read on the client's first call
            connection_class, kwargs = _settings(_node_client(client, key), self._block_ms)
            pool = redis.asyncio.ConnectionPool(
                connection_class=connection_class, max_connections=1, **kwargs
            )
            self._client = redis.asyncio.Redis(connection_pool=pool)
        return self._client

    async def _pend(self, awaitable: Any) -> Any:
        """Awaits `awaitable` as a task of its own, so that the store's close() can cancel it."""
        self._pending = asyncio.ensure_future(awaitable)
        try:
            return await self._pending
        finally:
            self._pending = None

    async def _read(self, key: str, after: str, count: int) -> Any:
        """The XREAD's reply; on a cluster, sent again (see the module's doc) until it is read."""
        recovery = Recovery()
        block: int | None = self._block_ms
        while True:
            if self._stopped:
                raise StopAsyncIteration
            try:
                client = await self._connect(key)
                if self._stopped:  # aclose() ran while _connect awaited
                    raise StopAsyncIteration
                command = _xread(key, after, count, block)
                reply = await self._pend(client.execute_command(*wire(command)))  # type: ignore[no-untyped-call]  # unannotated in redis-py
                return _entries(reply, recovered=block is None)
            except (RedisError, RedisClusterException) as exc:
                if self._stopped or not recoverable(self._store.client, exc):
                    raise failed(exc) from exc
                await self._drop()
                await self._pend(asyncio.sleep(recovery.pause(exc)))
                await refresh_async(self._store.client, recovery.failed_at)
                block = None

    async def _drop(self) -> None:
        """Closes the watcher's connection (the next read makes one)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
            await client.connection_pool.disconnect()

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
                if self._stopped:
                    raise StopAsyncIteration
                if isinstance(step, Emit):
                    return step.event
                pending = cancels()
                if isinstance(step, Run):
                    reply = await self._store.run(reads(self._store, step.operation))
                else:
                    reply = await self._read(step.key, step.after, step.count)
                if cancels() > pending:
                    raise asyncio.CancelledError  # swallowed below (drivers.cancels)
        except BaseException as exc:  # cancellation too: the connection goes with the watcher
            stopped = self._stopped  # before aclose(), which stops the watcher too
            await self.aclose()
            if stopped and not _cancelling() and not isinstance(exc, KeyboardInterrupt):
                # The watcher or its store was closed (its read cancelled, its reads failing):
                # the end.
                raise StopAsyncIteration from None
            raise

    def stop(self) -> asyncio.Future[Any] | None:
        """Ends the iteration (the store's close()): the read awaited now, if any, is
        cancelled (returned, to be waited for), and no event is handed out from now on."""
        self._stopped = self._closed = True
        pending = self._pending
        if pending is not None:
            pending.cancel()
        return pending

    async def aclose(self) -> None:
        """Closes the watcher's connection; the iteration ends, with no error, also when it
        is awaited in another task while the watcher waits (its read is cancelled, as by
        stop(), and waited for up to WATCHER_STOP_SECONDS)."""
        stopped_before = self._stopped  # the store's close() stopped it and waited already
        pending = self.stop()
        if pending is not None and not stopped_before:
            await asyncio.wait([pending], timeout=WATCHER_STOP_SECONDS)
        self._steps.close()
        await self._drop()

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
