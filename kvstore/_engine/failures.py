"""What a failed call means: whether its command was sent, and which typed error the caller gets.

A call that failed may have run only if its command reached a socket: a refused connection,
a connect timeout or a full pool sent nothing, while a first attempt that timed out and a
retry whose reconnect was refused may have run. The final exception does not tell them
apart, so the connections of a standalone client's pool record it, per call, in CALL
(a context variable: each thread and each asyncio task has its own).

The executor (kvstore/_engine/executor.py) decides what to send; this module reads what came
back. It is the one place that reaches into redis-py's connection classes, and tells a cluster
or fakeredis client apart.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, NoPermissionError, OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import errors
from ..config import StoreConfig
from .packing import QuickPacking
from .scripts import Script, error_from_reply

# ------------------------------------------------------------------- what a call sent


class Call:
    """What the current call did: used one of the tracked connections, opened the connections
    in `opened`, wrote its command on the connections in `sent_on`. Only a `tracked` client's
    connections record it. A `fresh` call reconnects a connection opened before it before
    sending on it (the one re-sending after a stale connection failed)."""

    __slots__ = ("fresh", "opened", "sent_on", "touched", "tracked")

    def __init__(self, tracked: bool = False, fresh: bool = False) -> None:
        self.tracked, self.fresh = tracked, fresh
        self.touched = False
        self.opened: list[Any] = []
        self.sent_on: list[Any] = []


CALL: ContextVar[Call | None] = ContextVar("kvstore_call", default=None)


def _touched() -> None:
    call = CALL.get()
    if call is not None:
        call.touched = True


def _opened(connection: Any) -> None:
    call = CALL.get()
    if call is not None:
        call.opened.append(connection)


def _stale(connection: Any) -> bool:
    """Whether the current call re-sends on fresh connections and `connection` is older."""
    call = CALL.get()
    return call is not None and call.fresh and connection not in call.opened


def _sent(connection: Any) -> None:
    call = CALL.get()
    if call is not None:
        call.touched = True
        call.sent_on.append(connection)


if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection as _AsyncConnection
    from redis.connection import AbstractConnection as _SyncConnection
else:  # mixins: the connection class comes after them in a connection's bases
    _SyncConnection = _AsyncConnection = object


class TracksSends(_SyncConnection):
    """Mixed into a sync connection class: marks the call as sent just before its command's
    bytes go to the socket. The handshake after a connect (HELLO, AUTH, SELECT, CLIENT
    SETINFO) and health-check PINGs are not the call's command."""

    _kvstore_internal = 0

    def kvstore_unread(self) -> None:
        """The call was interrupted (KeyboardInterrupt, a signal) between sending and reading:
        redis-py puts the connection back in its pool with the reply unread, and the next call
        on it would take that reply for its own."""
        self.disconnect()  # type: ignore[no-untyped-call]  # unannotated in redis-py

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        _touched()
        if not self._sock:
            _opened(self)
        self._kvstore_internal += 1
        try:
            super().connect_check_health(*args, **kwargs)
        finally:
            self._kvstore_internal -= 1

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._kvstore_internal:
            # Connect and check health first, as super() would: what they send is not the call.
            self._kvstore_internal += 1
            try:
                if _stale(self):
                    self.disconnect()  # type: ignore[no-untyped-call]  # unannotated in redis-py
                if not self._sock:
                    self.connect_check_health(check_health=False)
                if check_health:
                    self.check_health()  # type: ignore[no-untyped-call]  # unannotated in redis-py
            finally:
                self._kvstore_internal -= 1
            _sent(self)
            check_health = False
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]  # unannotated in redis-py


class AsyncTracksSends(_AsyncConnection):
    """The asyncio twin of :class:`TracksSends`."""

    _kvstore_internal = 0

    def kvstore_unread(self) -> None:
        """Nothing to do: the asyncio client closes a connection cut off in a send or a read."""

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        _touched()
        if not self.is_connected:
            _opened(self)
        self._kvstore_internal += 1
        try:
            await super().connect_check_health(*args, **kwargs)
        finally:
            self._kvstore_internal -= 1

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._kvstore_internal:
            self._kvstore_internal += 1
            try:
                if _stale(self):
                    await self.disconnect()
                if not self.is_connected:
                    await self.connect_check_health(check_health=False)
                if check_health:
                    await self.check_health()  # type: ignore[no-untyped-call]  # unannotated in redis-py
            finally:
                self._kvstore_internal -= 1
            _sent(self)
            check_health = False
        await super().send_packed_command(command, check_health)


def track_sends(client: Any) -> bool:
    """Makes the connections a standalone client's pool opens from now on record what each call
    sent, and pack commands of bytes and str with hiredis directly (packing.py). A RedisCluster
    (its nodes' pools come and go) and fakeredis are not tracked."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or is_cluster(client) or is_fakeredis(client):
        return False
    mixin = AsyncTracksSends if isinstance(client, redis.asyncio.Redis) else TracksSends
    if not issubclass(pool.connection_class, mixin):
        base = pool.connection_class
        pool.connection_class = type(
            base.__name__, (mixin, QuickPacking, base), {"__module__": base.__module__}
        )
    return True


# ------------------------------------------------------------------- the client's kind


def decodes_responses(client: Any) -> bool:
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if not kwargs and hasattr(client, "get_connection_kwargs"):
        kwargs = client.get_connection_kwargs()
    return bool(kwargs.get("decode_responses"))


def is_cluster(client: Any) -> bool:
    return "cluster" in type(client).__module__


def is_fakeredis(client: Any) -> bool:
    return type(client).__module__.startswith("fakeredis")


# ------------------------------------------------------------------- which typed error


def batch_error(exc: Exception, call: Call) -> errors.KVStoreError:
    """A native read that failed: nothing was written, so the error is plain."""
    if isinstance(exc, NoPermissionError):
        return errors.PermissionDenied(str(exc))
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        return _not_sent(call, exc, "the read") or errors.ServerError(
            f"the read could not reach the server: {exc}"
        )
    if "WRONGTYPE" in str(exc):
        # A key of the thread holds another type than kvstore keeps there, as a write would say.
        return errors.LayoutError(f"the read met a key of another type than kvstore keeps: {exc}")
    return errors.ServerError(f"the read failed: {exc}")


def script_error(script: Script, exc: Exception, call: Call) -> errors.KVStoreError:
    if isinstance(exc, OutOfMemoryError):
        return errors.ServerError(
            f"{script.name}: the server is out of memory (maxmemory); nothing was written: {exc}"
        )
    if isinstance(exc, NoPermissionError):
        return errors.PermissionDenied(f"{script.name}: {exc}")
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        if failed := _not_sent(call, exc, script.name):
            return failed
        if script.writes:
            return errors.OutcomeUnknown(
                f"{script.name}: the connection failed after the call was sent ({exc}); it may"
                " or may not have run. Re-send the same call (same message ids or otids):"
                " nothing is stored twice."
            )
        return errors.ServerError(f"{script.name}: {exc}")
    return error_from_reply(script, str(exc))


def read_of_wrong_type(exc: BaseException) -> bool:
    """Whether a read failed on a key holding another type than kvstore keeps there."""
    # A pipeline names the command first: "Command # 1 (...) of pipeline caused error: WRONGTYPE ..."
    return isinstance(exc.__cause__, ResponseError) and "WRONGTYPE" in str(exc.__cause__)


def lost_connection(exc: BaseException) -> bool:
    """Whether a read's error is its connection failing after the read was sent."""
    return isinstance(exc.__cause__, (RedisConnectionError, RedisTimeoutError)) and not isinstance(
        exc, errors.ConnectionFailed
    )


def failed_on_stale_connection(exc: BaseException, call: Call) -> bool:
    """Whether a call failed because the server closed the connection it was sent on, and every
    connection it was sent on was opened before the call: a pooled connection the server had
    closed (a restart, a failover, an idle timeout), most likely before the command reached it.
    (A timeout is not that: the server may be running the command still.)"""
    cause = exc.__cause__ if isinstance(exc, errors.KVStoreError) else exc
    return (
        call.tracked
        and bool(call.sent_on)
        and isinstance(cause, RedisConnectionError)
        and not isinstance(cause, MaxConnectionsError)
        and all(connection not in call.opened for connection in call.sent_on)
    )


def _not_sent(call: Call, exc: Exception, what: str) -> errors.ConnectionFailed | None:
    """ConnectionFailed where a call that failed to connect certainly sent nothing; None where
    it may have run.

    Only a tracked client knows: a standalone client takes its connection from the pool once
    per command, before any attempt, so a full pool means nothing was sent; a RedisCluster
    may have sent an earlier attempt to another node."""
    if not call.tracked or call.sent_on:
        return None
    # A full pool refuses to hand out a connection before anything is sent.
    if (
        call.touched
        or isinstance(exc, MaxConnectionsError)
        or str(exc) == "No connection available."
    ):
        return errors.ConnectionFailed(
            f"{what}: no connection to the server could be used ({exc}); the call was not sent and"
            " nothing was written"
        )
    return None


def durability_unavailable(config: StoreConfig, exc: Exception) -> errors.ConfigError:
    return errors.ConfigError(
        f"durability={config.durability!r} is not available on this server ({exc}); 'fsync' needs"
        " WAITAOF (Redis or Valkey 7.2 or newer) and appendonly yes"
    )


def check_durable(config: StoreConfig, script: Script, waited: Any) -> None:
    """Raises NotDurable where the WAIT or WAITAOF after a write says it is not (yet) durable."""
    if isinstance(waited, Exception):
        raise errors.NotDurable(
            f"{script.name}: the write happened; waiting for it failed: {waited}"
        )
    if config.durability == "fsync":
        if int(waited[0]) < 1:
            raise errors.NotDurable(
                f"{script.name}: the write happened but the AOF fsync was not confirmed within"
                f" {config.durability_timeout_ms} ms"
            )
    elif int(waited) < config.durability_replicas:
        raise errors.NotDurable(
            f"{script.name}: the write happened but reached {int(waited)} of"
            f" {config.durability_replicas} replicas within {config.durability_timeout_ms} ms"
        )
