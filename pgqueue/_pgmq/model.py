"""What the pgmq facade and the import report, and how they refuse: constants, errors, results."""

from __future__ import annotations

from dataclasses import dataclass

from pgqueue._errors import PgQueueError

# The PGMQ API version the facade emulates (its signatures, defaults, types).
FACADE_VERSION = "1.13.0"
# The comment that marks schema pgmq as pgqueue's facade (then its version).
COMMENT_PREFIX = "pgqueue pgmq facade"
# PGMQ never poison-drops: an imported queue gets the most attempts there are.
NEVER_POISON = 2_147_483_647
# The header PGMQ's FIFO groups read; the facade sends it as the group key.
GROUP_HEADER = "x-pgmq-group"
# That header's value, as SQL over a PGMQ message row: the group key it becomes
# (itself, or for an empty or long text a digest of it: sql/schema/queue.sql).
GROUP_KEY = f"pgqueue._pgmq_group(headers->>'{GROUP_HEADER}')"


class PgmqConflict(PgQueueError):
    """A real PGMQ (or a stranger's schema pgmq) is here: the facade cannot go beside it."""


class PgmqImportRefused(PgQueueError):
    """`pgqueue pgmq import` found something it cannot move as it is; nothing was changed."""


@dataclass(frozen=True, slots=True)
class PgmqStatus:
    """What holds the `pgmq` schema of a database."""

    installed: bool
    """pgqueue's facade is installed."""
    version: str | None
    """The PGMQ API version the installed facade emulates."""
    as_extension: bool
    """Installed as the extension pgmq (extension/), not by `pgqueue pgmq install`."""
    real_pgmq: str | None
    """None, or what else holds schema pgmq: a real PGMQ (extension or SQL), or a stranger."""
    pgmq_queues: int
    """How many queues a real PGMQ holds (what `pgqueue pgmq import` would move)."""
    available_version: str = FACADE_VERSION
    """The version this pgqueue's facade would install."""


@dataclass(frozen=True, slots=True)
class QueueImport:
    """One PGMQ queue as the import moved it (or would, in a dry run)."""

    queue_name: str
    """The pgqueue queue: PGMQ's name lowercased (as PGMQ's tables and the facade have it)."""
    pgmq_name: str
    """The name in pgmq.meta."""
    live: int
    """Live messages (read or not, delayed or not) copied, ids and read counts kept."""
    archived: int
    """Archived messages copied, with their archived_at."""
    partitioned: bool
    unlogged: bool
    """An unlogged PGMQ queue becomes an ordinary (logged) pgqueue queue."""
    last_msg_id: int
    """The highest msg_id PGMQ ever handed out for it; pgqueue's next is above it."""
    grouped: int
    """Live messages whose x-pgmq-group header became their group key."""
    notify_throttle_ms: int | None
    """PGMQ's notify-on-insert throttle, carried over; None when it was off."""
    topic_patterns: tuple[str, ...]
    """Topic patterns bound to it, carried over (or reported: docs/pgmq.md)."""
    null_payloads: int
    """Messages (live or archived) whose payload was SQL NULL, stored as JSON null."""
    max_attempts: int
    """The pgqueue queue's: 2147483647 (never poison, as PGMQ) unless it existed (empty) before."""
    retention: str = ""
    """What pg_partman kept of it in PGMQ, which the facade keeps; "" if nothing."""


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What `pgqueue pgmq import` moved, or would move in a dry run."""

    dry_run: bool
    pgmq: str
    """What held the queues: "extension 1.13.0" or "schema" (PGMQ installed as SQL)."""
    queues: tuple[QueueImport, ...]
    left_in_pgmq: tuple[str, ...]
    """PGMQ queues not selected (--queue): PGMQ stays for them, without the facade."""
    facade_version: str | None
    """The facade installed in PGMQ's place; None while PGMQ keeps queues (or in a dry run)."""
    notes: tuple[str, ...]
    """What the import could not carry as is, one line each."""
