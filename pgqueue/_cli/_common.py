"""What every `pgqueue` command shares: the group, errors, connection options, output."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NoReturn, Protocol, TypeVar

import click
import psycopg

from pgqueue._calls import Call, scalar
from pgqueue._client import Client
from pgqueue._embedded import embedded_dir, embedded_running, names_embedded
from pgqueue._errors import (
    BarrierNotFound,
    ConnectionLost,
    PgQueueError,
    QueueNotFound,
    WorkflowNotFound,
    sql_literal,
)
from pgqueue._log import configure_logging
from pgqueue._retry import RetryPolicy
from pgqueue._settings import DSN_ENV_VARS, find_dsn
from pgqueue.types import Undecodable

F = TypeVar("F", bound=Callable[..., Any])

DSN_HELP = "Postgres DSN [default: $PGQUEUE_DSN, then $DATABASE_URL]."

# An operator's command should answer or fail within seconds, not wait out a
# worker's retry budget.
CLI_RETRY = RetryPolicy(attempts=3, deadline_seconds=10.0)


# pgqueue's SQL names a queue, a barrier, a workflow, a step or a header key the
# way Postgres names a relation, in double quotes; the command's own lines use
# single ones.
_DOUBLE_QUOTED = re.compile(r'\b(queue|barrier|workflow|step|header) "(.*?)"(?=[ ;:,)]|$)')
# Several queues at once: queues "a", "b" (a queue name holds no quote).
_QUEUE_LIST = re.compile(r'\bqueues ((?:"[^"]*", )*"[^"]*")(?=[ ;:,)]|$)')
_NAME = re.compile(r'"([^"]*)"')


def _single_quoted(text: str) -> str:
    text = _QUEUE_LIST.sub(lambda m: "queues " + _NAME.sub(lambda n: sql_literal(n[1]), m[1]), text)
    return _DOUBLE_QUOTED.sub(lambda m: f"{m[1]} {sql_literal(m[2])}", text)


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
        fail(
            f"{_single_quoted(exc.what)}; `pgqueue queue list` shows the queues,"
            " `pgqueue queue create` makes one"
        )
    except BarrierNotFound as exc:
        fail(f"{_single_quoted(exc.what)}; `pgqueue barrier list` shows the barriers")
    except WorkflowNotFound as exc:
        # The SQL's hint names pgqueue.list_workflows(); an operator has the command.
        fail(f"{_single_quoted(exc.what)}; `pgqueue workflow list` shows the workflows")
    except ConnectionLost as exc:
        fail(_stopped_embedded() or _single_quoted(str(exc)))
    except PgQueueError as exc:
        fail(_single_quoted(str(exc)))
    except psycopg.Error as exc:
        diag = exc.diag
        text = diag.message_primary or str(exc).strip().splitlines()[0]
        state = f" (SQLSTATE {exc.sqlstate})" if exc.sqlstate else ""
        fail(f"the database refused: {text}{state}")
    except RecursionError as exc:
        # A document the reads do not decode row by row (a barrier's or a
        # step's result: complete_member takes any depth) can still be one no
        # Python can decode; the operator gets a line, not a traceback.
        fail(
            f"a document this command read is nested too deep for Python to decode ({exc});"
            " read it with psql (docs/reliability.md, 'Messages no reader can decode')"
        )
    except KeyboardInterrupt:
        fail("interrupted", 130)


def _stopped_embedded() -> str | None:
    """The line for a command whose DSN names the embedded Postgres while it is down; else None.

    The demo prints an `export PGQUEUE_DSN=...` of the embedded server's
    socket; after `pgqueue demo --stop` (or a reboot) libpq only says the
    socket file is missing, which does not say what to do.
    """
    ctx = click.get_current_context(silent=True)
    given = ctx.params.get("dsn") if ctx is not None else None
    found = find_dsn(given if isinstance(given, str) else None, "--dsn")
    if found is None or not names_embedded(found.value) or embedded_running():
        return None
    unset = [var for var in DSN_ENV_VARS if os.environ.get(var)]
    start = f"unset {' '.join(unset)} && pgqueue demo" if unset else "pgqueue demo"
    without = " (without --dsn)" if found.source == "--dsn" else ""
    return (
        f"the embedded Postgres that the DSN (from {found.source}) names is not running"
        f" (stopped by `pgqueue demo --stop` or a restart; its data is in {embedded_dir()}):"
        f" `{start}`{without} starts it again and runs the demo on it; then paste the"
        " `export PGQUEUE_DSN=...` line it prints"
    )


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
            f"{sql_literal(text)} is not a duration: use a number and a unit (s, m, h, d or w),"
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


def human_age(seconds: float | None) -> str:
    """An age as an operator reads it, rounded down: 45s, 27m, 3h12m, 2d4h; '-' for None."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        hours, minutes = divmod(s // 60, 60)
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(s // 3600, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def exact_duration(value: timedelta) -> str:
    """A duration in full, largest unit first, as parse_duration reads it: 1h30m, 10d12h."""
    rest = value.total_seconds()
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        n, rest = divmod(rest, size)
        if n:
            parts.append(f"{int(n)}{unit}")
    if rest or not parts:
        parts.append(f"{rest:g}s")
    return "".join(parts)


def ago(value: datetime | None, now: datetime) -> str:
    """A moment for a table, seen from now: '27m ago', 'in 4m', 'now' (within a second), '-'."""
    if value is None:
        return "-"
    seconds = (now - value).total_seconds()
    if abs(seconds) < 1:
        return "now"
    return f"{human_age(seconds)} ago" if seconds > 0 else f"in {human_age(-seconds)}"


# -- output -------------------------------------------------------------------


def iso(value: datetime | None) -> str | None:
    """A timestamp in ISO 8601, UTC (as the JSON output carries it)."""
    return None if value is None else value.astimezone(UTC).isoformat()


def when(value: datetime | None) -> str:
    """A timestamp for a table: UTC to the second."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _any_length_ints() -> None:
    # An operator's command prints and reads integers of any length, as
    # Postgres holds them (Python's default stops at 4,300 digits); the
    # setting is the process's, so only the operator's commands make it.
    sys.set_int_max_str_digits(0)


def _known(value: Undecodable) -> dict[str, Any]:
    """What is known of a document Python could not decode, as --json and the tables show it."""
    return {"undecodable": value.error, "chars": value.chars, "text_start": value.text[:200]}


def _shown(value: Any) -> Any:
    """How --json and the tables show a document Python could not decode (json.dumps' default)."""
    if isinstance(value, Undecodable):
        return _known(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


# The psql query that prints one column ("message", "headers") of a row raw.
RawQuery = Callable[[str], str]


def undecodable_line(value: Undecodable, where: str) -> str:
    """One line saying a stored document cannot be decoded, its size, and how to see it raw."""
    return (
        f"(cannot be decoded by Python: {value.error}; {value.chars:,} characters;"
        f" see it raw with psql: {where})"
    )


def with_raw_queries(row: dict[str, Any], raw: RawQuery) -> dict[str, Any]:
    """A --json row; a document in it Python cannot decode carries the psql query that prints it."""
    return {
        key: {**_known(value), "psql": raw(key)} if isinstance(value, Undecodable) else value
        for key, value in row.items()
    }


class StoredMessage(Protocol):
    """A row that holds a message as stored: a live one (peek) or a poison one."""

    @property
    def msg_id(self) -> int: ...
    @property
    def message(self) -> Any: ...
    @property
    def headers(self) -> Any: ...


M = TypeVar("M", bound=StoredMessage)


def undecodable_notes(rows: Iterable[M], raw: Callable[[M], RawQuery]) -> list[str]:
    """The lines under a table for the documents in it Python cannot decode (a cell is short)."""
    return [
        f"msg_id {r.msg_id}, {key}: {undecodable_line(value, raw(r)(key))}"
        for r in rows
        for key, value in (("message", r.message), ("headers", r.headers))
        if isinstance(value, Undecodable)
    ]


def compact_json(value: Any) -> str:
    """A JSON value on one line."""
    _any_length_ints()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_shown)


def clip(text: str, width: int) -> str:
    """Text cut to width characters, with an ellipsis when cut; one line."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= width else one_line[: width - 1] + "…"


def emit_json(value: Any) -> None:
    """Print a JSON document (pretty, keys in their documented order)."""
    _any_length_ints()
    click.echo(json.dumps(value, indent=2, ensure_ascii=False, default=_shown))


Fit = Literal["keep", "wrap", "clip"]


@dataclass(frozen=True)
class Column:
    """A table column: its header, and how its cells give way when the table must narrow.

    `keep` cells (ids, counts, names, ages) are never cut. `wrap` cells (a
    reason, an error) wrap onto continuation lines, and when the column would
    be narrower than WRAP_MIN_WIDTH they go under their row at the table's
    full width. `clip` cells (a preview of a payload) are cut with an
    ellipsis, and left out when narrower than CLIP_MIN_WIDTH. `limit` caps a
    free-text cell at that many characters at any width: `show` and --json
    have the whole text. Numbers align right.
    """

    header: str
    right: bool = False
    fit: Fit = "keep"
    limit: int | None = None


# Below these widths a wrapped column reads a few words a line and a preview
# shows next to nothing: the first goes under its row, the second is left out.
WRAP_MIN_WIDTH = 30
CLIP_MIN_WIDTH = 12


def output_width() -> int | None:
    """The width tables fit: $COLUMNS if set, else the terminal's; None (no limit) for a pipe."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout is not None and sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _cell(column: Column, value: Any) -> str:
    text = str(value)
    if column.fit == "keep":
        return text
    one_line = " ".join(text.split())
    return one_line if column.limit is None else clip(one_line, column.limit)


@dataclass(frozen=True)
class _Layout:
    """How a table fits: the width of each column in it, those under each row, those left out."""

    widths: dict[int, int]
    under: list[int]
    width: int
    note: str


def _fit(columns: Sequence[Column], natural: list[int], width: int) -> _Layout:
    """The layout of a table within `width` columns.

    Previews give way first, then the widest reasons and errors, a character
    at a time. Past their minimum widths, the previews are left out, then
    the reasons and errors go under their rows. Ids, counts and ages never
    give way, so a table of those alone may be wider.
    """
    least = {"wrap": WRAP_MIN_WIDTH, "clip": CLIP_MIN_WIDTH}
    widths = dict(enumerate(natural))
    under: list[int] = []
    left_out: list[str] = []
    while True:
        free = [i for i in widths if columns[i].fit != "keep"]
        floor = {
            i: min(natural[i], max(len(columns[i].header), least[columns[i].fit])) for i in free
        }
        over = sum(widths.values()) + 2 * (len(widths) - 1) - width
        slack = sum(widths[i] - floor[i] for i in free)
        if over <= slack or not free or len(widths) == 1:
            for _ in range(max(0, min(over, slack))):
                narrowed = max(
                    free, key=lambda c: (widths[c] > floor[c], columns[c].fit == "clip", widths[c])
                )
                widths[narrowed] -= 1
            break
        clipped = [i for i in free if columns[i].fit == "clip"]
        if clipped:
            del widths[clipped[-1]]
            left_out.insert(0, columns[clipped[-1]].header)
        else:
            del widths[free[-1]]
            under.insert(0, free[-1])
    note = f"({', '.join(left_out)} left out to fit {width} columns)" if left_out else ""
    return _Layout(widths, under, width, note)


def _row_lines(columns: Sequence[Column], layout: _Layout, row: list[str]) -> list[str]:
    """One row: a line, continuation lines while a wrapped cell goes on, then the cells under it."""
    parts: dict[int, list[str]] = {}
    for i, w in layout.widths.items():
        col, text = columns[i], row[i]
        if col.fit == "wrap" and len(text) > w:
            parts[i] = textwrap.wrap(text, w, break_on_hyphens=False)
        elif col.fit == "clip":
            parts[i] = [clip(text, w)]
        else:
            parts[i] = [text]
    lines = []
    for k in range(max(len(p) for p in parts.values())):
        out = []
        for i, w in layout.widths.items():
            value = parts[i][k] if k < len(parts[i]) else ""
            out.append(value.rjust(w) if columns[i].right else value.ljust(w))
        lines.append("  ".join(out).rstrip())
    for i in layout.under:
        label = f"  {columns[i].header}: "
        wrapped = textwrap.wrap(
            row[i], max(layout.width - len(label), CLIP_MIN_WIDTH), break_on_hyphens=False
        )
        lines += [(label if k == 0 else " " * len(label)) + t for k, t in enumerate(wrapped)]
    return lines


def render_table(
    columns: Sequence[Column], rows: Sequence[Sequence[Any]], width: int | None = None
) -> str:
    """An aligned text table with a header line, fitted to `width` (default: output_width()).

    Within the width unless its ids, counts and ages alone are wider; with no
    width (a pipe), one line per row.
    """
    cells = [[_cell(col, v) for col, v in zip(columns, row, strict=True)] for row in rows]
    natural = [max([len(col.header), *(len(r[i]) for r in cells)]) for i, col in enumerate(columns)]
    fit_to = output_width() if width is None else width
    if fit_to is None:
        layout = _Layout(dict(enumerate(natural)), [], 0, "")
    else:
        layout = _fit(columns, natural, fit_to)
    header = [c.header if i in layout.widths else "" for i, c in enumerate(columns)]
    lines = _row_lines(columns, replace(layout, under=[]), header)
    for r in cells:
        lines += _row_lines(columns, layout, r)
    return "\n".join([*lines, layout.note] if layout.note else lines)


def echo_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[Any]],
    empty: str,
    footer: str = "",
    notes: Sequence[str] = (),
) -> None:
    """Print a table, or the `empty` line when there are no rows; then its footer and notes."""
    if not rows:
        click.echo(empty)
        return
    click.echo(render_table(columns, rows))
    for line in [footer, *notes] if footer else notes:
        click.echo(line)


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
