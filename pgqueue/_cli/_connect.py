"""How a command reaches the database: --dsn and --connect-timeout, a small client, its clock."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import click

from pgqueue._calls import Call, scalar
from pgqueue._client import Client
from pgqueue._retry import RetryPolicy

F = TypeVar("F", bound=Callable[..., Any])

DSN_HELP = "Postgres DSN [default: $PGQUEUE_DSN, then $DATABASE_URL]."

# An operator's command should answer or fail within seconds, not wait out a
# worker's retry budget.
CLI_RETRY = RetryPolicy(attempts=3, deadline_seconds=10.0)


def connection_options(func: F) -> F:
    """Add --dsn and --connect-timeout to a command."""
    func = click.option(
        "--connect-timeout",
        type=click.FloatRange(min=0.5),
        default=5.0,
        show_default=True,
        help="Seconds to wait for the server before giving up.",
    )(func)
    return click.option("--dsn", default=None, metavar="DSN", help=DSN_HELP)(func)


def open_client(dsn: str | None, connect_timeout: float) -> Client:
    """A small client for one command; fails within connect_timeout if the server is away."""
    return Client.from_dsn(
        dsn,
        min_size=0,
        max_size=2,
        connect_timeout=connect_timeout,
        retry=CLI_RETRY,
        dsn_source="--dsn",
    )


# The server's clock when the statement runs (now() would be its transaction's start).
NOW: Call[datetime] = Call("now", "SELECT clock_timestamp()", (), scalar)


def server_now(client: Client) -> datetime:
    """The server's clock: cut-offs and ages are computed on it, never on the operator's laptop."""
    return client.run(NOW)
