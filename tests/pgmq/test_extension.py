"""The facade as a real extension (extension/), and the PGMQ client's own start-up.

The `pgmq` client runs `CREATE EXTENSION IF NOT EXISTS pgmq` when it starts
unless init_extension=False (or PG_INIT_EXTENSION=false). With pgqueue's
extension files installed on the server (`make -C extension install`), that
statement creates the facade and the client starts with its defaults; without
them the server refuses it, and the switch is what makes the client start.

These tests write into the server's extension folder, so they run only when
this machine's pg_config names the server's own folder and it is writable;
else they skip and say why. They take a lock so no two write it at once,
refuse to touch a pgmq extension someone else installed, and remove every
file they wrote.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool
from support.pgmq import pgmq_sql

from pgqueue._pgmq import PgmqConflict, import_pgmq, install, status, uninstall

EXTENSION = Path(__file__).resolve().parents[2] / "extension"
FILES = ("pgmq.control", "pgmq--1.13.0.sql")


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def _sharedir(server_dsn: str) -> Path:
    """The server's extension folder, if this machine can write it; else skip, saying why."""
    if shutil.which("pg_config") is None or shutil.which("make") is None:
        pytest.skip("pg_config or make is not installed (apt-get install libpq-dev make)")
    local = subprocess.run(
        ["pg_config", "--sharedir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with _connect(server_dsn) as conn:
        try:
            row = conn.execute("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'").fetchone()
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("the test role may not read the server's pg_config (not a superuser)")
    if row is None or row[0] != local:
        pytest.skip(f"the server's SHAREDIR ({row and row[0]}) is not this machine's ({local})")
    folder = Path(local) / "extension"
    probe = folder / ".pgqueue-write-probe"
    try:
        probe.touch()
        probe.unlink()
    except OSError as exc:
        pytest.skip(f"the server's extension folder {folder} is not writable here: {exc}")
    return folder


@contextmanager
def _extension_folder(server_dsn: str) -> Iterator[Path]:
    """The server's extension folder, held for this test alone, with no pgmq files in it."""
    folder = _sharedir(server_dsn)
    lock = Path(tempfile.gettempdir()) / "pgqueue-extension-folder.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if any((folder / f).exists() for f in FILES):
            pytest.skip(f"{folder} already holds a pgmq extension; this test leaves it alone")
        try:
            yield folder
        finally:
            for f in FILES:
                (folder / f).unlink(missing_ok=True)


def _make(*targets: str) -> str:
    done = subprocess.run(
        ["make", "-C", str(EXTENSION), *targets], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _pool(dsn: str) -> ConnectionPool[Any]:
    return ConnectionPool(dsn, min_size=1, max_size=2, open=True)


def test_make_install_writes_the_control_file_and_the_script_then_uninstall_removes_them(
    server_dsn: str,
) -> None:
    with _extension_folder(server_dsn) as folder:
        said = _make("install")
        assert f"installed pgmq.control and pgmq--1.13.0.sql into {folder}" in said
        control = (folder / "pgmq.control").read_text()
        assert "default_version = '1.13.0'" in control and "schema = pgmq" in control
        assert "relocatable = false" in control and "pgqueue's pgmq facade" in control
        script = (folder / "pgmq--1.13.0.sql").read_text()
        assert script.startswith('\\echo Use "CREATE EXTENSION pgmq"')
        # CREATE EXTENSION makes schema pgmq itself (the control file names it)
        assert not re.search(r"^\s*CREATE SCHEMA", script, re.IGNORECASE | re.MULTILINE)
        for f in sorted((EXTENSION.parent / "sql" / "pgmq").glob("*.sql")):
            assert f.read_text() in script
        _make("uninstall")
        assert not any((folder / f).exists() for f in FILES)
        _make("clean")


def test_the_pgmq_client_with_its_defaults_creates_the_extension_and_works(
    server_dsn: str, dsn: str, empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgmq import PGMQueue

    monkeypatch.delenv("PG_INIT_EXTENSION", raising=False)
    with _extension_folder(server_dsn):
        _make("install")
        with _pool(dsn) as pool:
            queue = PGMQueue(pool=pool)  # init_extension=True: CREATE EXTENSION IF NOT EXISTS pgmq
            assert queue.create_queue("jobs") is None
            msg_id = queue.send("jobs", {"hello": "extension"})
            read = queue.read("jobs", vt=30)
            assert read is not None and (read.msg_id, read.message) == (
                msg_id,
                {"hello": "extension"},
            )
            assert queue.archive("jobs", msg_id) is True
            PGMQueue(pool=pool)  # a second start-up: the extension is there, nothing to do
        with _connect(dsn) as conn:
            found = status(conn)
            assert (found.installed, found.as_extension, found.version) == (True, True, "1.13.0")
            assert conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'pgmq'"
            ).fetchone() == ("1.13.0",)
            assert conn.execute("SELECT count(*) FROM pgqueue.archive").fetchone() == (1,)
            assert conn.execute(
                "SELECT has_schema_privilege('pgqueue_consumer', 'pgmq', 'USAGE')"
            ).fetchone() == (True,)
            with pytest.raises(PgmqConflict, match="installed here as the extension pgmq"):
                install(conn)
            assert uninstall(conn) is True
            assert conn.execute(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pgmq'"
            ).fetchone() == (0,)
            assert conn.execute("SELECT queue_name FROM pgqueue.queue").fetchall() == [("jobs",)]

        # not migrated: the extension's first statement says what to do
        with _connect(empty_dsn) as conn:
            with pytest.raises(psycopg.errors.InvalidSchemaName) as err:
                conn.execute("CREATE EXTENSION pgmq")
            assert err.value.diag.message_primary == (
                "pgqueue's schema is not in this database: run `pgqueue migrate` first,"
                " then CREATE EXTENSION pgmq"
            )
            assert conn.execute("SELECT to_regnamespace('pgmq')").fetchone() == (None,)


def test_with_the_extension_files_beside_a_facade_installed_by_the_cli_the_switch_is_needed(
    server_dsn: str, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgmq import PGMQueue

    monkeypatch.delenv("PG_INIT_EXTENSION", raising=False)
    with _extension_folder(server_dsn):
        _make("install")
        with _connect(dsn) as conn:
            install(conn)
        with _pool(dsn) as pool:
            with pytest.raises(psycopg.errors.DuplicateSchema) as err:
                PGMQueue(pool=pool)
            assert err.value.diag.message_primary == (
                "schema pgmq is taken: it holds pgqueue's facade installed by `pgqueue pgmq"
                " install`, or a PGMQ"
            )
            assert "init_extension=False" in (err.value.diag.message_hint or "")
            queue = PGMQueue(pool=pool, init_extension=False)
            queue.create_queue("jobs")
            assert queue.send("jobs", {"a": 1}) == 1
        with _connect(dsn) as conn:
            assert status(conn).as_extension is False


def test_without_the_extension_files_the_clients_start_up_fails_and_the_switch_starts_it(
    server_dsn: str, facade_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a user of `pgqueue pgmq install` meets: the server's own error, then the switch."""
    from pgmq import PGMQueue

    with _extension_folder(server_dsn) as folder, _pool(facade_dsn) as pool:
        monkeypatch.delenv("PG_INIT_EXTENSION", raising=False)
        with pytest.raises(psycopg.Error) as err:
            PGMQueue(pool=pool)
        # PostgreSQL 15 names the missing control file; 16 and later say "is not available"
        said = err.value.diag.message_primary or ""
        assert f"{folder}/pgmq.control" in said or 'extension "pgmq" is not available' in said
        queue = PGMQueue(pool=pool, init_extension=False)
        queue.create_queue("jobs")
        assert queue.send("jobs", {"a": 1}) == 1
        monkeypatch.setenv("PG_INIT_EXTENSION", "false")
        assert PGMQueue(pool=pool).read("jobs", vt=30) is not None


def test_a_real_pgmq_installed_as_an_extension_is_imported_and_dropped(
    server_dsn: str, dsn: str
) -> None:
    """PGMQ's own script as the extension pgmq: the import drops the extension, keeps the rows."""
    with _extension_folder(server_dsn) as folder:
        (folder / "pgmq.control").write_text(
            "comment = 'PGMQ (the tests'' copy)'\ndefault_version = '1.13.0'\n"
            "schema = pgmq\nrelocatable = false\n"
        )
        (folder / "pgmq--1.13.0.sql").write_text(pgmq_sql())
        with _connect(dsn) as conn:
            conn.execute("CREATE EXTENSION pgmq")
            assert status(conn).real_pgmq == "the pgmq extension 1.13.0"
            with pytest.raises(PgmqConflict, match="cannot live beside it"):
                install(conn)
            conn.execute("SELECT pgmq.create('jobs')")
            for i in range(5):
                conn.execute("SELECT pgmq.send('jobs', %s::jsonb)", (f'{{"i": {i}}}',))
            conn.execute("SELECT pgmq.read('jobs', 300, 2)")
            conn.execute("SELECT pgmq.archive('jobs', 5::bigint)")
            before = conn.execute("SELECT * FROM pgmq.q_jobs ORDER BY msg_id").fetchall()
            archived = conn.execute("SELECT * FROM pgmq.a_jobs ORDER BY msg_id").fetchall()
            report = import_pgmq(conn)
            assert report.pgmq == "extension 1.13.0" and report.facade_version == "1.13.0"
            assert conn.execute(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pgmq'"
            ).fetchone() == (0,)
            assert conn.execute("SELECT * FROM pgmq.q_jobs ORDER BY msg_id").fetchall() == before
            assert conn.execute("SELECT * FROM pgmq.a_jobs ORDER BY msg_id").fetchall() == archived
            found = status(conn)
            assert (found.installed, found.as_extension, found.real_pgmq) == (True, False, None)
