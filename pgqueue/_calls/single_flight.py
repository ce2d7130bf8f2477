"""Single flight as calls: one holder per key, leases for crash recovery, tombstones."""

from __future__ import annotations

from pgqueue._calls import Call, int32, scalar, seconds
from pgqueue.types import ClaimRecord, Duration


def claim(key: str, owner: str, lease_seconds: Duration) -> Call[bool]:
    """Take the key if free, expired, or already ours; False if held by another or finished."""
    return Call(
        "claim",
        "SELECT pgqueue.claim(%s, %s, %s)",
        (key, owner, seconds("lease_seconds", lease_seconds)),
        scalar,
    )


def renew(key: str, owner: str, lease_seconds: Duration) -> Call[bool]:
    """Extend our lease; False if the key is no longer ours."""
    return Call(
        "renew",
        "SELECT pgqueue.renew(%s, %s, %s)",
        (key, owner, seconds("lease_seconds", lease_seconds)),
        scalar,
    )


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
        (int32("qty", qty),),
        lambda rows: [ClaimRecord(*r) for r in rows],
    )


def purge_claims(older_than_seconds: Duration) -> Call[int]:
    """Delete tombstones finished longer ago than that; how many."""
    return Call(
        "purge_claims",
        "SELECT pgqueue.purge_claims(%s)",
        (seconds("older_than_seconds", older_than_seconds),),
        scalar,
    )
