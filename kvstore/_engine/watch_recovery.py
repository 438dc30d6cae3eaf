"""How a cluster watcher (kvstore/_engine/watch_drivers.py) follows its thread's slot.

A read refused (MOVED when the slot moved or its primary was failed over, ASK, TRYAGAIN,
CLUSTERDOWN, UNBLOCKED) or a connection lost (a failover, a dead primary) is recoverable: the
watcher drops its connection, reads the client's slot map again and sends the same XREAD, from
the same cursor, to the slot's primary then. Recovery paces the attempts and bounds them
(RECOVERY_SECONDS); failed() makes the kvstore error a read raises when it cannot go on, never a
raw redis-py one. patient() does the same for the store's reads of the messages an event names.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Generator
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)

from .. import errors
from .drivers import Sleep, Step
from .failures import is_cluster
from .operation import Batch, Operation

# How long a cluster watcher looks for its slot's primary (after a move, a failover, a dead
# primary) before it raises ConnectionFailed; more than a failover takes after the default
# cluster-node-timeout (15 s). The pauses between its attempts double from the first to the last.
RECOVERY_SECONDS = 30.0
_FIRST_PAUSE_S, _LAST_PAUSE_S = 0.05, 1.0
# What a cluster watcher recovers from: the slot is elsewhere or unserved, or its node is lost.
# MovedError is an AskError; BusyLoadingError (a node loading its data) a ConnectionError.
_RECOVERABLE = (
    AskError,
    TryAgainError,
    ClusterDownError,
    ReadOnlyError,
    redis.ConnectionError,
    redis.TimeoutError,
    RedisClusterException,  # SlotNotCoveredError: the map names no owner of the slot
)


def failed(exc: BaseException) -> errors.KVStoreError:
    """The kvstore error of a read that failed for good (never a raw redis-py exception)."""
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, RedisClusterException)):
        return errors.ConnectionFailed(
            f"watch: the event stream could not be read ({exc}); resume from the last cursor"
        )
    return errors.ServerError(f"watch: the server refused the event stream's read: {exc}")


class Recovery:
    """The bounded retry of one read of a cluster watcher: pause() says how long to wait before
    the next attempt, or raises ConnectionFailed once RECOVERY_SECONDS passed since the first
    failure. The first attempt after a failure goes at once (a moved slot's owner is known)."""

    def __init__(self) -> None:
        self._deadline: float | None = None
        self._pause = 0.0
        self.failed_at = 0.0  # when the last attempt failed

    def pause(self, exc: BaseException) -> float:
        now = self.failed_at = time.monotonic()
        if self._deadline is None:
            self._deadline = now + RECOVERY_SECONDS
        if now >= self._deadline:
            raise errors.ConnectionFailed(
                f"watch: the thread's slot had no primary that answered for"
                f" {RECOVERY_SECONDS:g} s ({exc}); resume from the last cursor"
            ) from exc
        pause = min(self._pause, self._deadline - now)
        self._pause = min(max(self._pause * 2, _FIRST_PAUSE_S), _LAST_PAUSE_S)
        return pause


def recoverable(client: Any, exc: BaseException) -> bool:
    # UNBLOCKED: Redis ends a blocked read so when its node turns replica (a failover).
    unblocked = isinstance(exc, ResponseError) and str(exc).startswith("UNBLOCKED")
    return is_cluster(client) and (unblocked or isinstance(exc, _RECOVERABLE))


class _MapReads:
    """One cluster client's reads of its slot map by its watchers: one at a time, and none for
    a watcher whose read failed before the last one began (that one found what it needs)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.async_lock: asyncio.Lock | None = None  # made on the client's loop
        self.began = float("-inf")


_map_reads: weakref.WeakKeyDictionary[Any, _MapReads] = weakref.WeakKeyDictionary()
_map_reads_lock = threading.Lock()


def _reads_of(client: Any) -> _MapReads:
    with _map_reads_lock:
        state = _map_reads.get(client)
        if state is None:
            state = _map_reads[client] = _MapReads()
        return state


def refresh(client: Any, failed_at: float) -> None:
    """The cluster client's slot map read again, unless it was since `failed_at` (so that the
    watchers of a store that all lose their node at once read it once); a map that cannot be
    read stays as it was."""
    state = _reads_of(client)
    with state.lock:
        if state.began >= failed_at:
            return
        state.began = time.monotonic()
        with contextlib.suppress(RedisError, RedisClusterException):
            client.nodes_manager.initialize()


async def refresh_async(client: Any, failed_at: float) -> None:
    state = _reads_of(client)
    if state.async_lock is None:
        state.async_lock = asyncio.Lock()
    async with state.async_lock:
        if state.began >= failed_at:
            return
        state.began = time.monotonic()
        with contextlib.suppress(RedisError, RedisClusterException):
            await client.nodes_manager.initialize()


class RefreshMap(Step):
    """The store's cluster client's slot map read again (see refresh), as a step of an
    operation."""

    __slots__ = ("failed_at",)

    def __init__(self, failed_at: float) -> None:
        self.failed_at = failed_at

    def __call__(self, store: Any) -> Any:
        if isinstance(store.client, redis.asyncio.RedisCluster):
            return refresh_async(store.client, self.failed_at)
        refresh(store.client, self.failed_at)
        return None


def reads(store: Any, operation: Operation[Any]) -> Generator[Any, Any, Any]:
    """A watcher's operation (its reads of the messages its events name) as the store runs it:
    on a cluster, a native read whose connection was lost is sent again on a fresh slot map,
    backing off as the watcher's XREAD does (its node may have died after the XREAD)."""
    return patient(operation) if is_cluster(store.client) else operation


def patient(operation: Operation[Any]) -> Generator[Any, Any, Any]:
    recovery = Recovery()
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            item = operation.send(reply) if failure is None else operation.throw(failure)
        except StopIteration as done:
            return done.value
        reply = failure = None
        while True:
            try:
                reply = yield item
                break
            except errors.ConnectionFailed as exc:
                if not isinstance(item, Batch):  # a script: the operation decides
                    failure = exc
                    break
                try:
                    pause = recovery.pause(exc)
                except errors.ConnectionFailed as final:
                    failure = final
                    break
                yield Sleep(pause)
                yield RefreshMap(recovery.failed_at)
            except errors.KVStoreError as exc:
                failure = exc
                break
