"""Single-flight claims: one holder per key at a time, leases for crash recovery, tombstones."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING

import structlog

from pgqueue.calls import Call, scalar
from pgqueue.errors import PgQueueError

if TYPE_CHECKING:
    from pgqueue.client import Client

log = structlog.get_logger("pgqueue")


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A claim as stored: held (with a lease) or finished (a tombstone)."""

    key: str
    owner: str
    state: str
    lease_until: datetime | None
    claimed_at: datetime
    finished_at: datetime | None


def default_owner() -> str:
    """A name unique to this process and call: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def claim(key: str, owner: str, lease_seconds: int) -> Call[bool]:
    """Take the key if free, expired, or already ours; False if held by another or finished."""
    return Call("claim", "SELECT pgqueue.claim(%s, %s, %s)", (key, owner, lease_seconds), scalar)


def renew(key: str, owner: str, lease_seconds: int) -> Call[bool]:
    """Extend our lease; False if the key is no longer ours."""
    return Call("renew", "SELECT pgqueue.renew(%s, %s, %s)", (key, owner, lease_seconds), scalar)


def release(key: str, owner: str) -> Call[bool]:
    """Give the key up so another owner can take it now; False if it was not ours."""
    return Call("release", "SELECT pgqueue.release(%s, %s)", (key, owner), scalar)


def finish(key: str, owner: str) -> Call[bool]:
    """Mark the work done for good: the key can never be claimed again (a tombstone)."""
    return Call("finish_claim", "SELECT pgqueue.finish_claim(%s, %s)", (key, owner), scalar)


def list_claims(qty: int = 100) -> Call[list[ClaimRecord]]:
    """The most recent claims and tombstones."""
    return Call(
        "list_claims",
        "SELECT * FROM pgqueue.list_claims(%s)",
        (qty,),
        lambda rows: [ClaimRecord(*r) for r in rows],
    )


def purge_claims(older_than_seconds: int) -> Call[int]:
    """Delete tombstones finished longer ago than that; how many."""
    return Call("purge_claims", "SELECT pgqueue.purge_claims(%s)", (older_than_seconds,), scalar)


class Claim:
    """A held-or-not claim on a key; renews its lease in the background while held.

    Use as a context manager: on a clean exit without `finish()` and on an
    exception the claim is released, so another owner may run the work.
    """

    def __init__(self, client: Client, key: str, owner: str, lease_seconds: int) -> None:
        """Prepare a claim; nothing happens until it is entered."""
        self.client = client
        self.key = key
        self.owner = owner
        self.lease_seconds = lease_seconds
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
        self.acquired = self.client.run(claim(self.key, self.owner, self.lease_seconds))
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
                renewed = self.client.run(renew(self.key, self.owner, self.lease_seconds))
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
        self.finished = self.client.run(finish(self.key, self.owner))
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
            self.client.run(release(self.key, self.owner))
