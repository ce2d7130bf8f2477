"""The `pgqueue` group itself; every command module attaches to it."""

from __future__ import annotations

import click

from pgqueue._cli._exits import PgQueueGroup
from pgqueue._cli._logging import setup_logging


@click.group(cls=PgQueueGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pgqueue")
def main() -> None:
    """pgqueue: a Postgres message queue with exactly-once fan-in barriers.

    Every command that talks to the database takes --dsn, else $PGQUEUE_DSN,
    else $DATABASE_URL. Exit codes: 0 done, 1 error (nothing was changed
    unless the message says so), 2 usage error, 130 interrupted.
    Logs go to stderr: PGQUEUE_LOG_FORMAT=json|console, PGQUEUE_LOG_LEVEL
    (WARNING for an operator's command, whose output says what it did; INFO
    for the worker).
    """
    setup_logging("WARNING")
