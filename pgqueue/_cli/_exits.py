"""How a command ends early: one `pgqueue: error:` line on stderr and a documented exit code."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import click
import psycopg

from pgqueue._embedded import embedded_dir, embedded_running, names_embedded
from pgqueue._errors import (
    BarrierNotFound,
    ConnectionLost,
    PgQueueError,
    QueueNotFound,
    WorkflowNotFound,
    sql_literal,
)
from pgqueue._settings import DSN_ENV_VARS, find_dsn

F = TypeVar("F", bound=Callable[..., Any])


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


def yes_option(func: F) -> F:
    """Add --yes (skip the confirmation) to a destructive command."""
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(func)


def confirm(question: str, yes: bool) -> None:
    """Ask before a destructive change; without a yes nothing happens and the exit code is 1.

    The answer is read from stdin, so with no terminal (cron, CI) and no --yes
    the question meets end-of-file and the command changes nothing.
    """
    if yes:
        return
    if not click.confirm(question, default=False, err=True):
        fail("not confirmed; nothing was changed")
