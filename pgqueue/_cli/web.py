"""`pgqueue web`: the dashboard, served by uvicorn (docs/dashboard.md)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys

import click

from pgqueue._cli._connect import connection_options, open_client
from pgqueue._cli._exits import expected_errors, fail
from pgqueue._cli._logging import setup_logging
from pgqueue._cli._main import main
from pgqueue._listen import DEFAULT_HOST, address, bind

# The names a loopback-bound dashboard answers to; any other Host header is
# refused, so a web page whose name was rebound to 127.0.0.1 cannot read it.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


@main.command()
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    metavar="ADDR",
    help="Address to listen on; any other than loopback needs a login.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--read-only", is_flag=True, help="Show everything, offer no action.")
@click.option(
    "--allow-owner",
    is_flag=True,
    help="Run as a superuser or the schema's owner on a non-loopback address.",
)
@connection_options
def web(
    host: str,
    port: int,
    read_only: bool,
    allow_owner: bool,
    dsn: str | None,
    connect_timeout: float,
) -> None:
    """Serve the dashboard: queues, poison, barriers, workflows and workers, until Ctrl-C.

    Binds to 127.0.0.1 unless told otherwise; another address needs a login
    (PGQUEUE_WEB_TOKEN or PGQUEUE_WEB_BASIC_AUTH). Needs pgqueue-py[web].
    """
    setup_logging()
    missing = [m for m in ("starlette", "jinja2", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"the dashboard needs {', '.join(missing)}: pip install 'pgqueue-py[web]'", 2)
    import uvicorn

    from pgqueue._web.app import check_grants, create_app, web_dsn
    from pgqueue._web.queries import GRANTS
    from pgqueue._web.security import Credentials, is_loopback

    with expected_errors():
        creds = Credentials.from_env()
        if not is_loopback(host) and not creds.configured:
            fail(
                f"refusing to serve on {host} without a login: set PGQUEUE_WEB_TOKEN or"
                " PGQUEUE_WEB_BASIC_AUTH (docs/dashboard.md), or bind to 127.0.0.1",
                2,
            )
        with open_client(web_dsn(dsn, read_only), connect_timeout) as client:
            grants = client.run(GRANTS)
        owner_ok = allow_owner or is_loopback(host)
        check_grants(grants, owner_ok)
        if grants.superuser or grants.owner:
            click.echo(
                f"warning: role {grants.role!r} can do more than the dashboard needs; in"
                " production run it as a role holding only pgqueue_operator",
                err=True,
            )
        hosts = [host, *LOOPBACK_NAMES] if is_loopback(host) else None
        app = create_app(dsn, read_only=read_only, allow_owner=owner_ok, allowed_hosts=hosts)
        # Bound before the URL is printed: a port that is taken is one line and
        # exit 1, not a URL that answers nothing and then uvicorn's traceback.
        sock = bind(host, port)
    port = sock.getsockname()[1]  # --port 0: the one the system chose
    click.echo(
        f"pgqueue web on http://{address(host, port)}/{' (read-only)' if read_only else ''}",
        err=True,
    )
    # proxy_headers off: X-Forwarded-For from a local process must not name the
    # address the action log records
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", server_header=False, proxy_headers=False
    )
    server = uvicorn.Server(config)
    # uvicorn raises the Ctrl-C again once it has shut down
    with sock, contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    if not server.started:
        sys.exit(3)  # uvicorn logged why (as uvicorn.run exits)
