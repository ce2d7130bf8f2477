"""Installing the pgmq facade: `pgqueue._pgmq.install`/`uninstall`/`status` and `pgqueue pgmq`.

One transaction under the migrators' lock; refused (nothing changed) before
`pgqueue migrate` and beside a real PGMQ; a reinstall is an upgrade that keeps
the queues, their messages and the topic bindings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue._errors import MigrationError, NotMigrated
from pgqueue._migrate import MIGRATION_LOCK_KEY, migrate
from pgqueue._pgmq import (
    COMMENT_PREFIX,
    FACADE_VERSION,
    PgmqConflict,
    facade_digest,
    facade_dir,
    facade_files,
    install,
    status,
    uninstall,
)


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def _schema_comment(conn: psycopg.Connection[Any]) -> str | None:
    row = conn.execute(
        "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = 'pgmq'"
    ).fetchone()
    return None if row is None else row[0]


def _cli(*args: str, dsn: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_LOG")}
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", "pgmq", *args, "--dsn", dsn],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_facade_sql_is_found_where_the_migrations_are() -> None:
    files = facade_files()
    assert files and all(f.parent == facade_dir() and f.suffix == ".sql" for f in files)
    assert [f.name for f in files] == sorted(f.name for f in files)


def test_install_marks_the_schema_as_pgqueues_and_reports_the_pgmq_version(dsn: str) -> None:
    with _connect(dsn) as conn:
        before = status(conn)
        assert (before.installed, before.real_pgmq, before.version) == (False, None, None)
        assert install(conn) == FACADE_VERSION == "1.13.0"
        digest = facade_digest(facade_files())
        assert _schema_comment(conn) == f"{COMMENT_PREFIX} {FACADE_VERSION} {digest}"
        after = status(conn)
        assert (after.installed, after.version, after.as_extension, after.real_pgmq) == (
            True,
            "1.13.0",
            False,
            None,
        )
        conn.execute("SELECT pgmq.create('jobs')")
        (msg_id,) = conn.execute("SELECT * FROM pgmq.send('jobs', '{\"a\": 1}')").fetchone() or ()
        assert conn.execute("SELECT msg_id FROM pgmq.read('jobs', 30, 1)").fetchall() == [(msg_id,)]


def test_install_works_on_an_autocommit_connection_and_inside_the_callers_transaction(
    dsn: str,
) -> None:
    with psycopg.connect(dsn) as conn:  # not autocommit
        conn.execute("SELECT 1")  # the caller's transaction is open
        install(conn)
        conn.rollback()  # install ran inside it: rolled back with it
        assert status(conn).installed is False
        conn.rollback()
        install(conn)  # no transaction open: install commits its own
        with psycopg.connect(dsn) as other:
            assert status(other).installed is True


def test_install_before_migrate_says_to_migrate_and_changes_nothing(empty_dsn: str) -> None:
    with _connect(empty_dsn) as conn:
        with pytest.raises(NotMigrated, match=r"run `pgqueue migrate` first"):
            install(conn)
        assert conn.execute("SELECT to_regnamespace('pgmq')").fetchone() == (None,)


def test_install_on_an_outdated_schema_names_both_migrations(dsn: str) -> None:
    with _connect(dsn) as conn:
        latest = conn.execute("SELECT max(version) FROM pgqueue.schema_version").fetchone()
        assert latest is not None
        conn.execute("DELETE FROM pgqueue.schema_version WHERE version = %s", (latest[0],))
        with pytest.raises(NotMigrated) as err:
            install(conn)
        assert f"{latest[0] - 1:04d}" in str(err.value) and f"{latest[0]:04d}" in str(err.value)
        assert "run `pgqueue migrate` first" in str(err.value)
        assert conn.execute("SELECT to_regnamespace('pgmq')").fetchone() == (None,)


def test_reinstall_upgrades_in_place_keeping_queues_messages_and_topic_bindings(
    dsn: str,
) -> None:
    with _connect(dsn) as conn:
        install(conn)
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("SELECT pgmq.send('jobs', '{\"n\": 1}')")
        conn.execute("SELECT pgmq.bind_topic('orders.*', 'jobs')")
        conn.execute("SELECT pgmq.enable_notify_insert('jobs', 100)")
        bound = conn.execute(
            "SELECT pattern, queue_name, bound_at FROM pgmq.topic_bindings"
        ).fetchall()
        install(conn)
        install(conn)  # idempotent
        assert (
            conn.execute("SELECT pattern, queue_name, bound_at FROM pgmq.topic_bindings").fetchall()
            == bound
        )
        assert conn.execute("SELECT message FROM pgmq.q_jobs").fetchall() == [({"n": 1},)]
        assert [r[0] for r in conn.execute("SELECT queue_name FROM pgmq.list_queues()")] == ["jobs"]
        assert conn.execute(
            "SELECT queue_name, throttle_interval_ms FROM pgmq.list_notify_insert_throttles()"
        ).fetchall() == [("jobs", 100)]
        assert conn.execute("SELECT * FROM pgmq.send_topic('orders.new', '{}')").fetchone() == (1,)


def test_reinstall_keeps_pgmq_names_that_pgqueue_names_differently(dsn: str) -> None:
    with _connect(dsn) as conn:
        install(conn)
        for name in ("MyQueue", "celery@host.celery.pidbox"):
            conn.execute("SELECT pgmq.create(%s)", (name,))
            conn.execute("SELECT pgmq.send(%s, '{}')", (name,))
        listed = conn.execute("SELECT queue_name FROM pgmq.list_queues() ORDER BY 1").fetchall()
        install(conn)
        assert (
            conn.execute("SELECT queue_name FROM pgmq.list_queues() ORDER BY 1").fetchall()
            == listed
        )
        assert sorted(r[0] for r in listed) == sorted(["MyQueue", "celery@host.celery.pidbox"])
        assert conn.execute("SELECT count(*) FROM pgmq.q_myqueue").fetchone() == (1,)
        assert conn.execute(
            'SELECT count(*) FROM pgmq."q_celery@host.celery.pidbox"'
        ).fetchone() == (1,)


def test_a_failing_facade_file_changes_nothing(dsn: str, tmp_path: Path) -> None:
    with _connect(dsn) as conn:
        install(conn)
        conn.execute("SELECT pgmq.create('jobs')")
        functions = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgmq'::regnamespace"
        ).fetchone()
        broken = tmp_path / "pgmq"
        broken.mkdir()
        for f in facade_files():
            (broken / f.name).write_text(f.read_text())
        (broken / "99_broken.sql").write_text("SELECT no_such_function();\n")
        with pytest.raises(MigrationError, match=r"99_broken\.sql failed: .*nothing was changed"):
            install(conn, directory=broken)
        assert status(conn).installed
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgmq'::regnamespace"
            ).fetchone()
            == functions
        )
        assert conn.execute("SELECT count(*) FROM pgmq.list_queues()").fetchone() == (1,)


def test_install_waits_for_a_migration_in_progress(dsn: str) -> None:
    with _connect(dsn) as holder, _connect(dsn) as conn:
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        done = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                install(conn)
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)
            done.set()

        t = threading.Thread(target=run)
        t.start()
        assert not done.wait(0.5)  # held back by the migrators' lock
        holder.execute("COMMIT")
        t.join(30)
        assert done.is_set() and not errors


def test_install_grants_usage_on_the_schema_to_pgqueues_roles(dsn: str) -> None:
    with _connect(dsn) as conn:
        install(conn)
        roles = [
            r
            for (r,) in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE 'pgqueue\\_%' ORDER BY 1"
            )
        ]
        assert {"pgqueue_producer", "pgqueue_consumer", "pgqueue_operator"} <= set(roles)
        for role in ("pgqueue_producer", "pgqueue_consumer", "pgqueue_operator"):
            row = conn.execute("SELECT has_schema_privilege(%s, 'pgmq', 'USAGE')", (role,))
            assert row.fetchone() == (True,), role


def test_install_beside_real_pgmq_is_refused_in_one_line_and_changes_nothing(
    real_pgmq_dsn: str,
) -> None:
    with _connect(real_pgmq_dsn) as conn:
        migrate(conn)
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("SELECT pgmq.send('jobs', '{}')")
        found = status(conn)
        assert found.installed is False and found.pgmq_queues == 1
        assert found.real_pgmq == "PGMQ installed as SQL in schema pgmq"
        with pytest.raises(PgmqConflict) as err:
            install(conn)
        message = str(err.value)
        assert "\n" not in message
        assert "cannot live beside it" in message and "`pgqueue pgmq import`" in message
        assert _schema_comment(conn) is None
        assert conn.execute("SELECT count(*) FROM pgmq.q_jobs").fetchone() == (1,)
        with pytest.raises(PgmqConflict, match="nothing was uninstalled"):
            uninstall(conn)
        assert conn.execute("SELECT count(*) FROM pgmq.meta").fetchone() == (1,)


def test_install_beside_a_strangers_schema_pgmq_is_refused(dsn: str) -> None:
    with _connect(dsn) as conn:
        conn.execute("CREATE SCHEMA pgmq")
        conn.execute("CREATE TABLE pgmq.mine (x int)")
        assert status(conn).real_pgmq == "a schema pgmq that is neither PGMQ's nor pgqueue's"
        with pytest.raises(PgmqConflict, match="neither PGMQ's nor pgqueue's"):
            install(conn)
        assert conn.execute("SELECT to_regclass('pgmq.mine')").fetchone() == ("pgmq.mine",)


def test_uninstall_removes_the_facade_and_keeps_the_queues(dsn: str) -> None:
    with _connect(dsn) as conn:
        assert uninstall(conn) is False
        install(conn)
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("SELECT pgmq.send('jobs', '{\"n\": 1}')")
        assert uninstall(conn) is True
        assert conn.execute("SELECT to_regnamespace('pgmq')").fetchone() == (None,)
        assert conn.execute("SELECT message FROM pgqueue.message").fetchall() == [({"n": 1},)]
        # no trigger of the facade is left on pgqueue's tables
        assert conn.execute("SELECT pgqueue.create_queue('more')").fetchone() is not None
        assert uninstall(conn) is False


# -- the command -------------------------------------------------------------------


def test_cli_install_status_uninstall(dsn: str) -> None:
    first = _cli("status", dsn=dsn)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "pgmq facade: not installed (`pgqueue pgmq install` installs the PGMQ 1.13.0 API)",
        "real PGMQ: none",
    ]
    done = _cli("install", dsn=dsn)
    assert (done.returncode, done.stderr) == (0, "")
    switch = (
        "PGMQ's clients: start PGMQ's Python client with init_extension=False (or"
        " PG_INIT_EXTENSION=false); its default CREATE EXTENSION pgmq fails beside the facade\n"
    )
    assert done.stdout == "installed the pgmq facade (PGMQ 1.13.0 API) in schema pgmq\n" + switch
    again = _cli("install", dsn=dsn)
    assert again.stdout == "reinstalled the pgmq facade (PGMQ 1.13.0 API) in schema pgmq\n" + switch
    shown = _cli("status", "--json", dsn=dsn)
    assert json.loads(shown.stdout) == {
        "installed": True,
        "version": "1.13.0",
        "as_extension": False,
        "real_pgmq": None,
        "pgmq_queues": 0,
        "available_version": "1.13.0",
    }
    refused = _cli("uninstall", dsn=dsn, stdin="")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "pgqueue: error: aborted; nothing was changed"
    )
    gone = _cli("uninstall", "--yes", dsn=dsn)
    assert (gone.returncode, gone.stderr) == (0, "")
    assert gone.stdout.startswith("removed the pgmq facade")
    assert _cli("uninstall", "--yes", dsn=dsn).stdout == (
        "the pgmq facade is not installed here; nothing to remove\n"
    )


def test_cli_install_errors_are_one_line_with_exit_1(empty_dsn: str, real_pgmq_dsn: str) -> None:
    unmigrated = _cli("install", dsn=empty_dsn)
    assert unmigrated.returncode == 1 and unmigrated.stdout == ""
    assert unmigrated.stderr.splitlines() == [
        "pgqueue: error: pgqueue's schema is not in this database: run `pgqueue migrate` first,"
        " then install the pgmq facade"
    ]
    with _connect(real_pgmq_dsn) as conn:
        migrate(conn)
    beside = _cli("install", dsn=real_pgmq_dsn)
    assert beside.returncode == 1
    assert beside.stderr.splitlines() == [
        "pgqueue: error: this database has PGMQ installed as SQL in schema pgmq, and the pgmq"
        " facade cannot live beside it; move its queues into pgqueue with `pgqueue pgmq import`"
        " (docs/pgmq.md)"
    ]
    shown = _cli("status", dsn=real_pgmq_dsn)
    assert shown.stdout.splitlines()[-1] == (
        "real PGMQ: PGMQ installed as SQL in schema pgmq, 0 queues; `pgqueue pgmq import`"
        " moves them into pgqueue"
    )


def test_migrate_reinstalls_a_facade_installed_from_other_sql_and_keeps_its_queues(
    dsn: str,
) -> None:
    """An upgraded pgqueue's `pgqueue migrate` brings its own facade; the queues stay."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("""SELECT pgmq.send('jobs', '{"n": 1}')""")
        # what an older pgqueue's facade leaves: another digest in the mark
        conn.execute("COMMENT ON SCHEMA pgmq IS 'pgqueue pgmq facade 1.13.0 000000000000'")
        conn.execute(
            "CREATE FUNCTION pgmq.left_by_the_old_facade() RETURNS int LANGUAGE sql AS 'SELECT 1'"
        )
        migrate(conn)
        mark = conn.execute("SELECT obj_description('pgmq'::regnamespace)").fetchone()
        assert mark is not None and mark[0].endswith(facade_digest(facade_files()))
        assert conn.execute("SELECT to_regproc('pgmq.left_by_the_old_facade')").fetchone() == (
            None,
        )
        assert conn.execute("SELECT message FROM pgmq.read('jobs', 30, 5)").fetchall() == [
            ({"n": 1},)
        ]
        # up to date: migrate leaves it alone
        conn.execute("CREATE FUNCTION pgmq.kept() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        migrate(conn)
        assert conn.execute("SELECT to_regproc('pgmq.kept')").fetchone() != (None,)
