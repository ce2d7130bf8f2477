"""`pgqueue migrate`, `pgqueue worker` and `pgqueue demo`."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from typing import Any

import click

from pgqueue._cli._common import (
    connection_options,
    expected_errors,
    open_client,
    setup_logging,
)
from pgqueue._cli._main import main
from pgqueue._client import Client
from pgqueue._settings import resolve_dsn


@main.command()
@connection_options
def migrate(dsn: str | None, connect_timeout: float) -> None:
    """Create or upgrade the pgqueue schema (safe to run concurrently and repeatedly)."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        applied = client.migrate()
    if applied:
        click.echo(f"applied {len(applied)} migration(s): {', '.join(applied)}")
    else:
        click.echo("schema is up to date; nothing to apply")


@main.command()
@click.argument("app_path", metavar="MODULE:APP")
@click.option("--dsn", default=None, metavar="DSN", help="Postgres DSN [$PGQUEUE_DSN].")
@click.option("--queue", "queues", multiple=True, help="Queue to consume (repeat); default: all.")
@click.option("--concurrency", type=int, default=None, help="Handlers running at once [4].")
@click.option(
    "--batch",
    type=int,
    default=None,
    help="Messages that may wait locally for a handler [0: 25 ms of work, >= concurrency].",
)
@click.option(
    "--readers", type=int, default=None, help="Reads in flight at once, for fast handlers [1]."
)
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
@click.option(
    "--startup-timeout",
    type=float,
    default=None,
    help="Seconds to wait for a database that is down or starting [60].",
)
def worker(app_path: str, dsn: str | None, queues: tuple[str, ...], **options: Any) -> None:
    """Run the handlers of MODULE:APP (a pgqueue.App) until SIGTERM or SIGINT.

    Every option can also come from the environment as PGQUEUE_<OPTION>
    (e.g. PGQUEUE_CONCURRENCY=8, PGQUEUE_QUEUES=a,b); flags win. The full
    list is in docs/cli.md.
    """
    from pgqueue._worker import Worker, WorkerSettings, load_app

    with expected_errors():
        app = load_app(app_path)
        settings = WorkerSettings.from_env(queues=queues or None, **options)
        started = time.monotonic()
        client = Client.from_dsn(
            dsn,
            max_size=settings.pool_size,
            wait_seconds=settings.startup_timeout,
        )
        # One startup deadline: what the first connection waited counts against it.
        waited = time.monotonic() - started
        settings = replace(settings, startup_timeout=max(0.0, settings.startup_timeout - waited))
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
@click.option("--dsn", default=None, metavar="DSN", help="Postgres DSN [$PGQUEUE_DSN].")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the barrier's callback.",
)
def demo(dsn: str | None, timeout: float) -> None:
    """Show the whole idea in under a minute, on the embedded Postgres when no DSN is set.

    Fans out 100 orders under a barrier, runs two consumers in this process;
    one order always fails and is poison-dropped after max_attempts, the
    barrier fires exactly once (succeeded=99 failed=1), and the poison table
    is printed. It uses the queues demo_orders and demo_orders_done.
    """
    from pgqueue._cli.demo import run_demo
    from pgqueue._embedded import start_embedded

    if "PGQUEUE_LOG_LEVEL" not in os.environ:
        setup_logging("ERROR")  # the demo narrates; worker logs would drown it
    with expected_errors():
        resolved = resolve_dsn(dsn)
        if resolved is None:
            click.echo("no PGQUEUE_DSN set: starting the embedded Postgres ...")
            resolved = start_embedded()
        with Client.from_dsn(resolved, max_size=4) as client:
            client.migrate()
            ok = run_demo(client, resolved, echo=click.echo, timeout=timeout)
    if not ok:
        sys.exit(1)
