"""The `pgqueue` command."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

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
    log_format = os.environ.get("PGQUEUE_LOG_FORMAT", "")
    configure_logging(
        json={"json": True, "console": False}.get(log_format),
        level=os.environ.get("PGQUEUE_LOG_LEVEL", "INFO"),
    )


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
@click.argument("app_path", metavar="MODULE:APP")
@_dsn_option
@click.option("--queue", "queues", multiple=True, help="Queue to consume (repeat); default: all.")
@click.option("--concurrency", type=int, default=None, help="Handlers running at once [4].")
@click.option("--batch", type=int, default=None, help="Messages per read [= concurrency].")
@click.option("--vt", type=int, default=None, help="Visibility timeout in seconds [30].")
@click.option(
    "--ack", type=click.Choice(["delete", "archive"]), default=None, help="How to ack [delete]."
)
@click.option("--hard-timeout", type=float, default=None, help="Give a hung message back [off].")
@click.option("--shutdown-grace", type=float, default=None, help="Seconds to finish work [30].")
@click.option("--poll-interval", type=float, default=None, help="Idle wait in seconds [1].")
@click.option("--listen/--no-listen", default=None, help="LISTEN/NOTIFY wake-ups [on].")
@click.option("--listen-dsn", default=None, help="Direct DSN for LISTEN (behind PgBouncer).")
@click.option("--health-file", default=None, help="File touched every loop, for probes.")
def worker(app_path: str, dsn: str | None, queues: tuple[str, ...], **options: Any) -> None:
    """Run the handlers of MODULE:APP (a pgqueue.App) until SIGTERM or SIGINT.

    Every option can also come from the environment as PGQUEUE_<OPTION>
    (e.g. PGQUEUE_CONCURRENCY=8, PGQUEUE_QUEUES=a,b); flags win.
    """
    from pgqueue.consumer import Worker, WorkerSettings, load_app

    with _expected_errors():
        app = load_app(app_path)
        settings = WorkerSettings.from_env(queues=queues or None, **options)
        client = Client.from_dsn(dsn, max_size=settings.concurrency + 3)
        try:
            code = Worker(app, client, settings).run()
        finally:
            client.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Handler threads that outlived the grace period were given back already;
    # do not wait for them at interpreter exit.
    os._exit(code)


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
