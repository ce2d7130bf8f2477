"""What every `pgqueue` command shares: the group, errors, connection options, output."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar

import click
import psycopg

from pgqueue._calls import Call, scalar
from pgqueue._client import Client
from pgqueue._errors import BarrierNotFound, PgQueueError, QueueNotFound
from pgqueue._log import configure_logging
from pgqueue._retry import RetryPolicy

F = TypeVar("F", bound=Callable[..., Any])

DSN_HELP = "Postgres DSN [default: $PGQUEUE_DSN, then $DATABASE_URL]."

# An operator's command should answer or fail within seconds, not wait out a
# worker's retry budget.
CLI_RETRY = RetryPolicy(attempts=3, deadline_seconds=10.0)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one `pgqueue: error:` line on stderr and exit with `code`."""
    click.echo(f"pgqueue: error: {message}", err=True)
    sys.exit(code)


class PgQueueGroup(click.Group):
    """A click group whose usage errors are one line (exit 2) and aborts say nothing changed."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command line; exit 0, 1 (an error) or 2 (a usage error)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "pgqueue"
            fail(f"{exc.format_message()} (see `{where} --help`)", 2)
        except click.Abort:
            click.echo("", err=True)  # end the prompt's line
            fail("aborted; nothing was changed")
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


@contextmanager
def expected_errors() -> Iterator[None]:
    """Turn pgqueue's and the database's errors into one line on stderr and exit code 1."""
    try:
        yield
    except QueueNotFound as exc:
        fail(f"{exc.what}; `pgqueue queue list` shows the queues, `pgqueue queue create` makes one")
    except BarrierNotFound as exc:
        fail(f"{exc.what}; `pgqueue barrier list` shows the barriers")
    except PgQueueError as exc:
        fail(str(exc))
    except psycopg.Error as exc:
        diag = exc.diag
        text = diag.message_primary or str(exc).strip().splitlines()[0]
        state = f" (SQLSTATE {exc.sqlstate})" if exc.sqlstate else ""
        fail(f"the database refused: {text}{state}")
    except KeyboardInterrupt:
        fail("interrupted", 130)


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


def json_option(func: F) -> F:
    """Add --json (machine-readable output, documented in docs/cli.md) to a listing."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON (shape in docs/cli.md)."
    )(func)


def yes_option(func: F) -> F:
    """Add --yes (skip the confirmation) to a destructive command."""
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(func)


def open_client(dsn: str | None, connect_timeout: float) -> Client:
    """A small client for one command; fails within connect_timeout if the server is away."""
    return Client.from_dsn(
        dsn, min_size=0, max_size=2, connect_timeout=connect_timeout, retry=CLI_RETRY
    )


def server_now(client: Client) -> datetime:
    """The server's clock: cut-offs are computed on it, never on the operator's laptop."""
    now: datetime = client.run(Call("now", "SELECT clock_timestamp()", (), scalar))
    return now


def setup_logging(default_level: str = "INFO") -> None:
    """Configure logs from PGQUEUE_LOG_FORMAT / PGQUEUE_LOG_LEVEL."""
    log_format = os.environ.get("PGQUEUE_LOG_FORMAT", "")
    configure_logging(
        json={"json": True, "console": False}.get(log_format),
        level=os.environ.get("PGQUEUE_LOG_LEVEL", default_level),
    )


def confirm(question: str, yes: bool) -> None:
    """Ask before a destructive change; without a yes nothing happens and the exit code is 1.

    The answer is read from stdin, so with no terminal (cron, CI) and no --yes
    the question meets end-of-file and the command changes nothing.
    """
    if yes:
        return
    if not click.confirm(question, default=False, err=True):
        fail("not confirmed; nothing was changed")


# -- durations ----------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> timedelta:
    """A duration like 90s, 15m, 2h, 7d, 1w or 1h30m; ValueError saying what is accepted."""
    compact = text.strip().lower()
    parts = _DURATION_RE.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(
            f"{text!r} is not a duration: use a number and a unit (s, m, h, d or w),"
            " e.g. 90s, 15m, 2h, 7d or 1h30m"
        )
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


def _to_duration(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc


def duration_option(*names: str, help: str, required: bool = False) -> Callable[[F], F]:
    """An option holding a duration as a timedelta; a bad one is a usage error."""
    return click.option(
        *names,
        metavar="DURATION",
        default=None,
        required=required,
        callback=_to_duration,
        help=help,
    )


# -- output -------------------------------------------------------------------


def iso(value: datetime | None) -> str | None:
    """A timestamp in ISO 8601, UTC (as the JSON output carries it)."""
    return None if value is None else value.astimezone(UTC).isoformat()


def when(value: datetime | None) -> str:
    """A timestamp for a table: UTC to the second."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def compact_json(value: Any) -> str:
    """A JSON value on one line."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def clip(text: str, width: int) -> str:
    """Text cut to width characters, with an ellipsis when cut; one line."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= width else one_line[: width - 1] + "…"


def emit_json(value: Any) -> None:
    """Print a JSON document (pretty, keys in their documented order)."""
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


@dataclass(frozen=True)
class Column:
    """A table column: its header and whether numbers align right."""

    header: str
    right: bool = False


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned text table with a header line."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(col.header), *(len(r[i]) for r in cells)]) for i, col in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        out = [
            v.rjust(w) if col.right else v.ljust(w)
            for v, w, col in zip(values, widths, columns, strict=True)
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line([c.header for c in columns]), *(line(r) for r in cells)])


def echo_table(
    columns: Sequence[Column], rows: Sequence[Sequence[Any]], empty: str, footer: str = ""
) -> None:
    """Print a table, or the `empty` line when there are no rows."""
    if not rows:
        click.echo(empty)
        return
    click.echo(render_table(columns, rows))
    if footer:
        click.echo(footer)


class Progress:
    """A progress bar on a terminal (stderr), silence elsewhere."""

    def __init__(self, total: int, label: str) -> None:
        """Show progress over total items when stderr is a terminal."""
        self._bar: Any = None
        if sys.stderr.isatty() and total > 0:
            self._bar = click.progressbar(length=total, label=label, file=sys.stderr)
            self._bar.__enter__()

    def update(self, n: int) -> None:
        """Advance by n items."""
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        """Finish the bar."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def plural(n: int, word: str) -> str:
    """'1 message', '2 messages'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def shape(obj: Any, fields: Mapping[str, str]) -> dict[str, Any]:
    """A record as the documented JSON object: {json key: attribute}, timestamps as ISO UTC."""
    out: dict[str, Any] = {}
    for key, attr in fields.items():
        value = getattr(obj, attr)
        out[key] = iso(value) if isinstance(value, datetime) else value
    return out
