"""The differential harness for PGMQ's Python clients: one scenario, two databases, equal results.

A scenario is a function that drives a PGMQ client and records what every call
returned (or raised) in a `Trace`. It runs once against real PGMQ and once
against pgqueue's `pgmq` facade, the two runs side by side in two threads
(`differential`); `assert_same` then compares the two traces
call by call. What legitimately differs between two runs is normalized away:
a timestamp is compared by where it falls among the run's calls, or by its
offset from the call that returned it (`When`); an age in seconds is equal
within AGE_TOLERANCE; an error is its SQLSTATE (its message is only shown).
msg_ids are compared as they are: both databases start every queue at 1.

Async clients run the same scenarios through `SyncView`, which drives each
coroutine method to completion on the view's own event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

# Two runs of one scenario read the clock at slightly different points; a
# timestamp within this many seconds of the other run's is the same instant.
TOLERANCE_SECONDS = 1.0
# An age (metrics) is measured from a message's enqueue to the call, which the two runs
# reach at their own pace.
AGE_TOLERANCE_SECONDS = 2
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The clients run `CREATE EXTENSION IF NOT EXISTS pgmq` at start-up unless told
# not to: PGMQ installed from pgmq.sql is no extension, nor is the facade.
NO_EXTENSION: dict[str, Any] = {"init_extension": False}

PGMQ_KINDS = ("psycopg", "asyncpg", "sqlalchemy", "sqlalchemy_async")
ASYNC_KINDS = frozenset({"asyncpg", "sqlalchemy_async"})


# -- normalization ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class When:
    """A timestamp, placed two ways: between which marks of its run it fell (a call's
    start, a call's end; None when outside the run so far: a future vt, a past delay),
    and its offset in seconds from the start of the call that returned it. Two are the
    same instant when they fall between the same marks (whatever the runs' pace), or
    when their offsets agree within TOLERANCE (a time computed from the call's now)."""

    mark: str | None
    offset: float

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, When):
            return NotImplemented
        if self.mark is not None and self.mark == other.mark:
            return True
        return abs(self.offset - other.offset) <= TOLERANCE_SECONDS

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        if self.mark is None:
            return f"<call{self.offset:+.2f}s>"
        return f"<after {self.mark}, call{self.offset:+.2f}s>"


@dataclasses.dataclass(frozen=True)
class Age:
    """An age in whole seconds, equal to another within AGE_TOLERANCE (runs differ in pace)."""

    seconds: int

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Age):
            return NotImplemented
        return abs(self.seconds - other.seconds) <= AGE_TOLERANCE_SECONDS

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"~{self.seconds}s"


@dataclasses.dataclass(frozen=True)
class Raised:
    """An exception a call raised: its SQLSTATE is compared, its message only shown."""

    sqlstate: str | None
    kind: str
    message: str = dataclasses.field(compare=False)

    def __repr__(self) -> str:
        return f"Raised({self.sqlstate or self.kind}: {self.message!r})"


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE behind an exception, through SQLAlchemy's and the drivers' wrappers."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        for attr in ("sqlstate", "pgcode"):
            code = getattr(e, attr, None)
            if isinstance(code, str) and code:
                return code
        todo += [getattr(e, "orig", None), e.__cause__, e.__context__]
    return None


def raised(exc: BaseException) -> Raised:
    """The comparable form of an exception a call raised."""
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    code = sqlstate_of(exc)
    return Raised(code, "" if code else type(exc).__name__, first_line)


def normalize(value: Any, when: Callable[[datetime], Any]) -> Any:
    """A value with its run-dependent parts (timestamps, ages) made comparable across runs:
    each timestamp goes through `when`."""
    if isinstance(value, datetime):
        if value == EPOCH:
            return "epoch"
        return when(value)
    if isinstance(value, BaseException):
        return raised(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"type": type(value).__name__}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name.endswith("_age_sec") and isinstance(v, int):
                out[f.name] = Age(v)
            else:
                out[f.name] = normalize(v, when)
        return out
    if isinstance(value, dict):
        return {k: normalize(v, when) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalize(v, when) for v in value]
    if hasattr(value, "_mapping"):  # a SQLAlchemy Row
        return {k: normalize(v, when) for k, v in value._mapping.items()}
    return value


# -- traces ----------------------------------------------------------------------------------


class Trace:
    """What each call of one scenario run returned, normalized, in call order."""

    def __init__(self, side: str, dsn: str) -> None:
        self.side = side
        self.dsn = dsn
        self.steps: list[tuple[str, Any]] = []
        # (name, client clock) of each call's start and end, in order
        self.marks: list[tuple[str, datetime]] = [("the start", datetime.now(UTC))]

    def _unique(self, label: str) -> str:
        labels = {name for name, _ in self.steps}
        unique, n = label, 2
        while unique in labels:
            unique, n = f"{label}#{n}", n + 1
        return unique

    def _when(self, started: datetime) -> Callable[[datetime], Any]:
        now = datetime.now(UTC)

        def when(t: datetime) -> Any:
            offset = (t - started).total_seconds()
            if self.marks[0][1] <= t <= now:
                mark = max((m for m in self.marks if m[1] <= t), key=lambda m: m[1])[0]
                return When(mark, offset)
            return When(None, offset)

        return when

    def record(self, label: str, value: Any, started: datetime | None = None) -> None:
        """Record a value under a label (made unique by a suffix when repeated)."""
        unique = self._unique(label)
        when = self._when(started or datetime.now(UTC))
        self.steps.append((unique, normalize(value, when)))
        self.marks.append((f"{unique} ended", datetime.now(UTC)))

    def call(self, label: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call fn and record what it returned or raised under label; its result, or None."""
        started = datetime.now(UTC)
        self.marks.append((f"{self._unique(label)} started", started))
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            self.record(label, exc, started)
            return None
        self.record(label, result, started)
        return result

    def __getitem__(self, label: str) -> Any:
        for name, value in self.steps:
            if name == label:
                return value
        raise KeyError(f"{self.side} trace has no step {label!r}: {[n for n, _ in self.steps]}")

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run a query on this run's database outside the client (an autocommit connection)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(query.encode(), params).fetchall()


def differences(
    real: Trace, facade: Trace, documented: dict[str, Callable[[Any], Any]] | None = None
) -> list[str]:
    """Each step where the facade's result is not real PGMQ's (or its documented transformation)."""
    documented = documented or {}
    out: list[str] = []
    real_labels = [n for n, _ in real.steps]
    facade_labels = [n for n, _ in facade.steps]
    if real_labels != facade_labels:
        out.append(
            f"the runs made different calls:\n  real:   {real_labels}\n  facade: {facade_labels}"
        )
    facade_steps = dict(facade.steps)
    for label, want in real.steps:
        if label not in facade_steps:
            continue
        got = facade_steps[label]
        if label in documented:
            expected = documented[label](want)
            if got != expected:
                out.append(
                    f"{label} (documented difference): real PGMQ {want!r}, "
                    f"facade should give {expected!r}, gave {got!r}"
                )
        elif got != want:
            out.append(f"{label}: real PGMQ {want!r}, facade {got!r}")
    missing = set(documented) - set(real_labels)
    if missing:
        out.append(f"documented differences name no step of the scenario: {sorted(missing)}")
    return out


def assert_same(
    real: Trace, facade: Trace, documented: dict[str, Callable[[Any], Any]] | None = None
) -> None:
    """Fail, listing every differing call, unless both runs returned the same things."""
    diffs = differences(real, facade, documented)
    assert not diffs, "the facade differs from real PGMQ:\n" + "\n".join(diffs)


# -- clients ---------------------------------------------------------------------------------


class SyncView:
    """An async client seen as a sync one: each coroutine method runs to completion on `loop`."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop

    @property
    def client(self) -> Any:
        """The async client behind the view."""
        return self._client

    def run(self, coro: Any) -> Any:
        """Run one coroutine on the view's loop."""
        return self._loop.run_until_complete(coro)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if inspect.iscoroutinefunction(attr):

            def call(*args: Any, **kwargs: Any) -> Any:
                return self._loop.run_until_complete(attr(*args, **kwargs))

            return call
        return attr


@contextmanager
def event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A fresh event loop, closed afterwards."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


@contextmanager
def pgmq_client(kind: str, dsn: str, **config: Any) -> Iterator[Any]:
    """A `pgmq` PGMQueue of one kind on dsn (init_extension=False unless config says),
    seen through its sync API."""
    import pgmq

    q: Any
    options = {**NO_EXTENSION, "pool_size": 4, **config}
    if options["init_extension"] is None:  # left to the client: its default, or PG_INIT_EXTENSION
        del options["init_extension"]
    if kind == "psycopg":
        q = pgmq.PGMQueue(conn_string=dsn, **options)
        try:
            yield q
        finally:
            q.close()
    elif kind == "sqlalchemy":
        q = pgmq.SQLAlchemyPGMQueue(conn_string=dsn, **options)
        try:
            yield q
        finally:
            q.dispose()
    elif kind in ASYNC_KINDS:
        cls = pgmq.AsyncPGMQueue if kind == "asyncpg" else pgmq.SQLAlchemyAsyncPGMQueue
        with event_loop() as loop:
            q = cls(conn_string=dsn, **options)
            loop.run_until_complete(q.init())
            view = SyncView(q, loop)
            try:
                yield view
            finally:
                loop.run_until_complete(q.close())
    else:
        raise ValueError(f"no PGMQ client kind {kind!r}")


class AsyncNamesView(SyncView):
    """pgmq_sqlalchemy's async API seen as its sync one: `send` runs `send_async` to completion."""

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._client, f"{name}_async", None)
        if target is None:
            return getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(target(*args, **kwargs))

        return call


SQLALCHEMY_KINDS = ("sync", "async")


@contextmanager
def pgmq_sqlalchemy_client(kind: str, dsn: str) -> Iterator[Any]:
    """A `pgmq_sqlalchemy` PGMQueue on dsn (psycopg for sync, asyncpg for async), seen as sync."""
    from pgmq_sqlalchemy import PGMQueue  # type: ignore[import-untyped]

    if kind == "sync":
        q = PGMQueue(dsn=sqlalchemy_url(dsn, "psycopg"))
        try:
            yield q
        finally:
            q.engine.dispose()
    else:
        with event_loop() as loop:
            aq = PGMQueue(dsn=sqlalchemy_url(dsn, "asyncpg"))
            try:
                yield AsyncNamesView(aq, loop)
            finally:
                loop.run_until_complete(aq.engine.dispose())


def run_pgmq_sqlalchemy(kind: str, scenario: Scenario, dsn: str, side: str) -> Trace:
    """Run a scenario with a fresh `pgmq_sqlalchemy` client of one kind on one database."""
    with pgmq_sqlalchemy_client(kind, dsn) as q:
        trace = Trace(side, dsn)
        scenario(q, trace)
    return trace


def sqlalchemy_url(dsn: str, driver: str) -> str:
    """A SQLAlchemy URL (postgresql+driver://...) for a libpq DSN."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy.engine import URL

    p = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    return URL.create(
        f"postgresql+{driver}",
        username=p.get("user") or os.environ.get("USER"),
        password=p.get("password"),
        host=p.get("host"),
        port=int(p["port"]) if "port" in p else None,
        database=p.get("dbname"),
    ).render_as_string(hide_password=False)


# -- scenario runners ------------------------------------------------------------------------

Scenario = Callable[[Any, Trace], None]


def run_pgmq(kind: str, scenario: Scenario, dsn: str, side: str) -> Trace:
    """Run a scenario with a fresh `pgmq` client of one kind on one database; its trace."""
    with pgmq_client(kind, dsn) as q:
        trace = Trace(side, dsn)
        scenario(q, trace)
    return trace


def differential(
    run: Callable[[str, Scenario, str, str], Trace],
    kind: str,
    scenario: Scenario,
    real_dsn: str,
    facade_dsn: str,
) -> tuple[Trace, Trace]:
    """The traces of one scenario with one client kind: on real PGMQ and on the facade.

    The two runs go side by side, each in a thread of its own with its own client
    (and, for an async kind, its own event loop) on its own database: nothing is
    shared but the process. Most scenarios wait (a delay to pass, a poll to give
    up, a listener to settle), so this halves a test's time and changes nothing
    the comparison sees: each trace places its timestamps among its own calls.
    """
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"pgmq-{kind}") as pool:
        real = pool.submit(run, kind, scenario, real_dsn, "real")
        facade = pool.submit(run, kind, scenario, facade_dsn, "facade")
        return real.result(), facade.result()


# -- small helpers the scenarios share -------------------------------------------------------


def later(seconds: float) -> datetime:
    """A timestamp `seconds` from now (negative: in the past), as the clients send it."""
    return datetime.now(UTC) + timedelta(seconds=seconds)


def whole_second_boundary(after: float) -> datetime:
    """A timestamp at least `after` seconds from now falling exactly on a whole second."""
    t = datetime.now(UTC) + timedelta(seconds=after)
    return t.replace(microsecond=0) + timedelta(seconds=1)


def ceil_seconds(delta: timedelta) -> int:
    """A duration rounded up to whole seconds."""
    return math.ceil(delta.total_seconds())


class Listener:
    """A LISTEN on one channel in a thread: counts notifications until stopped."""

    def __init__(self, dsn: str, channel: str) -> None:
        self.payloads: list[str] = []
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._conn.execute(f'LISTEN "{channel}"'.encode())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for n in self._conn.notifies(timeout=0.1, stop_after=1):
                self.payloads.append(n.payload)

    def settle(self, seconds: float = 0.3) -> int:
        """The number of notifications received once they stop arriving."""
        time.sleep(seconds)
        return len(self.payloads)

    def close(self) -> None:
        """Stop listening."""
        self._stop.set()
        self._thread.join(5)
        self._conn.close()
