"""Fan-out and barriers, as methods of Client (BarrierApi) and AsyncClient (AsyncBarrierApi)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pgqueue._adapt import AsyncConnArg, ConnArg
from pgqueue._api.base import AsyncRunner, SyncRunner, run_traces
from pgqueue._calls import barrier as _barrier
from pgqueue.types import JSON, BarrierStatus, Duration, MemberFailure, MemberResult


class BarrierApi(SyncRunner):
    """Fan-out and barriers: the blocking methods."""

    def fan_out(
        self,
        queue: str,
        messages: Sequence[JSON],
        *,
        callback_queue: str,
        callback_message: JSON,
        barrier_id: str | None = None,
        headers: dict[str, Any] | None = None,
        deadline_seconds: Duration | None = None,
        policy: str | None = None,
        max_failures: int | None = None,
        max_failure_ratio: float | None = None,
        conn: ConnArg | None = None,
    ) -> str:
        """Send the members and arm a barrier atomically; exactly one callback will follow.

        The barrier id is generated here when not given, so a fan_out retried
        after a lost reply finds its first attempt and sends nothing twice.
        The callback follows when every member has an outcome, or at once when
        more members failed than the policy tolerates: `policy="fail_fast"`
        (none), `max_failures=N`, `max_failure_ratio=0.05`; members not yet
        started are then cancelled (docs/workflows.md).
        """
        barrier_id = barrier_id or str(uuid.uuid4())
        return self.run_send(
            queue,
            lambda trace: _barrier.fan_out(
                queue,
                messages,
                callback_queue,
                callback_message,
                barrier_id,
                headers,
                deadline_seconds,
                trace,
                policy,
                max_failures,
                max_failure_ratio,
            ),
            conn,
            count=len(messages),
            attributes={"pgqueue.barrier_id": barrier_id, "pgqueue.callback_queue": callback_queue},
        )

    def open_barrier(
        self,
        queue: str,
        *,
        callback_queue: str,
        callback_message: JSON,
        messages: Sequence[JSON] = (),
        barrier_id: str | None = None,
        headers: dict[str, Any] | None = None,
        deadline_seconds: Duration | None = None,
        policy: str | None = None,
        max_failures: int | None = None,
        max_failure_ratio: float | None = None,
        conn: ConnArg | None = None,
    ) -> str:
        """Arm a barrier that takes members until seal(); it fires only once sealed (or expired)."""
        barrier_id = barrier_id or str(uuid.uuid4())
        return self.run_send(
            queue,
            lambda trace: _barrier.open_barrier(
                queue,
                callback_queue,
                callback_message,
                barrier_id,
                headers,
                deadline_seconds,
                messages,
                trace,
                policy,
                max_failures,
                max_failure_ratio,
            ),
            conn,
            count=len(messages),
            attributes={"pgqueue.barrier_id": barrier_id, "pgqueue.callback_queue": callback_queue},
        )

    def add_members(
        self, barrier_id: str, messages: Sequence[JSON], *, conn: ConnArg | None = None
    ) -> list[int]:
        """Add members to an open barrier (in conn's transaction, if given); their msg_ids.

        BarrierConflict once it is sealed or fired. Exactly once across the
        client's retries.
        """
        return self.run(_barrier.add_members(barrier_id, messages), conn)

    def seal(self, barrier_id: str, *, conn: ConnArg | None = None) -> BarrierStatus:
        """No more members will come: the barrier fires once every member has an outcome."""
        return self.run(_barrier.seal(barrier_id), conn)

    def complete_member(
        self,
        queue: str,
        msg_id: int,
        *,
        outcome: str = "succeeded",
        result: JSON = None,
        read_ct: int | None = None,
        conn: ConnArg | None = None,
    ) -> BarrierStatus | None:
        """Ack a member and count it once; its barrier's state after, or None if not a member.

        With `read_ct` (for a failure: it speaks for one attempt) it acts only
        while that read's lease is current; None then also means it did not.
        """
        call = _barrier.complete_members(
            queue,
            [msg_id],
            [outcome],
            [result],
            None if read_ct is None else [read_ct],
            run_traces(self.tracing, 1),
        )
        statuses = self.run(call, conn)
        return statuses[0] if statuses else None

    def complete_members(
        self,
        queue: str,
        msg_ids: Sequence[int],
        *,
        outcomes: Sequence[str] | None = None,
        results: Sequence[JSON] | None = None,
        read_cts: Sequence[int | None] | None = None,
        conn: ConnArg | None = None,
    ) -> list[BarrierStatus]:
        """Ack and count many members in one transaction; the state of each barrier touched.

        An entry with a read_ct acts only while that read's lease is current.
        """
        return self.run(
            _barrier.complete_members(
                queue,
                msg_ids,
                outcomes,
                results,
                read_cts,
                run_traces(self.tracing, len(msg_ids)),
            ),
            conn,
        )

    def barrier_status(self, barrier_id: str) -> BarrierStatus:
        """The barrier's progress; raises BarrierNotFound for an unknown id."""
        return self.run(_barrier.barrier_status(barrier_id))

    def barrier_results(self, barrier_id: str) -> list[MemberResult]:
        """Each member's outcome and result, for the callback handler."""
        return self.run(_barrier.barrier_results(barrier_id))

    def barrier_failures(self, barrier_id: str, *, qty: int = 100) -> list[MemberFailure]:
        """The members that failed, were poisoned, purged or timed out, with the reason for each."""
        return self.run(_barrier.barrier_failures(barrier_id, qty))

    def list_barriers(self, *, state: str | None = None, qty: int = 100) -> list[BarrierStatus]:
        """The newest barriers, optionally only open, fired or expired ones."""
        return self.run(_barrier.list_barriers(state, qty))

    def expire_barriers(self) -> int:
        """Fire overdue barriers with missing members timed out; safe from every process at once."""
        return self.run(_barrier.expire_barriers())


class AsyncBarrierApi(AsyncRunner):
    """Fan-out and barriers: the asyncio methods, with the same guarantees."""

    async def fan_out(
        self,
        queue: str,
        messages: Sequence[JSON],
        *,
        callback_queue: str,
        callback_message: JSON,
        barrier_id: str | None = None,
        headers: dict[str, Any] | None = None,
        deadline_seconds: Duration | None = None,
        policy: str | None = None,
        max_failures: int | None = None,
        max_failure_ratio: float | None = None,
        conn: AsyncConnArg | None = None,
    ) -> str:
        """Send the members and arm a barrier atomically; exactly one callback will follow.

        The barrier id is generated here when not given, so a fan_out retried
        after a lost reply finds its first attempt and sends nothing twice.
        The callback follows when every member has an outcome, or at once when
        more members failed than the policy tolerates: `policy="fail_fast"`
        (none), `max_failures=N`, `max_failure_ratio=0.05`; members not yet
        started are then cancelled (docs/workflows.md).
        """
        barrier_id = barrier_id or str(uuid.uuid4())
        return await self.run_send(
            queue,
            lambda trace: _barrier.fan_out(
                queue,
                messages,
                callback_queue,
                callback_message,
                barrier_id,
                headers,
                deadline_seconds,
                trace,
                policy,
                max_failures,
                max_failure_ratio,
            ),
            conn,
            count=len(messages),
            attributes={"pgqueue.barrier_id": barrier_id, "pgqueue.callback_queue": callback_queue},
        )

    async def open_barrier(
        self,
        queue: str,
        *,
        callback_queue: str,
        callback_message: JSON,
        messages: Sequence[JSON] = (),
        barrier_id: str | None = None,
        headers: dict[str, Any] | None = None,
        deadline_seconds: Duration | None = None,
        policy: str | None = None,
        max_failures: int | None = None,
        max_failure_ratio: float | None = None,
        conn: AsyncConnArg | None = None,
    ) -> str:
        """Arm a barrier that takes members until seal(); it fires only once sealed (or expired)."""
        barrier_id = barrier_id or str(uuid.uuid4())
        return await self.run_send(
            queue,
            lambda trace: _barrier.open_barrier(
                queue,
                callback_queue,
                callback_message,
                barrier_id,
                headers,
                deadline_seconds,
                messages,
                trace,
                policy,
                max_failures,
                max_failure_ratio,
            ),
            conn,
            count=len(messages),
            attributes={"pgqueue.barrier_id": barrier_id, "pgqueue.callback_queue": callback_queue},
        )

    async def add_members(
        self, barrier_id: str, messages: Sequence[JSON], *, conn: AsyncConnArg | None = None
    ) -> list[int]:
        """Add members to an open barrier (in conn's transaction, if given); their msg_ids.

        BarrierConflict once it is sealed or fired. Exactly once across the
        client's retries.
        """
        return await self.run(_barrier.add_members(barrier_id, messages), conn)

    async def seal(self, barrier_id: str, *, conn: AsyncConnArg | None = None) -> BarrierStatus:
        """No more members will come: the barrier fires once every member has an outcome."""
        return await self.run(_barrier.seal(barrier_id), conn)

    async def complete_member(
        self,
        queue: str,
        msg_id: int,
        *,
        outcome: str = "succeeded",
        result: JSON = None,
        read_ct: int | None = None,
        conn: AsyncConnArg | None = None,
    ) -> BarrierStatus | None:
        """Ack a member and count it once; its barrier's state after, or None if not a member.

        With `read_ct` (for a failure: it speaks for one attempt) it acts only
        while that read's lease is current; None then also means it did not.
        """
        call = _barrier.complete_members(
            queue,
            [msg_id],
            [outcome],
            [result],
            None if read_ct is None else [read_ct],
            run_traces(self.tracing, 1),
        )
        statuses = await self.run(call, conn)
        return statuses[0] if statuses else None

    async def complete_members(
        self,
        queue: str,
        msg_ids: Sequence[int],
        *,
        outcomes: Sequence[str] | None = None,
        results: Sequence[JSON] | None = None,
        read_cts: Sequence[int | None] | None = None,
        conn: AsyncConnArg | None = None,
    ) -> list[BarrierStatus]:
        """Ack and count many members in one transaction; the state of each barrier touched.

        An entry with a read_ct acts only while that read's lease is current.
        """
        return await self.run(
            _barrier.complete_members(
                queue,
                msg_ids,
                outcomes,
                results,
                read_cts,
                run_traces(self.tracing, len(msg_ids)),
            ),
            conn,
        )

    async def barrier_status(self, barrier_id: str) -> BarrierStatus:
        """The barrier's progress; raises BarrierNotFound for an unknown id."""
        return await self.run(_barrier.barrier_status(barrier_id))

    async def barrier_results(self, barrier_id: str) -> list[MemberResult]:
        """Each member's outcome and result, for the callback handler."""
        return await self.run(_barrier.barrier_results(barrier_id))

    async def barrier_failures(self, barrier_id: str, *, qty: int = 100) -> list[MemberFailure]:
        """The members that failed, were poisoned, purged or timed out, with the reason for each."""
        return await self.run(_barrier.barrier_failures(barrier_id, qty))

    async def list_barriers(
        self, *, state: str | None = None, qty: int = 100
    ) -> list[BarrierStatus]:
        """The newest barriers, optionally only open, fired or expired ones."""
        return await self.run(_barrier.list_barriers(state, qty))

    async def expire_barriers(self) -> int:
        """Fire overdue barriers with missing members timed out; safe from every process at once."""
        return await self.run(_barrier.expire_barriers())
