"""The worker registry and the rates, as methods of Client (WorkersApi) and AsyncClient."""

from __future__ import annotations

from collections.abc import Sequence

from pgqueue._api.base import AsyncRunner, SyncRunner
from pgqueue._calls import workers as _workers
from pgqueue.types import QueueMinute, WorkerInfo


class WorkersApi(SyncRunner):
    """The worker registry and the rates: the blocking methods."""

    def list_workers(self) -> list[WorkerInfo]:
        """Every worker registered by its heartbeats, newest started first, with whether alive."""
        return self.run(_workers.list_workers())

    def queue_rates(
        self, queues: Sequence[str] | None = None, *, minutes: int = 60
    ) -> list[QueueMinute]:
        """One row per queue (the named ones, else all) and minute of the last `minutes`.

        Oldest minute first within each queue; the current minute counts what
        happened so far. Sends are exact for any sender (from samples of the
        queue's sequence); acks, nacks and poisons are what pgqueue workers
        reported. Kept 2 hours: `minutes` is 1 to 120.
        """
        return self.run(_workers.queue_rates(queues, minutes))

    def sample_rates(self) -> int:
        """Sample this minute's sends of every queue, unless sampled already; the rows written.

        Workers do it in their heartbeat; call it every 30 s or so to count
        sends while no worker runs.
        """
        return self.run(_workers.sample_rates())


class AsyncWorkersApi(AsyncRunner):
    """The worker registry and the rates: the asyncio methods, with the same guarantees."""

    async def list_workers(self) -> list[WorkerInfo]:
        """Every worker registered by its heartbeats, newest started first, with whether alive."""
        return await self.run(_workers.list_workers())

    async def queue_rates(
        self, queues: Sequence[str] | None = None, *, minutes: int = 60
    ) -> list[QueueMinute]:
        """One row per queue (the named ones, else all) and minute of the last `minutes`.

        Oldest minute first within each queue; the current minute counts what
        happened so far. Sends are exact for any sender (from samples of the
        queue's sequence); acks, nacks and poisons are what pgqueue workers
        reported. Kept 2 hours: `minutes` is 1 to 120.
        """
        return await self.run(_workers.queue_rates(queues, minutes))

    async def sample_rates(self) -> int:
        """Sample this minute's sends of every queue, unless sampled already; the rows written.

        Workers do it in their heartbeat; call it every 30 s or so to count
        sends while no worker runs.
        """
        return await self.run(_workers.sample_rates())
