"""The `pgqueue` command."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import click

from pgqueue.client import Client
from pgqueue.errors import PgQueueError
from pgqueue.log import configure_logging
from pgqueue.settings import resolve_dsn

F = TypeVar("F", bound=Callable[..., object])

DSN_HELP = "Postgres DSN; default $PGQUEUE_DSN, then $DATABASE_URL."


@contextmanager
def _expected_errors() -> Iterator[None]:
    """Turn pgqueue's own errors into one line on stderr and exit code 1."""
    try:
        yield
    except PgQueueError as exc:
        click.echo(f"pgqueue: error: {exc}", err=True)
        sys.exit(1)


def _dsn_option(func: F) -> F:
    return click.option("--dsn", envvar=None, default=None, help=DSN_HELP)(func)


@click.group()
@click.version_option(package_name="pgqueue")
def main() -> None:
    """pgqueue: a Postgres message queue with exactly-once fan-in barriers."""
    configure_logging()


@main.command()
@_dsn_option
@click.option("--connect-timeout", default=5.0, show_default=True, help="Seconds to wait.")
def migrate(dsn: str | None, connect_timeout: float) -> None:
    """Create or upgrade the pgqueue schema (safe to run concurrently and repeatedly)."""
    with _expected_errors():
        with Client.from_dsn(dsn, connect_timeout=connect_timeout) as client:
            applied = client.migrate()
        if applied:
            click.echo(f"applied {len(applied)} migration(s): {', '.join(applied)}")
        else:
            click.echo("schema is up to date; nothing to apply")


@main.command()
@_dsn_option
def demo(dsn: str | None) -> None:
    """Show the queue on the embedded Postgres (or --dsn / $PGQUEUE_DSN)."""
    from pgqueue.demo import run_demo
    from pgqueue.embedded import start_embedded

    with _expected_errors():
        resolved = resolve_dsn(dsn)
        if resolved is None:
            click.echo("no PGQUEUE_DSN set: starting the embedded Postgres ...")
            resolved = start_embedded()
        with Client.from_dsn(resolved) as client:
            client.migrate()
            run_demo(client, echo=click.echo)
        click.echo("next: run the tests with `pytest -n auto`, or read README.md")


if __name__ == "__main__":  # pragma: no cover
    main()
