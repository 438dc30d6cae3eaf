"""AsyncThread: the asyncio twin of Thread, each method one awaited call to its store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from ._engine import core, owner_entries, owners
from ._engine.core import Cursor
from .events import TurnLease
from .messages import CompactionStats, Message, SummaryMessage
from .models import (
    AppendResult,
    MessagesPage,
    ThreadInfo,
    ThreadSnapshot,
    ThreadStats,
)
from .thread_base import (
    AwaitsOperations,
    Messages,
    Order,
    _MessageList,
    thread_id_of,
    turn_args,
)
from .turns import AsyncThreadTurns


class AsyncThread(AsyncThreadTurns):
    """The asyncio twin of :class:`Thread`: same methods, awaited."""

    _store: AwaitsOperations[AsyncThread]

    async def append(
        self,
        messages: Messages,
        turn_id: str | TurnLease | None = None,
        tokens: Sequence[int] | None = None,
    ) -> AppendResult:
        """Stores the messages in one atomic call: see :meth:`Thread.append`.

        A call cut off by ``asyncio.wait_for``, ``asyncio.timeout`` or ``task.cancel()`` may
        still run on the server; the messages you passed already carry their ids, so sending
        them again stores them once::

            try:
                await asyncio.wait_for(thread.append(messages), 1)
            except TimeoutError:
                await thread.append(messages)  # a replay if the first call ran
        """
        return await self._store.run(
            core.append(self._ref, messages, *turn_args(turn_id), tokens=tokens)
        )

    async def list(
        self,
        after: Cursor = None,
        before: Cursor = None,
        limit: int = 50,
        order: Order = "asc",
        turn_id: str | None = None,
    ) -> MessagesPage:
        """The awaited :meth:`Thread.list`: same arguments, result and errors.

        Example::

            page = await thread.list(limit=50, order="desc")
        """
        return await self._store.run(
            core.list_page(self._ref, after, before, limit, order, turn_id)
        )

    async def iter(self, order: Order = "asc") -> AsyncIterator[Message]:
        """The async iterator of :meth:`Thread.iter`: same order and paging.

        Example::

            async for message in thread.iter(order="desc"):
                print(message.seq_id)
        """
        async for page in self._store.stream(core.pages(self._ref, order)):
            for message in page.messages:
                yield message

    async def get(self, message_id: str) -> Message:
        """The awaited :meth:`Thread.get`: same arguments, result and errors.

        Example::

            message = await thread.get(message_id)
        """
        return await self._store.run(core.get(self._ref, message_id))

    async def get_by_otid(self, otid: str) -> Message:
        """See :meth:`Thread.get_by_otid`."""
        return await self._store.run(core.get_by_otid(self._ref, otid))

    async def snapshot(self) -> ThreadSnapshot:
        """The awaited :meth:`Thread.snapshot`: same arguments, result and errors.

        Example::

            snap = await thread.snapshot()
        """
        return await self._store.run(core.snapshot(self._ref))

    async def context(
        self, max_tokens: int | None = None, count_tokens: Callable[[Message], int] | None = None
    ) -> _MessageList:
        """The awaited :meth:`Thread.context`: same arguments, result and errors.

        Example::

            messages = await thread.context(max_tokens=8000)
        """
        return await self._store.run(core.context(self._ref, max_tokens, count_tokens))

    async def compact(
        self,
        summary: str,
        last_sequence: int,
        stats: CompactionStats | dict[str, Any] | None = None,
        tokens: int | None = None,
    ) -> SummaryMessage:
        """The awaited :meth:`Thread.compact`: same arguments, result and errors.

        Example::

            summary = await thread.compact("The user asked about Oslo.", last_sequence)
        """
        return await self._store.run(core.compact(self._ref, summary, last_sequence, stats, tokens))

    async def fork(self, new_thread_id: str, at: str | int) -> AsyncThread:
        """The awaited :meth:`Thread.fork`: same arguments, result and errors.

        Example::

            draft = await thread.fork("user-42:session-7:edit-1", at=user_message_id)
        """
        new = self._store.thread(new_thread_id, self._ref.owner)
        await self._store.run(core.fork(self._ref, thread_id_of(self._ref), new._ref, at))
        return new

    async def replace(
        self, message_id: str, message: Message | dict[str, Any], tokens: int | None = None
    ) -> Message:
        """The awaited :meth:`Thread.replace`: same arguments, result and errors.

        Example::

            await thread.replace(message.id, AssistantMessage(content="Cloudy, 5 °C."))
        """
        return await self._store.run(core.replace(self._ref, message_id, message, tokens))

    async def remove_turn(self, turn_id: str) -> int:
        """The awaited :meth:`Thread.remove_turn`: same arguments, result and errors.

        Example::

            removed = await thread.remove_turn("turn-1")
        """
        return await self._store.run(core.remove_turn(self._ref, turn_id))

    async def migrate(self, max_calls: int | None = None) -> int:
        """The awaited :meth:`Thread.migrate`: same arguments, result and errors.

        Example::

            calls = await thread.migrate()
        """
        return await self._store.run(core.migrate(self._ref, max_calls))

    async def stats(self) -> ThreadStats:
        """The awaited :meth:`Thread.stats`: same arguments, result and errors.

        Example::

            stats = await thread.stats()
        """
        return await self._store.run(core.stats(self._ref))

    async def info(self) -> ThreadInfo | None:
        """See :meth:`Thread.info`."""
        return await self._store.run(owner_entries.thread_info(self._ref))

    async def set_info(
        self, *, title: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> bool:
        """See :meth:`Thread.set_info`."""
        return await self._store.run(owners.set_info(self._ref, title, metadata))

    async def delete(self) -> None:
        """The awaited :meth:`Thread.delete`: same arguments, result and errors.

        Example::

            await thread.delete()
        """
        await self._store.run(core.delete(self._ref))
