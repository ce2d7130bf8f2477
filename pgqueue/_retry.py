"""The retry policy for dead connections: the one place that decides what is retried."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import tenacity

from pgqueue._log import get_logger

log = get_logger()

# Class 08: connection exceptions. 57P01-57P03: the server is shutting down,
# crashed, or not accepting connections yet (restart, failover,
# pg_terminate_backend). Anything else (a constraint, a bad argument, a statement
# timeout) would fail again the same way, so it is never retried.
_DEAD_STATES = frozenset({"57P01", "57P02", "57P03"})

# 25006 read_only_sql_transaction: every write on a standby, or on a primary
# turned read-only without closing its sockets (an Aurora-style cluster
# endpoint that flipped roles: riverqueue/river #1225). It is an InternalError,
# not an OperationalError, so it needs naming here.
_READ_ONLY_STATE = "25006"
# 0A000 feature_not_supported is also what a standby says about an UNLOGGED
# table (pgqueue.worker, pgqueue.waiter): "cannot access temporary or unlogged
# relations during recovery". Only that text counts: 0A000 is otherwise a bug.
_UNSUPPORTED_STATE = "0A000"


def is_read_only_server(exc: BaseException) -> bool:
    """True when the server answered but cannot write: a standby, or a primary turned read-only.

    A routing signal, not a bad statement: the same call succeeds on the
    read-write node, so the connection is dropped and the call retried.
    """
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate == _READ_ONLY_STATE:
        return True
    return exc.sqlstate == _UNSUPPORTED_STATE and "during recovery" in str(exc).lower()


def is_dead_connection(exc: BaseException) -> bool:
    """True when the error means the connection (or the server) went away, not the statement.

    A connection to a read-only server counts as dead (is_read_only_server):
    it may answer, but never for a write until it is dropped for one to the
    read-write node.
    """
    if is_read_only_server(exc):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    if state is None:
        # Raised by the client itself: connection refused, reset, closed, or a
        # pool that could not hand out a connection in time.
        return True
    return state.startswith("08") or state in _DEAD_STATES


# How libpq says, at connect time, that the server is not (yet, or any more)
# there to talk to: worth waiting for. Anything else at connect time (a
# database or role that does not exist, a password refused, no pg_hba entry)
# will not change by waiting. libpq gives no SQLSTATE for these, only text.
_NOT_READY = (
    "connection refused",
    "timeout expired",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
    "server closed the connection unexpectedly",
    "no such file or directory",  # the Unix socket of a server that is not up
    "could not translate host name",  # a container whose database's name is not up yet
    "failed to resolve host",  # the same, as psycopg says it (it resolves names itself)
    "network is unreachable",
    "no route to host",
    "sorry, too many clients already",
    "remaining connection slots are reserved",
    # libpq with target_session_attrs=read-write (or primary) meeting only
    # standbys: in a failover the new primary is seconds away.
    "session is read-only",
    "server is in hot standby mode",
)


def is_server_not_ready(exc: BaseException) -> bool:
    """True when a failed connect means the server is down or starting, so waiting may help."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    text = str(exc).lower()
    return any(marker in text for marker in _NOT_READY)


# Deadlock and serialization failures abort a transaction that then changed
# nothing; for pgqueue's own single-call transactions a retry is always safe.
_ROLLED_BACK_STATES = frozenset({"40P01", "40001"})


def is_retryable(exc: BaseException) -> bool:
    """True for errors after which re-running the same call is safe and may succeed."""
    if is_dead_connection(exc):
        return True
    return isinstance(exc, psycopg.Error) and exc.sqlstate in _ROLLED_BACK_STATES


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long a call keeps trying on fresh connections before raising ConnectionLost."""

    # Bounded by time: many short waits, so a call gets through within about
    # half a second of the server being back (see PoolSpec.POOL_WAIT).
    attempts: int = 100
    deadline_seconds: float = 30.0
    initial_wait_seconds: float = 0.05
    max_wait_seconds: float = 0.5

    def _stop(self) -> tenacity.stop.stop_base:
        return tenacity.stop_after_attempt(self.attempts) | tenacity.stop_after_delay(
            self.deadline_seconds
        )

    def _wait(self) -> tenacity.wait.wait_base:
        return tenacity.wait_random_exponential(
            multiplier=self.initial_wait_seconds, max=self.max_wait_seconds
        )

    def retrying(
        self, what: str, on_retry: Callable[[str], None] | None = None
    ) -> tenacity.Retrying:
        """Retry `what` on dead connections and rolled-back transactions only, bounded, jittered.

        Each retry is logged (`connection.retry`) and told to `on_retry`.
        """
        return tenacity.Retrying(
            stop=self._stop(),
            wait=self._wait(),
            retry=tenacity.retry_if_exception(is_retryable),
            before_sleep=_log_retry(what, on_retry),
            reraise=True,
        )

    def async_retrying(
        self, what: str, on_retry: Callable[[str], None] | None = None
    ) -> tenacity.AsyncRetrying:
        """The asyncio twin of `retrying`."""
        return tenacity.AsyncRetrying(
            stop=self._stop(),
            wait=self._wait(),
            retry=tenacity.retry_if_exception(is_retryable),
            before_sleep=_log_retry(what, on_retry),
            reraise=True,
        )


def _log_retry(
    what: str, on_retry: Callable[[str], None] | None
) -> Callable[[tenacity.RetryCallState], None]:
    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None:
            on_retry(what)
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "connection.retry",
            call=what,
            attempt=state.attempt_number,
            error=str(exc).strip() if exc else None,
            sleep=round(state.upcoming_sleep, 3),
        )

    return before_sleep


NO_RETRY = RetryPolicy(attempts=1)
