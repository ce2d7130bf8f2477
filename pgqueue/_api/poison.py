"""The poison table, as methods of Client (PoisonApi) and AsyncClient (AsyncPoisonApi)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pgqueue._adapt import AsyncConnArg, ConnArg
from pgqueue._api.base import AsyncRunner, SyncRunner
from pgqueue._calls import poison as _poison
from pgqueue.types import ANY_POISON, PoisonFilter, PoisonMessage


class PoisonApi(SyncRunner):
    """The poison table: the blocking methods."""

    def poison(
        self,
        queue: str,
        msg_id: int,
        reason: str,
        *,
        read_ct: int | None = None,
        conn: ConnArg | None = None,
    ) -> bool:
        """Move a message to the poison table now, with a reason; False if already gone.

        With the `read_ct` your read returned, only while your lease is the
        current one (False, and nothing changed, once another reader took it over).
        """
        return self.run(_poison.poison(queue, msg_id, reason, read_ct), conn)

    def poison_list(
        self,
        queue: str | None = None,
        *,
        qty: int = 100,
        since: datetime | None = None,
        reason: str | None = None,
    ) -> list[PoisonMessage]:
        """The latest poison messages, newest first; optionally only since, reason containing."""
        return self.run(_poison.poison_list(queue, qty, since, reason))

    def poison_get(self, queue: str, msg_id: int) -> PoisonMessage | None:
        """One poison message; None if the queue has none with that id."""
        return self.run(_poison.poison_get(queue, msg_id))

    def poison_count(self, queue: str | None = None, where: PoisonFilter = ANY_POISON) -> int:
        """How many poison messages match."""
        return self.run(_poison.poison_count(queue, where))

    def poison_ids(
        self,
        queue: str,
        *,
        after_msg_id: int = 0,
        qty: int = 500,
        where: PoisonFilter = ANY_POISON,
    ) -> list[int]:
        """The next page of matching poison ids above after_msg_id, ascending."""
        return self.run(_poison.poison_ids(queue, after_msg_id, qty, where))

    def poison_requeue(
        self, queue: str, msg_ids: Sequence[int], *, conn: ConnArg | None = None
    ) -> list[int]:
        """Give poisoned messages a fresh start in their queue; the ids requeued."""
        return self.run(_poison.poison_requeue(queue, msg_ids), conn)

    def poison_purge(
        self, queue: str, msg_ids: Sequence[int] | None = None, *, conn: ConnArg | None = None
    ) -> int:
        """Delete poisoned messages (all of the queue's when msg_ids is None); how many."""
        return self.run(_poison.poison_purge(queue, msg_ids), conn)


class AsyncPoisonApi(AsyncRunner):
    """The poison table: the asyncio methods, with the same guarantees."""

    async def poison(
        self,
        queue: str,
        msg_id: int,
        reason: str,
        *,
        read_ct: int | None = None,
        conn: AsyncConnArg | None = None,
    ) -> bool:
        """Move a message to the poison table now, with a reason; False if already gone.

        With the `read_ct` your read returned, only while your lease is the
        current one (False, and nothing changed, once another reader took it over).
        """
        return await self.run(_poison.poison(queue, msg_id, reason, read_ct), conn)

    async def poison_list(
        self,
        queue: str | None = None,
        *,
        qty: int = 100,
        since: datetime | None = None,
        reason: str | None = None,
    ) -> list[PoisonMessage]:
        """The latest poison messages, newest first; optionally only since, reason containing."""
        return await self.run(_poison.poison_list(queue, qty, since, reason))

    async def poison_get(self, queue: str, msg_id: int) -> PoisonMessage | None:
        """One poison message; None if the queue has none with that id."""
        return await self.run(_poison.poison_get(queue, msg_id))

    async def poison_count(self, queue: str | None = None, where: PoisonFilter = ANY_POISON) -> int:
        """How many poison messages match."""
        return await self.run(_poison.poison_count(queue, where))

    async def poison_ids(
        self,
        queue: str,
        *,
        after_msg_id: int = 0,
        qty: int = 500,
        where: PoisonFilter = ANY_POISON,
    ) -> list[int]:
        """The next page of matching poison ids above after_msg_id, ascending."""
        return await self.run(_poison.poison_ids(queue, after_msg_id, qty, where))

    async def poison_requeue(
        self, queue: str, msg_ids: Sequence[int], *, conn: AsyncConnArg | None = None
    ) -> list[int]:
        """Give poisoned messages a fresh start in their queue; the ids requeued."""
        return await self.run(_poison.poison_requeue(queue, msg_ids), conn)

    async def poison_purge(
        self,
        queue: str,
        msg_ids: Sequence[int] | None = None,
        *,
        conn: AsyncConnArg | None = None,
    ) -> int:
        """Delete poisoned messages (all of the queue's when msg_ids is None); how many."""
        return await self.run(_poison.poison_purge(queue, msg_ids), conn)
