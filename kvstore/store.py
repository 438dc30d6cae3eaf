"""MessageStore and AsyncMessageStore: thin executors over the sans-IO core.

Each thread method hands one core operation to its store, which runs it through the executor
(kvstore._engine.executor): how a script is called, reloaded and made durable, and which typed
error a failure is, is decided there once; a store only makes the steps, sync or awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any, Self

import redis
import redis.asyncio

from . import errors
from ._engine.core import Operation
from ._engine.drivers import AsyncDriver, SyncDriver
from ._engine.executor import Executor, operate
from ._engine.health import health, health_async
from ._engine.health_report import HealthReport
from ._engine.watch_drivers import WATCHER_STOP_SECONDS
from .async_thread import AsyncThread
from .config import StoreConfig
from .owners import AsyncOwnerMethods, OwnerMethods
from .thread import Thread

__all__ = ["AsyncMessageStore", "AsyncThread", "MessageStore", "Thread"]


def _client_from_url(client_class: Any, url: str, client_kwargs: dict[str, Any]) -> Any:
    """A client for `url` whose arguments were checked now: redis-py takes any keyword and fails
    on the first call, deep in its pool, where a misplaced one (a StoreConfig field) is hard to
    read. ConfigError instead, before anything is sent."""
    misplaced = sorted(set(client_kwargs) & set(StoreConfig.__dataclass_fields__))
    if misplaced:
        raise errors.ConfigError(
            f"{', '.join(misplaced)}: a StoreConfig setting, not the client's: pass"
            f" from_url(url, StoreConfig({misplaced[0]}=...))"
        )
    if client_kwargs.pop("decode_responses", False):
        raise errors.ConfigError("the client must return bytes: decode_responses must be False")
    try:
        client = client_class.from_url(url, decode_responses=False, **client_kwargs)
    except ValueError as exc:  # redis-py's word for a URL it cannot read
        raise errors.ConfigError(f"cannot use {url!r}: {exc}") from None
    pool = client.connection_pool
    try:
        pool.connection_class(**pool.connection_kwargs)  # no socket yet: the arguments' check
    except TypeError as exc:
        raise errors.ConfigError(f"from_url: {exc}") from None
    return client


class MessageStore(OwnerMethods, SyncDriver, Executor):
    """A store over a synchronous client (redis.Redis, RedisCluster or fakeredis).

    ``MessageStore(client, config=None, count_tokens=None)`` takes a client made with
    ``decode_responses=False``; `config` (a :class:`~kvstore.config.StoreConfig`, default
    ``StoreConfig()``) must be the same for every store that writes the same threads;
    ``store.client`` and ``store.config`` are the two it uses. `count_tokens` (your tokenizer: a
    function of a message giving an int from 0 to 2**31) counts each message the store writes whose count
    the caller did not give; without it a message counts one token per 4 bytes of its stored record
    (docs/HISTORY.md, "Counting tokens"). Making a store sends nothing: the scripts are loaded by
    the first call that needs them.

    Example::

        store = MessageStore.from_url("redis://localhost:6379/0", config=StoreConfig(namespace="chat"))
        thread = store.thread("user-42:session-7")
        thread.append(UserMessage(content="hi"))
    """

    @classmethod
    def from_url(
        cls,
        url: str,
        config: StoreConfig | None = None,
        *,
        count_tokens: Callable[[Any], int] | None = None,
        **client_kwargs: Any,
    ) -> MessageStore:
        """A store over a new ``redis.Redis`` client for `url` (``redis://``, ``rediss://``,
        ``unix://``); `client_kwargs` go to ``redis.Redis.from_url`` (``decode_responses`` is
        always False). Nothing is sent until the first call; an argument the client cannot take
        (a StoreConfig field among them) or a URL it cannot read is ConfigError at once.

        Example::

            store = MessageStore.from_url("redis://localhost:6379/0", socket_timeout=5)
        """
        return cls(_client_from_url(redis.Redis, url, client_kwargs), config, count_tokens)

    @classmethod
    def in_memory(
        cls, config: StoreConfig | None = None, *, count_tokens: Callable[[Any], int] | None = None
    ) -> MessageStore:
        """A store on an in-process fakeredis server with Lua, for users' own tests.

        Each call makes a new, empty server. Needs the ``in-memory`` extra
        (``pip install "kvstore[in-memory]"``); without it this raises ModuleNotFoundError
        naming that extra.

        Example::

            store = MessageStore.in_memory()
            store.thread("t").append(UserMessage(content="hi"))
        """
        return cls(_fakeredis().FakeRedis(), config, count_tokens)

    def thread(self, thread_id: str, owner: str | None = None) -> Thread:
        """The thread `thread_id`: cheap, sends nothing; an unknown thread reads as empty.

        With `owner`, the thread is `owner`'s (docs/OWNERS.md): it lives in the owner's hash slot,
        is listed by ``store.threads(owner)``, counts in the owner's usage and quotas, and goes
        with ``erase_owner``. The same id under another owner (or none) is another thread.

        Raises InvalidThreadId unless the id is 1-200 characters of letters, digits and
        ``. _ : @ / + = -``, starting with a letter or digit (InvalidOwnerId: the same for
        `owner`).

        Example::

            thread = store.thread("user-42:session-7")
            chat = store.thread("session-7", owner="user-42")
        """
        return Thread(self, self._thread_ref(thread_id, owner))

    def health(self) -> HealthReport:
        """The server's settings that kvstore's guarantees depend on: a warning for each that
        voids one, and each the client's user may not read in `unchecked` (docs/RELIABILITY.md).

        Example::

            report = store.health()
            print(report)  # version, Lua, function library, eviction policy, persistence
        """
        return health(self.client)

    def run(self, operation: Operation) -> Any:
        """Drives a core operation; a typed error is thrown back into it (it may handle it).

        The low-level entry point under every Thread method, for operations of
        ``kvstore._engine.core``; applications use the Thread methods.
        """
        return self._finish(operate(self, operation))

    def stream(self, operation: Generator[Any, Any, Any]) -> Iterator[Any]:
        """Drives a core operation that also yields outputs (core.pages), handing them out.

        Low-level, as :meth:`run`; :meth:`Thread.iter` is built on it.
        """
        return self._outputs(operate(self, operation))

    def close(self) -> None:
        """Closes the store's client and its connections: the one from_url made, or the client you
        passed in. A store is also a context manager (``with`` / ``async with``) that closes it.

        Its open watchers (:meth:`Thread.watch`) end first, also one blocked in another thread
        right now: their iteration stops, with no error, and no event is handed out after close()
        returns (docs/EVENTS.md, "Shutting down")."""
        for watcher in list(self._watchers):
            watcher.stop()
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncMessageStore(AsyncOwnerMethods, AsyncDriver, Executor):
    """A store over an asyncio client (redis.asyncio.Redis or RedisCluster).

    The asyncio twin of :class:`MessageStore`: same constructor, same methods, awaited, and
    threads that are :class:`AsyncThread`.

    Example::

        store = AsyncMessageStore.from_url("redis://localhost:6379/0")
        await store.thread("t").append(UserMessage(content="hi"))
    """

    @classmethod
    def from_url(
        cls,
        url: str,
        config: StoreConfig | None = None,
        *,
        count_tokens: Callable[[Any], int] | None = None,
        **client_kwargs: Any,
    ) -> AsyncMessageStore:
        """A store over a new ``redis.asyncio.Redis`` client: see :meth:`MessageStore.from_url`.

        Example::

            store = AsyncMessageStore.from_url("redis://localhost:6379/0")
        """
        return cls(_client_from_url(redis.asyncio.Redis, url, client_kwargs), config, count_tokens)

    @classmethod
    def in_memory(
        cls, config: StoreConfig | None = None, *, count_tokens: Callable[[Any], int] | None = None
    ) -> AsyncMessageStore:
        """A store on an in-process fakeredis server: see :meth:`MessageStore.in_memory`.

        Example::

            store = AsyncMessageStore.in_memory()
        """
        return cls(_fakeredis().FakeAsyncRedis(), config, count_tokens)

    def thread(self, thread_id: str, owner: str | None = None) -> AsyncThread:
        """The thread `thread_id` (of `owner`): see :meth:`MessageStore.thread`.

        Example::

            thread = store.thread("user-42:session-7")
            await thread.append(UserMessage(content="hi"))
        """
        return AsyncThread(self, self._thread_ref(thread_id, owner))

    async def health(self) -> HealthReport:
        """See :meth:`MessageStore.health`."""
        return await health_async(self.client)

    async def run(self, operation: Operation) -> Any:
        """See :meth:`MessageStore.run`."""
        return await self._finish(operate(self, operation))

    def stream(self, operation: Generator[Any, Any, Any]) -> AsyncIterator[Any]:
        """See :meth:`MessageStore.stream`."""
        return self._outputs(operate(self, operation))

    async def close(self) -> None:
        """See :meth:`MessageStore.close`: the open watchers end first (a read one awaits now is
        cancelled; its ``async for`` ends with no error), then the client closes."""
        watchers = list(self._watchers)
        pending = [read for watcher in watchers if (read := watcher.stop()) is not None]
        if pending:
            await asyncio.wait(pending, timeout=WATCHER_STOP_SECONDS)
        for watcher in watchers:
            await watcher.aclose()
        await self.client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _fakeredis() -> Any:
    try:
        import fakeredis
        import lupa  # noqa: F401  (fakeredis runs Lua only with it)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"in_memory() needs fakeredis with Lua, which is not installed ({exc.name} is missing): "
            'pip install "kvstore[in-memory]"',
            name=exc.name,
        ) from exc
    return fakeredis
