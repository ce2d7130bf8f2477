"""Single flight: one holder per key at a time, renewed in the background, tombstoned when done."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from pgqueue._calls import Call, seconds
from pgqueue._calls.single_flight import claim, finish, release, renew
from pgqueue._errors import PgQueueError
from pgqueue._log import get_logger
from pgqueue.types import Duration

log = get_logger()

# How a claim runs its calls: the client's run (retried on dead connections).
Runner = Callable[[Call[Any]], Any]
AsyncRunner = Callable[[Call[Any]], Awaitable[Any]]


def default_owner() -> str:
    """A name unique to this process and call: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Claim:
    """A held-or-not claim on a key; renews its lease in the background while held.

    Use as a context manager: on a clean exit without `finish()` and on an
    exception the claim is released, so another owner may run the work.
    """

    def __init__(self, run: Runner, key: str, owner: str, lease_seconds: Duration) -> None:
        """Prepare a claim whose calls go through `run`; nothing happens until it is entered."""
        self._run = run
        self.key = key
        self.owner = owner
        self.lease_seconds = seconds("lease_seconds", lease_seconds)
        self.acquired = False
        self.finished = False
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def lost(self) -> bool:
        """True once a renewal found the key taken over (our lease had run out)."""
        return self._lost.is_set()

    def __enter__(self) -> Claim:
        self.acquired = self._run(claim(self.key, self.owner, self.lease_seconds))
        if self.acquired:
            self._renewer = threading.Thread(
                target=self._renew_loop, name=f"pgqueue-claim-{self.key}", daemon=True
            )
            self._renewer.start()
        return self

    def _renew_loop(self) -> None:
        interval = max(self.lease_seconds / 3, 0.2)
        while not self._stop.wait(interval):
            try:
                renewed = self._run(renew(self.key, self.owner, self.lease_seconds))
            except PgQueueError as exc:
                # Past the retry policy the lease cannot be vouched for any more:
                # say it is lost rather than let the holder work on unprotected.
                log.error("claim.renew_failed", key=self.key, owner=self.owner, error=str(exc))
                renewed = False
            if not renewed:
                log.warning("claim.lost", key=self.key, owner=self.owner)
                self._lost.set()
                return

    def finish(self) -> bool:
        """Leave a tombstone now: a late duplicate can never claim this key again."""
        self._stop_renewing()
        self.finished = self._run(finish(self.key, self.owner))
        return self.finished

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_renewing()
        if self.acquired and not self.finished:
            self._run(release(self.key, self.owner))


class AsyncClaim:
    """Claim's asyncio twin: `async with client.claim(key) as c:`; renews in a task."""

    def __init__(self, run: AsyncRunner, key: str, owner: str, lease_seconds: Duration) -> None:
        """Prepare a claim whose calls go through `run`; nothing happens until it is entered."""
        self._run = run
        self.key = key
        self.owner = owner
        self.lease_seconds = seconds("lease_seconds", lease_seconds)
        self.acquired = False
        self.finished = False
        self.lost = False
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncClaim:
        self.acquired = bool(await self._run(claim(self.key, self.owner, self.lease_seconds)))
        if self.acquired:
            self._renewer = asyncio.create_task(self._renew_loop())
        return self

    async def _renew_loop(self) -> None:
        interval = max(self.lease_seconds / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            try:
                renewed = await self._run(renew(self.key, self.owner, self.lease_seconds))
            except PgQueueError as exc:
                log.error("claim.renew_failed", key=self.key, owner=self.owner, error=str(exc))
                renewed = False
            if not renewed:
                log.warning("claim.lost", key=self.key, owner=self.owner)
                self.lost = True
                return

    async def finish(self) -> bool:
        """Leave a tombstone now: a late duplicate can never claim this key again."""
        await self._stop_renewing()
        self.finished = bool(await self._run(finish(self.key, self.owner)))
        return self.finished

    async def _stop_renewing(self) -> None:
        if self._renewer is not None and not self._renewer.done():
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop_renewing()
        if self.acquired and not self.finished:
            await self._run(release(self.key, self.owner))
