"""What a client's calls meet beside their results: the SQL's NOTICEs, and who hears of them.

pgqueue's SQL tells the client by NOTICE what a read's rows cannot say (a
message it poison-dropped, a queue it found paused); every pooled
connection logs them and hands them to the client's `Observers`, which also
hear of retries and of connections the pool refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from pgqueue._log import get_logger

log = get_logger()

# The NOTICE a read raises for each message it poison-dropped: the rows a read
# returns are only the ones it delivered.
SQLSTATE_POISONED_NOTICE = "PGQ10"
# The NOTICE a read of a paused queue raises: it returned nothing for that reason.
SQLSTATE_PAUSED_NOTICE = "PGQ11"


@dataclass(eq=False)
class Observers:
    """Who hears what a client's calls meet beside their results (a worker's metrics do).

    Callbacks run on the thread of the call (or the connection's notice
    handler); they must be quick and must not raise.
    """

    # the queue, once per message a read poison-dropped (reported by NOTICE)
    read_poisoned: list[Callable[[str], None]] = field(default_factory=list)
    # the call's name, once per retry on a fresh connection
    retried: list[Callable[[str], None]] = field(default_factory=list)
    # the queue, once per read that found it paused (reported by NOTICE)
    read_paused: list[Callable[[str], None]] = field(default_factory=list)
    # when (time.monotonic()) and why the pool last refused a connection to a
    # read-only server: a call that then timed out waiting for one says so
    refused_read_only: tuple[float, str] | None = None

    def retry(self, what: str) -> None:
        """Tell every retry observer."""
        for callback in self.retried:
            callback(what)


def log_notice(diag: psycopg.errors.Diagnostic) -> str | None:
    """Log what pgqueue's SQL tells the client by NOTICE: one line per message a read poisoned.

    Returns the poisoned message's queue (None for any other notice).
    """
    if diag.sqlstate != SQLSTATE_POISONED_NOTICE:
        return None
    try:
        what = json.loads(diag.message_detail or "")
    except ValueError:
        return None
    log.warning(
        "message.poisoned",
        queue=what.get("queue"),
        msg_id=what.get("msg_id"),
        read_ct=what.get("read_ct"),
        reason=what.get("reason"),
        by="read",
    )
    queue = what.get("queue")
    return queue if isinstance(queue, str) else None


def paused_notice(diag: psycopg.errors.Diagnostic) -> str | None:
    """The queue a read found paused, when this is that NOTICE (else None); logged at DEBUG.

    Not above DEBUG: a worker reads its paused queues again every poll interval.
    """
    if diag.sqlstate != SQLSTATE_PAUSED_NOTICE:
        return None
    try:
        what = json.loads(diag.message_detail or "")
    except ValueError:
        return None
    queue = what.get("queue") if isinstance(what, dict) else None
    if not isinstance(queue, str):
        return None
    log.debug("read.paused", queue=queue, paused_by=what.get("paused_by"))
    return queue


def notice_handler(observers: Observers) -> Callable[[psycopg.errors.Diagnostic], None]:
    """What every pooled connection gets: notices logged, poison drops and pauses observed."""

    def handle(diag: psycopg.errors.Diagnostic) -> None:
        paused = paused_notice(diag)
        if paused is not None:
            for callback in observers.read_paused:
                callback(paused)
            return
        queue = log_notice(diag)
        if queue is not None:
            for callback in observers.read_poisoned:
                callback(queue)

    return handle
