"""MessageStore and AsyncMessageStore: thin executors over the sans-IO core.

Each thread method hands one core operation to its store, which runs it through the executor
(kvstore._engine.executor): how a script is called, reloaded and made durable, and which typed
error a failure is, is decided there once; a store only makes the steps, sync or awaited.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterable, Iterator
from typing import Any, Literal, Self

import redis
import redis.asyncio

from ._engine import core
from ._engine.core import Cursor, Operation, ThreadRef
from ._engine.executor import AsyncDriver, Executor, Pump, SyncDriver, operate
from ._engine.health import HealthReport, health, health_async
from .config import StoreConfig
from .messages import CompactionStats, Message, SummaryMessage
from .models import (
    AppendResult,
    MessagesPage,
    ThreadSnapshot,
    ThreadStats,
    TurnOutcome,
    TurnResult,
)

Order = Literal["asc", "desc"]
Messages = Message | dict | Iterable[Message | dict]


class MessageStore(SyncDriver, Executor):
    """A store over a synchronous client (redis.Redis, RedisCluster or fakeredis)."""

    @classmethod
    def from_url(cls, url: str, config: StoreConfig | None = None, **client_kwargs: Any) -> MessageStore:
        return cls(redis.Redis.from_url(url, decode_responses=False, **client_kwargs), config)

    @classmethod
    def in_memory(cls, config: StoreConfig | None = None) -> MessageStore:
        """A store on an in-process fakeredis server with Lua, for users' own tests."""
        import fakeredis

        return cls(fakeredis.FakeRedis(), config)

    def thread(self, thread_id: str) -> Thread:
        return Thread(self, ThreadRef.of(self.config, thread_id))

    def health(self) -> HealthReport:
        """The server's settings that kvstore's guarantees depend on: a warning for each that
        voids one, and each the client's user may not read in `unchecked` (docs/RELIABILITY.md)."""
        return health(self.client)

    def run(self, operation: Operation) -> Any:
        """Drives a core operation; a typed error is thrown back into it (it may handle it)."""
        return self._finish(operate(self, operation))

    def stream(self, operation: Generator[Any, Any, Any]) -> Iterator[Any]:
        """Drives a core operation that also yields outputs (core.pages), handing them out."""
        return self._outputs(Pump(operate(self, operation)))

    def close(self) -> None:
        """Closes the store's client (and its connections), a client you passed in too."""
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncMessageStore(AsyncDriver, Executor):
    """A store over an asyncio client (redis.asyncio.Redis or RedisCluster)."""

    @classmethod
    def from_url(cls, url: str, config: StoreConfig | None = None, **client_kwargs: Any) -> AsyncMessageStore:
        return cls(redis.asyncio.Redis.from_url(url, decode_responses=False, **client_kwargs), config)

    @classmethod
    def in_memory(cls, config: StoreConfig | None = None) -> AsyncMessageStore:
        import fakeredis

        return cls(fakeredis.FakeAsyncRedis(), config)

    def thread(self, thread_id: str) -> AsyncThread:
        return AsyncThread(self, ThreadRef.of(self.config, thread_id))

    async def health(self) -> HealthReport:
        """See :meth:`MessageStore.health`."""
        return await health_async(self.client)

    async def run(self, operation: Operation) -> Any:
        """See :meth:`MessageStore.run`."""
        return await self._finish(operate(self, operation))

    def stream(self, operation: Generator[Any, Any, Any]) -> AsyncIterator[Any]:
        """See :meth:`MessageStore.stream`."""
        return self._outputs(Pump(operate(self, operation)))

    async def close(self) -> None:
        """See :meth:`MessageStore.close`."""
        await self.client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Bound:
    """What Thread and AsyncThread share: their store and the thread's keys."""

    def __init__(self, store: Any, ref: ThreadRef) -> None:
        self._store = store
        self._ref = ref

    @property
    def keys(self) -> core.ThreadKeys:
        return self._ref.keys


class Thread(_Bound):
    """One conversation. Cheap to make; holds no state beyond its keys."""

    _store: MessageStore

    def append(self, messages: Messages, turn_id: str | None = None) -> AppendResult:
        """Stores the messages in one atomic call; returns the stored copies (id, date, seq_id).

        Idempotent: every message the call sends carries an id, the call's token. A message of
        yours without an id (a model or a dict; JSON text cannot carry it back) gets the one the
        store made set on it before the call is sent, so sending the same messages again, after
        any interruption (a timeout, cancellation, KeyboardInterrupt, OutcomeUnknown, a retried
        request), is a replay: it writes nothing and returns the messages as first stored, with
        ``replayed`` true. To store the same content again as a new message, send a new message
        (or a copy without its id). Otids work the same way across processes: a batch whose
        otids are all stored is a replay.
        """
        return self._store.run(core.append(self._ref, messages, turn_id))

    def start_turn(self, turn_id: str) -> int:
        return self._store.run(core.start_turn(self._ref, turn_id))

    def finish_turn(self, turn_id: str, outcome: TurnOutcome = "completed") -> TurnResult:
        return self._store.run(core.finish_turn(self._ref, turn_id, outcome))

    def list(self, after: Cursor = None, before: Cursor = None, limit: int = 50, order: Order = "asc",
             turn_id: str | None = None) -> MessagesPage:
        return self._store.run(core.list_page(self._ref, after, before, limit, order, turn_id))

    def iter(self, order: Order = "asc") -> Iterator[Message]:
        for page in self._store.stream(core.pages(self._ref, order)):
            yield from page.messages

    def get(self, message_id: str) -> Message:
        return self._store.run(core.get(self._ref, message_id))

    def get_by_otid(self, otid: str) -> Message:
        """The stored message with that otid; MessageNotFound if none is (or it was deleted)."""
        return self._store.run(core.get_by_otid(self._ref, otid))

    def snapshot(self) -> ThreadSnapshot:
        return self._store.run(core.snapshot(self._ref))

    def context(self) -> list[Message]:
        return self._store.run(core.context(self._ref))

    def compact(self, summary: str, last_sequence: int, stats: CompactionStats | dict | None = None) -> SummaryMessage:
        return self._store.run(core.compact(self._ref, summary, last_sequence, stats))

    def replace(self, message_id: str, message: Message | dict) -> Message:
        return self._store.run(core.replace(self._ref, message_id, message))

    def remove_turn(self, turn_id: str) -> int:
        return self._store.run(core.remove_turn(self._ref, turn_id))

    def migrate(self, max_calls: int | None = None) -> int:
        return self._store.run(core.migrate(self._ref, max_calls))

    def stats(self) -> ThreadStats:
        return self._store.run(core.stats(self._ref))

    def delete(self) -> None:
        self._store.run(core.delete(self._ref))


class AsyncThread(_Bound):
    """The asyncio twin of :class:`Thread`: same methods, awaited."""

    _store: AsyncMessageStore

    async def append(self, messages: Messages, turn_id: str | None = None) -> AppendResult:
        """Stores the messages in one atomic call: see :meth:`Thread.append`.

        A call cut off by ``asyncio.wait_for``, ``asyncio.timeout`` or ``task.cancel()`` may
        still run on the server; the messages you passed already carry their ids, so sending
        them again stores them once::

            try:
                await asyncio.wait_for(thread.append(messages), 1)
            except TimeoutError:
                await thread.append(messages)  # a replay if the first call ran
        """
        return await self._store.run(core.append(self._ref, messages, turn_id))

    async def start_turn(self, turn_id: str) -> int:
        return await self._store.run(core.start_turn(self._ref, turn_id))

    async def finish_turn(self, turn_id: str, outcome: TurnOutcome = "completed") -> TurnResult:
        return await self._store.run(core.finish_turn(self._ref, turn_id, outcome))

    async def list(self, after: Cursor = None, before: Cursor = None, limit: int = 50, order: Order = "asc",
                   turn_id: str | None = None) -> MessagesPage:
        return await self._store.run(core.list_page(self._ref, after, before, limit, order, turn_id))

    async def iter(self, order: Order = "asc") -> AsyncIterator[Message]:
        async for page in self._store.stream(core.pages(self._ref, order)):
            for message in page.messages:
                yield message

    async def get(self, message_id: str) -> Message:
        return await self._store.run(core.get(self._ref, message_id))

    async def get_by_otid(self, otid: str) -> Message:
        """See :meth:`Thread.get_by_otid`."""
        return await self._store.run(core.get_by_otid(self._ref, otid))

    async def snapshot(self) -> ThreadSnapshot:
        return await self._store.run(core.snapshot(self._ref))

    async def context(self) -> list[Message]:
        return await self._store.run(core.context(self._ref))

    async def compact(self, summary: str, last_sequence: int, stats: CompactionStats | dict | None = None) -> SummaryMessage:
        return await self._store.run(core.compact(self._ref, summary, last_sequence, stats))

    async def replace(self, message_id: str, message: Message | dict) -> Message:
        return await self._store.run(core.replace(self._ref, message_id, message))

    async def remove_turn(self, turn_id: str) -> int:
        return await self._store.run(core.remove_turn(self._ref, turn_id))

    async def migrate(self, max_calls: int | None = None) -> int:
        return await self._store.run(core.migrate(self._ref, max_calls))

    async def stats(self) -> ThreadStats:
        return await self._store.run(core.stats(self._ref))

    async def delete(self) -> None:
        await self._store.run(core.delete(self._ref))
