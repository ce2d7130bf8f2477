"""`pgqueue exporter`: queue-level gauges for Prometheus, computed at scrape time."""

from __future__ import annotations

import importlib.util
import signal
import threading
from types import FrameType

import click

from pgqueue._cli._connect import connection_options, open_client
from pgqueue._cli._exits import expected_errors, fail
from pgqueue._cli._main import main
from pgqueue._listen import DEFAULT_HOST, address
from pgqueue._retry import RetryPolicy

# A scrape must answer within Prometheus's scrape timeout (10 s by default),
# saying the database is away (pgqueue_exporter_scrape_success 0), rather than
# wait out a failover in the retry policy and be cut off, no answer at all.
SCRAPE_RETRY = RetryPolicy(attempts=2, deadline_seconds=2.0, max_wait_seconds=0.2)


@main.command()
@click.option(
    "--port", type=click.IntRange(1, 65535), required=True, help="Serve /metrics on this port."
)
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    metavar="ADDR",
    help="Address to listen on; 0.0.0.0 for a scraper on another host or in a container.",
)
# --addr was this option's name before --host; kept so that scripts keep working.
@click.option("--addr", default=None, hidden=True)
@connection_options
def exporter(
    port: int, host: str, addr: str | None, dsn: str | None, connect_timeout: float
) -> None:
    """Serve every queue's state as Prometheus gauges on /metrics until SIGTERM or SIGINT.

    Each scrape runs one query, pgqueue.exporter_metrics(), however many
    queues there are; run it with a role in pgqueue_operator. Binds to
    127.0.0.1 unless told otherwise. The metrics and alert rules are in
    docs/observability.md. Needs pgqueue-py[prometheus].
    """
    host = addr or host
    if importlib.util.find_spec("prometheus_client") is None:
        fail("the exporter needs prometheus_client: pip install 'pgqueue-py[prometheus]'", 2)
    from pgqueue._metrics import exporter_registry, serve_registry

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    with expected_errors(), open_client(dsn, connect_timeout) as client:
        client.retry = SCRAPE_RETRY
        server = serve_registry(exporter_registry(client.run), port, host)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        click.echo(f"serving /metrics on {address(host, port)}", err=True)
        while not stop.wait(1.0):
            pass
        server.shutdown()
        server.server_close()
