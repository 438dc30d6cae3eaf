"""What a store answers about owners (docs/OWNERS.md): an owner's threads by activity, its
usage and quotas, and its erasure. MessageStore and AsyncMessageStore take these methods from
the two classes here; the operations are kvstore/_engine/owners.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from ._engine import owners
from ._engine.layout.keys import check_owner_id
from ._engine.operation import Operation
from ._engine.owners import ListOrder
from .models import ErasureReceipt, OwnerUsage, ThreadsPage

T = TypeVar("T")


def _quotas(
    threads: int | None, stored_bytes: int | None, per_minute: int | None
) -> tuple[int, int, int]:
    return (
        owners.quota_value(threads, "threads"),
        owners.quota_value(stored_bytes, "stored_bytes"),
        owners.quota_value(per_minute, "messages_per_minute"),
    )


class OwnerMethods:
    """MessageStore's owner methods."""

    config: Any
    _count_tokens: Any

    def run(self, operation: Operation[T]) -> T:  # MessageStore.run
        raise NotImplementedError

    def threads(
        self,
        owner: str,
        *,
        order: ListOrder = "recent",
        after: str | None = None,
        limit: int = 50,
        where: Mapping[str, str] | None = None,
    ) -> ThreadsPage:
        """A page of `owner`'s threads: most recent activity first (``order="recent"``), or
        newest made first (``"created"``), each with its title, metadata, times and counts.
        Costs the page, not the owner's thread count. `where` keeps the threads whose metadata
        has that one key with that value. A deleted or expired thread is not listed; a thread
        whose activity moves while you page is not listed twice. Every argument is checked
        before anything is sent: InvalidOwnerId, InvalidCursor (an order, limit or `after`
        that is not a next_cursor of this order), InvalidMessage (`where`).

        Example::

            page = store.threads("user-42", limit=20)
            while page.next_cursor:
                page = store.threads("user-42", after=page.next_cursor, limit=20)
        """
        owners.listing(owner, order, after, limit, where)  # checked before the store is used
        return self.run(owners.list_threads(self.config, owner, order, after, limit, where))

    def owner_usage(self, owner: str) -> OwnerUsage:
        """`owner`'s threads, messages, stored bytes and tokens, and its quotas, in one call.

        Example::

            store.owner_usage("user-42").stored_bytes
        """
        return self.run(owners.owner_usage(self.config, check_owner_id(owner)))

    def set_owner_quota(
        self,
        owner: str,
        *,
        threads: int | None = None,
        stored_bytes: int | None = None,
        messages_per_minute: int | None = None,
    ) -> OwnerUsage:
        """Sets `owner`'s quotas (None: no quota of that kind); every write of its threads is
        checked against them in its own script, before it writes: QuotaExceeded (threads,
        messages a minute) or StorageQuotaExceeded (bytes). Returns the usage.

        Example::

            store.set_owner_quota("user-42", threads=100, messages_per_minute=60)
        """
        quotas = _quotas(threads, stored_bytes, messages_per_minute)
        return self.run(owners.owner_usage(self.config, check_owner_id(owner), quotas))

    def erase_owner(self, owner: str) -> ErasureReceipt:
        """Deletes every thread, message, event stream and directory entry of `owner`, in
        bounded steps; writes to its threads are refused (OwnerErasing) until it ends. Stopped
        anywhere (a crash, a timeout), calling it again goes on; calling it for an erased owner
        returns a receipt of 0 threads.

        Example::

            receipt = store.erase_owner("user-42")
            receipt.threads, receipt.messages
        """
        check_owner_id(owner)
        return self.run(owners.erase_owner(self.config, owner, self._count_tokens))


class AsyncOwnerMethods:
    """AsyncMessageStore's owner methods: see OwnerMethods."""

    config: Any
    _count_tokens: Any

    async def run(self, operation: Operation[T]) -> T:  # AsyncMessageStore.run
        raise NotImplementedError

    async def threads(
        self,
        owner: str,
        *,
        order: ListOrder = "recent",
        after: str | None = None,
        limit: int = 50,
        where: Mapping[str, str] | None = None,
    ) -> ThreadsPage:
        """See :meth:`OwnerMethods.threads`."""
        owners.listing(owner, order, after, limit, where)  # checked before the store is used
        return await self.run(owners.list_threads(self.config, owner, order, after, limit, where))

    async def owner_usage(self, owner: str) -> OwnerUsage:
        """See :meth:`OwnerMethods.owner_usage`."""
        return await self.run(owners.owner_usage(self.config, check_owner_id(owner)))

    async def set_owner_quota(
        self,
        owner: str,
        *,
        threads: int | None = None,
        stored_bytes: int | None = None,
        messages_per_minute: int | None = None,
    ) -> OwnerUsage:
        """See :meth:`OwnerMethods.set_owner_quota`."""
        quotas = _quotas(threads, stored_bytes, messages_per_minute)
        return await self.run(owners.owner_usage(self.config, check_owner_id(owner), quotas))

    async def erase_owner(self, owner: str) -> ErasureReceipt:
        """See :meth:`OwnerMethods.erase_owner`."""
        check_owner_id(owner)
        return await self.run(owners.erase_owner(self.config, owner, self._count_tokens))
