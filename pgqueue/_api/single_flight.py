"""Single flight, as methods of Client (SingleFlightApi) and AsyncClient (AsyncSingleFlightApi)."""

from __future__ import annotations

from pgqueue._api.base import AsyncRunner, SyncRunner
from pgqueue._calls import single_flight as _single_flight
from pgqueue._single_flight import AsyncClaim, Claim, default_owner
from pgqueue.types import ClaimRecord, Duration


class SingleFlightApi(SyncRunner):
    """Single flight: the blocking methods."""

    def claim(self, key: str, *, owner: str | None = None, lease_seconds: Duration = 30) -> Claim:
        """A context manager holding `key` for one owner at a time, renewing its lease meanwhile.

        `with client.claim("orchestrate:A") as c:` then `c.acquired` says
        whether this caller holds it; `c.finish()` leaves a tombstone so the
        work can never run again; leaving without finish() releases the key.
        """
        return Claim(self.run, key, owner or default_owner(), lease_seconds)

    def list_claims(self, *, qty: int = 100) -> list[ClaimRecord]:
        """The most recent claims and tombstones."""
        return self.run(_single_flight.list_claims(qty))

    def purge_claims(self, *, older_than_seconds: Duration) -> int:
        """Delete tombstones older than that; how many."""
        return self.run(_single_flight.purge_claims(older_than_seconds))


class AsyncSingleFlightApi(AsyncRunner):
    """Single flight: the asyncio methods, with the same guarantees."""

    def claim(
        self, key: str, *, owner: str | None = None, lease_seconds: Duration = 30
    ) -> AsyncClaim:
        """An async context manager holding `key` for one owner at a time (see Client.claim)."""
        return AsyncClaim(self.run, key, owner or default_owner(), lease_seconds)

    async def list_claims(self, *, qty: int = 100) -> list[ClaimRecord]:
        """The most recent claims and tombstones."""
        return await self.run(_single_flight.list_claims(qty))

    async def purge_claims(self, *, older_than_seconds: Duration) -> int:
        """Delete tombstones older than that; how many."""
        return await self.run(_single_flight.purge_claims(older_than_seconds))
