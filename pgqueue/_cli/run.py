"""`pgqueue migrate`, `pgqueue worker` and `pgqueue demo`."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from dataclasses import replace
from typing import Any

import click

from pgqueue._cli._connect import connection_options, open_client
from pgqueue._cli._exits import expected_errors, fail
from pgqueue._cli._logging import setup_logging
from pgqueue._cli._main import main
from pgqueue._client import Client
from pgqueue._errors import InvalidArgument, InvalidSettings
from pgqueue._listen import DEFAULT_HOST
from pgqueue._settings import Dsn, find_dsn


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
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve Prometheus /metrics on this port [0: off]; needs pgqueue-py[prometheus].",
)
@click.option(
    "--metrics-host",
    default=None,
    metavar="ADDR",
    help=f"Address /metrics listens on [{DEFAULT_HOST}; 0.0.0.0: every interface].",
)
@click.option(
    "--registry-interval",
    type=float,
    default=None,
    help="Seconds between the worker's heartbeats to pgqueue.worker (`workers list`) [5; 0: off].",
)
@click.option(
    "--trace-links",
    type=int,
    default=None,
    help="Member runs a callback's span links, when tracing [127].",
)
def worker(app_path: str, dsn: str | None, queues: tuple[str, ...], **options: Any) -> None:
    """Run the handlers of MODULE:APP (a pgqueue.App) until SIGTERM or SIGINT.

    Every option can also come from the environment as PGQUEUE_<OPTION>
    (e.g. PGQUEUE_CONCURRENCY=8, PGQUEUE_QUEUES=a,b); flags win. The full
    list is in docs/cli.md.
    """
    from pgqueue._worker import Worker, WorkerSettings, load_app

    setup_logging("INFO")  # a worker's life is its log (the other commands: WARNING)
    # As `python -m` does: the project the worker is started from is importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    ctx = click.get_current_context()
    with expected_errors():
        try:
            app = load_app(app_path)
        except InvalidArgument as exc:
            raise click.BadParameter(str(exc), ctx, param_named(ctx, "app_path")) from exc
        try:
            settings = WorkerSettings.from_env(queues=queues or None, **options)
        except InvalidSettings as exc:
            raise settings_usage_error(ctx, exc) from exc
        if settings.metrics_port and importlib.util.find_spec("prometheus_client") is None:
            fail("--metrics-port needs prometheus_client: pip install 'pgqueue-py[prometheus]'", 2)
        try:
            app.consumed(settings.queues)
        except InvalidArgument as exc:
            if not settings.queues:  # the app has no handlers at all
                raise click.BadParameter(str(exc), ctx, param_named(ctx, "app_path")) from exc
            where = "'--queue'" if queues else "PGQUEUE_QUEUES"
            raise click.UsageError(f"Invalid value for {where}: {exc}", ctx) from exc
        started = time.monotonic()
        client = Client.from_dsn(
            dsn,
            max_size=settings.pool_size,
            wait_seconds=settings.startup_timeout,
            dsn_source="--dsn",
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


def param_named(ctx: click.Context, name: str) -> click.Parameter | None:
    """The command's parameter that sets `name` (an option's or argument's Python name)."""
    return next((p for p in ctx.command.params if p.name == name), None)


def settings_usage_error(ctx: click.Context, exc: InvalidSettings) -> click.UsageError:
    """A usage error naming each wrong setting as it was given: --option, or PGQUEUE_* variable."""
    parts = []
    for name, problem in exc.problems.items():
        param = param_named(ctx, name) if problem.given_as == name else None
        where = f"'{param.opts[0]}'" if isinstance(param, click.Option) else problem.given_as
        parts.append(f"invalid value for {where}: {problem.need}, got {problem.shown}")
    message = "; ".join(parts)
    return click.UsageError(message[0].upper() + message[1:], ctx)


@main.command()
@click.option("--dsn", default=None, metavar="DSN", help="Postgres DSN [$PGQUEUE_DSN].")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the barrier's callback.",
)
@click.option("--stop", is_flag=True, help="Stop the embedded Postgres a demo left running.")
def demo(dsn: str | None, timeout: float, stop: bool) -> None:
    """Show the whole idea in under a minute, on the embedded Postgres when no DSN is set.

    Fans out 100 orders under a barrier, runs two consumers in this process;
    one order always fails and is poison-dropped after max_attempts, the
    barrier fires exactly once (succeeded=99 failed=1), and the poison table
    is printed. It uses the queues demo_orders and demo_orders_done. On the
    embedded Postgres, the server keeps running afterwards for the commands
    the demo suggests; `pgqueue demo --stop` stops it.
    """
    from pgqueue._cli.demo import run_demo
    from pgqueue._embedded import embedded_dir, start_embedded, stop_embedded

    if "PGQUEUE_LOG_LEVEL" not in os.environ:
        setup_logging("ERROR")  # the demo narrates; worker logs would drown it
    with expected_errors():
        if stop:
            if stop_embedded():
                click.echo(f"stopped the embedded Postgres (its data stays in {embedded_dir()})")
            else:
                click.echo("the embedded Postgres is not running; nothing to stop")
            return
        found = find_dsn(dsn, "--dsn")
        export, embedded = (dsn or None), False  # from the environment: already exported
        if found is None:
            click.echo("no PGQUEUE_DSN set: starting the embedded Postgres ...")
            found = Dsn(start_embedded(keep=True, say=click.echo), "the embedded Postgres")
            export, embedded = found.value, True
        resolved = found.value
        with Client.from_dsn(resolved, max_size=4, dsn_source=found.source) as client:
            client.migrate()
            ok = run_demo(
                client,
                resolved,
                echo=click.echo,
                timeout=timeout,
                export_dsn=export,
                embedded=embedded,
            )
    if not ok:
        sys.exit(1)
