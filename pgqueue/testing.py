"""Testing mode for your own tests: a migrated throwaway database per test, drain(), assertions.

A pytest plugin: enable it with `pytest_plugins = ["pgqueue.testing"]` in your
root conftest.py, or `pytest -p pgqueue.testing`. Importing it connects to
nothing; the first test that asks for `pgqueue_dsn` or `pgqueue_client`
migrates one template database per test process, and every such test gets a
database cloned from it (`CREATE DATABASE ... TEMPLATE`), dropped after the
test. The server comes from `--pgqueue-dsn`, else `$PGQUEUE_TEST_DSN`; with
neither, those tests are skipped and say why. Safe under pytest-xdist: each
process has its own template and every database has a random name.

`drain()` runs an App's handlers in this process, one message (or one batch)
at a time, acking as the worker does, until nothing is visible; the first
handler error is re-raised. `assert_enqueued()` / `assert_not_enqueued()` /
`enqueued()` look at what is live in a queue (peek: nothing is leased).
docs/integrations/testing.md shows them in use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgqueue._calls import encode_json
from pgqueue._client import Client
from pgqueue._errors import PgQueueError, Poison, Retry
from pgqueue._migrate import migrate
from pgqueue._worker.acker import is_member
from pgqueue._worker.app import App, Handler
from pgqueue._worker.db import WorkerDb
from pgqueue._worker.dispatch import _batch_results
from pgqueue.types import Message, PeekedMessage

__all__ = [
    "DrainLimitReached",
    "Drained",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "enqueued",
    "pgqueue_client",
    "pgqueue_dsn",
    "pgqueue_server_dsn",
    "pgqueue_template",
]

DSN_ENV = "PGQUEUE_TEST_DSN"
DSN_OPTION = "--pgqueue-dsn"
# Every database this plugin creates starts so: one left behind by a killed
# run is easy to find (`SELECT datname FROM pg_database WHERE datname LIKE 'pgqueue_t%'`).
TEMPLATE_PREFIX = "pgqueue_tpl_"
DATABASE_PREFIX = "pgqueue_test_"


# -- the plugin: a throwaway migrated database per test ---------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    """--pgqueue-dsn: the server the tests' throwaway databases are created on."""
    parser.getgroup("pgqueue").addoption(
        DSN_OPTION,
        dest="pgqueue_dsn",
        default=None,
        help=(
            "a Postgres server (any database on it; the role needs CREATEDB) for pgqueue's"
            f" per-test databases; default: ${DSN_ENV}"
        ),
    )


def _with_dbname(dsn: str, dbname: str) -> str:
    params: dict[str, Any] = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def _admin(server_dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(server_dsn, autocommit=True, connect_timeout=10)


def _create_database(server_dsn: str, prefix: str, template: str | None = None) -> str:
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    clause = f" TEMPLATE {template}" if template else ""
    try:
        with _admin(server_dsn) as conn:
            conn.execute(f"CREATE DATABASE {name}{clause}")
    except psycopg.errors.InsufficientPrivilege as exc:
        raise PgQueueError(
            f"pgqueue.testing could not create a test database: {exc}".strip()
            + "; the login role of the test server needs CREATEDB (ALTER ROLE ... CREATEDB)"
        ) from exc
    return name


def _drop_database(server_dsn: str, name: str) -> None:
    # FORCE: a connection the test leaked (a client it never closed) must not keep it alive.
    with _admin(server_dsn) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def pgqueue_server_dsn(pytestconfig: pytest.Config) -> str:
    """The server's DSN: --pgqueue-dsn, else $PGQUEUE_TEST_DSN; skips the test when neither is set.

    The flag wins over the variable, as a worker's flags do over its
    environment. A server that does not answer fails the test (it was asked for).
    """
    dsn = pytestconfig.getoption("pgqueue_dsn", default=None) or os.environ.get(DSN_ENV)
    if not dsn:
        pytest.skip(
            f"pgqueue.testing needs a Postgres server: set {DSN_ENV} or pass {DSN_OPTION}=DSN"
        )
    try:
        with _admin(dsn):
            pass
    except psycopg.OperationalError as exc:
        source = DSN_OPTION if pytestconfig.getoption("pgqueue_dsn", default=None) else DSN_ENV
        pytest.fail(f"pgqueue.testing: the server of {source} did not answer: {exc}", pytrace=False)
    return str(dsn)


@pytest.fixture(scope="session")
def pgqueue_template(pgqueue_server_dsn: str) -> Iterator[str]:
    """A database migrated once per test process; every test's database is a copy of it."""
    name = _create_database(pgqueue_server_dsn, TEMPLATE_PREFIX)
    try:  # dropped even when migrating it fails
        with psycopg.connect(_with_dbname(pgqueue_server_dsn, name), autocommit=True) as conn:
            migrate(conn)
        yield name
    finally:
        _drop_database(pgqueue_server_dsn, name)


@pytest.fixture
def pgqueue_dsn(pgqueue_server_dsn: str, pgqueue_template: str) -> Iterator[str]:
    """A DSN to a fresh, migrated database of this test's own, dropped after it."""
    name = _create_database(pgqueue_server_dsn, DATABASE_PREFIX, template=pgqueue_template)
    try:
        yield _with_dbname(pgqueue_server_dsn, name)
    finally:
        _drop_database(pgqueue_server_dsn, name)


@pytest.fixture
def pgqueue_client(pgqueue_dsn: str) -> Iterator[Client]:
    """A Client on this test's database, closed after the test."""
    with Client.from_dsn(pgqueue_dsn, max_size=4) as client:
        yield client


# -- drain: run an App's handlers in this process ---------------------------


class DrainLimitReached(PgQueueError):
    """drain() stopped with messages still to run: max_messages ran, or the timeout passed.

    Usually a handler that sends to its own queue every time it runs; raise
    max_messages if the test really does run that many.
    """


@dataclass(frozen=True, slots=True)
class Drained:
    """What a drain ran, each message once per run, in the order the runs ended, by outcome."""

    acked: tuple[Message, ...] = ()  # the handler returned; the message was acked
    retried: tuple[Message, ...] = ()  # the handler raised Retry; the message is live again
    poisoned: tuple[Message, ...] = ()  # Poison, or a failure on its last attempt
    failed: tuple[Message, ...] = ()  # another exception (raise_errors=False), live again

    def counts(self) -> dict[str, int]:
        """How many runs ended each way."""
        return {
            "acked": len(self.acked),
            "retried": len(self.retried),
            "poisoned": len(self.poisoned),
            "failed": len(self.failed),
        }

    def __len__(self) -> int:
        """How many handler runs there were (a batch run counts each of its messages)."""
        return len(self.acked) + len(self.retried) + len(self.poisoned) + len(self.failed)


def drain(
    client: Client,
    app: App,
    queue: str | Sequence[str] | None = None,
    *,
    max_messages: int = 1000,
    timeout: float = 30.0,
    batch_size: int = 100,
    raise_errors: bool = True,
) -> Drained:
    """Run `app`'s handlers on `queue` (default: every queue the app handles) until none is visible.

    In this thread, one message at a time (one read of up to `batch_size`
    for a batch handler), a round over the queues at a time, so a fan-out's
    callback runs once its members have when its queue is drained too. Acks
    are the worker's: delete, complete_members for barrier members (with the
    handler's result), and a transactional handler's ack commits with its
    writes. What differs from the worker, for determinism: no backoff (a
    failed attempt is visible again at once; `Retry(delay=...)` keeps its
    delay), and a member's result that is not JSON raises instead of being
    stored as null.

    Errors: a handler's exception nacks its message(s) (on the last attempt
    they go to the poison table, as with the worker) and is re-raised, with a
    note saying which message; `raise_errors=False` records it in `failed`
    and goes on. `Poison` and `Retry` are the handler's decisions, not errors:
    they poison or nack the message as the worker would, are recorded, and
    never raised. Delayed messages are not waited for. DrainLimitReached
    when more than `max_messages` would run or `timeout` seconds passed
    (checked between runs: a handler that hangs is not interrupted).
    """
    queues = app.consumed((queue,) if isinstance(queue, str) else tuple(queue or ()))
    return _Drain(client, app, raise_errors).run(queues, max_messages, timeout, batch_size)


class _Drain:
    """One drain: reads, runs and acks, and what each run came to."""

    # A lease longer than any handler in a test should take: nobody else reads meanwhile.
    VT = 300

    def __init__(self, client: Client, app: App, raise_errors: bool) -> None:
        self.db = WorkerDb(client)
        self.client = client
        self.app = app
        self.raise_errors = raise_errors
        self.outcomes: dict[str, list[Message]] = {
            "acked": [],
            "retried": [],
            "poisoned": [],
            "failed": [],
        }
        self._runner: asyncio.Runner | None = None

    def run(
        self, queues: tuple[str, ...], max_messages: int, timeout: float, batch_size: int
    ) -> Drained:
        deadline = time.monotonic() + timeout
        ran = 0
        try:
            progressed = True
            while progressed:
                progressed = False
                for queue in queues:
                    handler = self.app.handlers[queue]
                    qty = max(1, min(batch_size, max_messages - ran)) if handler.batch else 1
                    msgs = self.client.read(queue, vt=self.VT, qty=qty)
                    if not msgs:
                        continue
                    if ran >= max_messages or time.monotonic() > deadline:
                        self.db.release_many(queue, msgs)
                        why = (
                            f"{max_messages} messages ran (max_messages)"
                            if ran >= max_messages
                            else f"{timeout} s passed (timeout)"
                        )
                        raise DrainLimitReached(
                            f"drain stopped with messages left in {queue!r}: {why}; a handler"
                            " that sends to its own queue each time never drains"
                        )
                    self._run(handler, msgs)
                    ran += len(msgs)
                    progressed = True
        finally:
            if self._runner is not None:
                self._runner.close()
        return Drained(
            *(tuple(self.outcomes[k]) for k in ("acked", "retried", "poisoned", "failed"))
        )

    def _run(self, handler: Handler, msgs: list[Message]) -> None:
        arg: Message | list[Message] = msgs if handler.batch else msgs[0]
        failure: Exception | None = None
        if handler.transactional:
            try:
                with self.db.transaction() as conn:
                    try:
                        results = self._results(handler, msgs, handler.func(arg, conn))
                    except Exception as exc:
                        failure = exc
                        raise  # rolls the handler's writes back
                    if not self.db.hold(handler.queue, msgs, conn):
                        raise PgQueueError(
                            f"another consumer took over a message of {handler.queue!r} while"
                            " drain() ran it (is a worker running on this database too?)"
                        )
                    self._ack(handler.queue, msgs, results, conn)
            except Exception as exc:
                if exc is not failure:
                    raise  # the database's, not the handler's
        else:
            try:
                results = self._results(handler, msgs, self._call(handler, arg))
            except Exception as exc:
                failure = exc
            else:
                self._ack(handler.queue, msgs, results, None)
        if failure is None:
            self.outcomes["acked"].extend(msgs)
        else:
            self._failed(handler, msgs, failure)

    def _results(self, handler: Handler, msgs: list[Message], result: Any) -> list[Any]:
        return _batch_results(handler, msgs, result) if handler.batch else [result]

    def _call(self, handler: Handler, arg: Message | list[Message]) -> Any:
        if not handler.is_async:
            return handler.func(arg)
        return self._await(handler.func(arg))

    def _await(self, coro: Coroutine[Any, Any, Any]) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._runner is None:
                self._runner = asyncio.Runner()
            return self._runner.run(coro)
        # An async test called drain(): a loop cannot run inside the running
        # one, so the handler runs on a loop of its own in a helper thread.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coro).result()

    def _ack(self, queue: str, msgs: list[Message], results: list[Any], conn: Any) -> None:
        kinds: dict[bool, list[tuple[Message, Any]]] = {}
        for msg, result in zip(msgs, results, strict=True):
            kinds.setdefault(is_member(msg), []).append((msg, result))
        for member, group in kinds.items():
            if member:
                for _, result in group:
                    encode_json(result, "a barrier member's result")  # InvalidMessage, saying why
            self.db.ack(
                queue,
                member,
                [m.msg_id for m, _ in group],
                [m.enqueued_at for m, _ in group],
                [r for _, r in group] if member else [],
                conn,
            )

    def _failed(self, handler: Handler, msgs: list[Message], exc: Exception) -> None:
        if isinstance(exc, Poison):
            reason = str(exc) or "poisoned by its handler"
            for msg in msgs:
                self.db.poison(msg, reason)
                self.outcomes["poisoned"].append(msg)
            return
        delay = (exc.delay or 0) if isinstance(exc, Retry) else 0
        error = f"{type(exc).__name__}: {exc}"
        for msg in msgs:
            outcome = self.db.nack(msg, delay, error)
            kind = "retried" if isinstance(exc, Retry) else "failed"
            self.outcomes["poisoned" if outcome == "poisoned" else kind].append(msg)
        if isinstance(exc, Retry) or not self.raise_errors:
            return
        first = msgs[0]
        exc.add_note(
            f"pgqueue.testing.drain: raised by the handler of {handler.queue!r} for"
            f" msg_id {first.msg_id} (read_ct {first.read_ct}"
            + (f", and {len(msgs) - 1} more of its batch" if len(msgs) > 1 else "")
            + f"): {first.message!r}; {len(self.outcomes['acked'])} message(s) acked before it"
        )
        raise exc


# -- assertions on what is enqueued -----------------------------------------


def enqueued(client: Client, queue: str) -> list[PeekedMessage]:
    """Every live message of the queue (visible, delayed or leased), by msg_id; leases none."""
    found: list[PeekedMessage] = []
    page_size = 1000
    while True:
        after = found[-1].msg_id if found else 0
        page = client.peek(queue, qty=page_size, after_msg_id=after)
        found.extend(page)
        if len(page) < page_size:
            return found


def _matches(pattern: Any, value: Any) -> bool:
    """A dict matches any dict holding its keys with matching values; others must be equal.

    JSON's types stay apart: True is not 1, and 1 is not "1".
    """
    if isinstance(pattern, dict):
        return isinstance(value, dict) and all(
            k in value and _matches(v, value[k]) for k, v in pattern.items()
        )
    if isinstance(pattern, (list, tuple)):
        return (
            isinstance(value, list)
            and len(value) == len(pattern)
            and all(_matches(p, v) for p, v in zip(pattern, value, strict=True))
        )
    return isinstance(pattern, bool) == isinstance(value, bool) and bool(pattern == value)


def _matching(
    live: list[PeekedMessage], message: Any, headers: dict[str, Any] | None
) -> list[PeekedMessage]:
    return [
        m
        for m in live
        if (message is None or _matches(message, m.message))
        and (headers is None or _matches(headers, m.headers or {}))
    ]


def _listing(live: list[PeekedMessage], limit: int = 20) -> str:
    if not live:
        return "  (nothing)"
    lines = [
        f"  msg_id={m.msg_id} read_ct={m.read_ct} {m.message!r}"
        + (f" headers={m.headers!r}" if m.headers else "")
        for m in live[:limit]
    ]
    if len(live) > limit:
        lines.append(f"  ... and {len(live) - limit} more")
    return "\n".join(lines)


def _wanted(queue: str, message: Any, headers: dict[str, Any] | None) -> str:
    what = f"in {queue!r}"
    if message is not None:
        what += f" matching {message!r}"
    if headers is not None:
        what += f" with headers matching {headers!r}"
    return what


def assert_enqueued(
    client: Client,
    queue: str,
    message: Any = None,
    *,
    count: int | None = None,
    headers: dict[str, Any] | None = None,
) -> list[PeekedMessage]:
    """Assert a live message matches (exactly `count` of them, if given); the matching ones.

    `message` and `headers` match as subsets: a dict matches any payload
    holding its keys with matching values (nested dicts too); anything else
    must be equal. None matches everything. The failure lists what is there.
    """
    __tracebackhide__ = True
    live = enqueued(client, queue)
    found = _matching(live, message, headers)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    expected = "at least 1 message" if count is None else f"{count} message(s)"
    raise AssertionError(
        f"expected {expected} {_wanted(queue, message, headers)}, found {len(found)};"
        f" {len(live)} enqueued:\n{_listing(live)}"
    )


def assert_not_enqueued(
    client: Client,
    queue: str,
    message: Any = None,
    *,
    headers: dict[str, Any] | None = None,
) -> None:
    """Assert no live message matches (with neither `message` nor `headers`: the queue is empty)."""
    __tracebackhide__ = True
    live = enqueued(client, queue)
    found = _matching(live, message, headers)
    if found:
        raise AssertionError(
            f"expected no message {_wanted(queue, message, headers)}, found {len(found)}:\n"
            f"{_listing(found)}\n{len(live)} enqueued in all"
        )
