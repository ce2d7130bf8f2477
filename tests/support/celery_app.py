"""A Celery app whose broker is `kombu-pgmq`, for tests/pgmq/test_celery.py.

The worker process imports it (`celery -A support.celery_app worker`) and
takes its database from $PGQUEUE_CELERY_DSN; the test process builds its own
app on the same database with `make_app(dsn)`. Results go to Celery's
database backend (SQLAlchemy on the same Postgres), and every run of a task
leaves a row in `celery_runs`, so a test can count runs per message.

The broker is configured the way kombu-pgmq documents it and nothing more:
its `TransportPGMQ` (the PyPI `pgmq` client), a `postgresql://` URL to the
database, and `check_extension: False` (kombu-pgmq's own switch, since
neither real PGMQ installed from pgmq.sql nor pgqueue's facade is a row of
pg_extension).
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from celery import Celery
from psycopg.conninfo import conninfo_to_dict

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS celery_runs (
    run_id bigserial PRIMARY KEY,
    task text NOT NULL,
    task_id text NOT NULL,
    n integer NOT NULL,
    pid integer NOT NULL,
    ran_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def broker_url(dsn: str, scheme: str = "postgresql") -> str:
    """A libpq DSN (URL or key=value) as the URL Celery wants: scheme://user:password@host:port/db."""
    params = conninfo_to_dict(dsn)
    user = params.get("user") or "postgres"
    password = params.get("password") or ""
    auth = f"{user}:{password}" if password else user
    host = params.get("host") or "127.0.0.1"
    port = params.get("port") or "5432"
    return f"{scheme}://{auth}@{host}:{port}/{params['dbname']}"


def prepare(dsn: str) -> None:
    """Create the table the tasks record their runs in."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RUNS_TABLE)


def make_app(dsn: str, visibility_timeout: int = 30) -> Celery:
    """A Celery app brokered by kombu-pgmq on `dsn`, with results in the same database."""
    app = Celery("pgqueue_celery_test")
    app.conf.update(
        broker_url=broker_url(dsn),
        broker_transport="kombu_pgmq.transport:TransportPGMQ",
        broker_transport_options={
            "visibility_timeout": visibility_timeout,
            "check_extension": False,
        },
        broker_connection_retry_on_startup=True,
        result_backend=broker_url(dsn, "db+postgresql+psycopg"),
        result_extended=True,
        worker_prefetch_multiplier=1,
        # a pool process that died is a lost task after 1 s, not billiard's 10
        worker_lost_wait=1.0,
        task_default_queue="celery",
        worker_hijack_root_logger=False,
    )

    def record_run(task: str, task_id: str, n: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO celery_runs (task, task_id, n, pid) VALUES (%s, %s, %s, %s)",
                (task, task_id, n, os.getpid()),
            )

    @app.task(name="pgq.square", bind=True, shared=False)
    def square(self: Any, n: int) -> int:
        """Record the run; n squared is the result."""
        record_run("square", self.request.id, n)
        return n * n

    @app.task(name="pgq.crash", bind=True, shared=False, acks_late=True, reject_on_worker_lost=True)
    def crash(self: Any, n: int) -> None:
        """Record the run, then kill the process running it mid-task (the message stays leased)."""
        record_run("crash", self.request.id, n)
        os._exit(1)

    return app


_dsn = os.environ.get("PGQUEUE_CELERY_DSN")
#: The worker's app (`celery -A support.celery_app worker`), from $PGQUEUE_CELERY_DSN.
app = (
    make_app(_dsn, int(os.environ.get("PGQUEUE_CELERY_VT", "30")))
    if _dsn
    else Celery("pgqueue_celery_test")
)
