"""Exit codes and the one line the command prints: 1 for an error, 2 for a usage error.

Connection failures (no answer, an answer that refused, a DSN that does not
parse) are errors: exit 1 with one line that says which, and where the DSN came
from. A bad worker option or PGQUEUE_* setting, and a MODULE:APP that names no
App, are usage errors: exit 2, naming the option, the variable or the argument.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from support.db import refused_dsn, with_dbname

from pgqueue._cli import main

MISSING_DB = "pgqueue_no_such_db"
NO_DSN: dict[str, str | None] = {"PGQUEUE_DSN": None, "DATABASE_URL": None}


def run(*args: str, **env: str | None) -> Result:
    """`pgqueue ARGS` in-process, with no DSN in the environment but what `env` sets."""
    return CliRunner().invoke(main, list(args), env={**NO_DSN, **env}, prog_name="pgqueue")


def error_line(result: Result, code: int) -> str:
    """The command exited with `code` and said why in exactly one line, without a traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("pgqueue: error: ")
    return line.removeprefix("pgqueue: error: ")


# -- connecting -----------------------------------------------------------------


def test_a_refused_port_says_so_with_the_real_attempts_and_time() -> None:
    dsn = refused_dsn()
    line = error_line(run("queue", "list", "--dsn", dsn), 1)
    assert line.startswith(
        f"could not connect to {dsn.split('//')[1]}: connection refused (after 1"
    )
    assert "check that the server is running" in line and "within" not in line


def test_a_missing_database_is_an_answer_that_refused_not_a_server_down(server_dsn: str) -> None:
    line = error_line(run("queue", "list", "--dsn", with_dbname(server_dsn, MISSING_DB)), 1)
    assert line.startswith("the server at ")
    assert f"answered but refused the connection: database '{MISSING_DB}' does not exist;" in line
    assert f"create it (CREATE DATABASE {MISSING_DB})" in line
    assert "running" not in line and "could not connect" not in line


@pytest.mark.parametrize(
    ("dsn", "reason"),
    [
        ("nonsense", 'missing "=" after "nonsense" in connection info string'),
        ("host=localhost port=abc", "port 'abc' is not a number from 1 to 65535"),
        ("postgresql://x:y@/?bad=1", 'invalid URI query parameter: "bad"'),
    ],
)
def test_a_malformed_dsn_is_named_as_such_not_as_a_refusal(dsn: str, reason: str) -> None:
    for args, source in (
        (("queue", "list", "--dsn", dsn), {}),
        (("queue", "list"), {"PGQUEUE_DSN": dsn}),
        (("queue", "list"), {"DATABASE_URL": dsn}),
    ):
        line = error_line(run(*args, **source), 1)
        assert line.startswith("malformed DSN (from "), line
        assert f"): {reason}; use a URI (postgresql://" in line
        assert "the database refused" not in line and "y@" not in line
        for var in source:
            assert line.startswith(f"malformed DSN (from {var}): ")


def test_the_hint_names_the_variable_the_dsn_came_from(server_dsn: str) -> None:
    for var in ("PGQUEUE_DSN", "DATABASE_URL"):
        line = error_line(run("queue", "list", **{var: refused_dsn()}), 1)
        assert line.endswith(
            f"check that the server is running and that the DSN (from {var}) is right"
        )
        line = error_line(run("queue", "list", **{var: with_dbname(server_dsn, MISSING_DB)}), 1)
        assert line.endswith(f"fix the database name in the DSN (from {var})")


def test_the_worker_names_its_dsn_option() -> None:
    args = ("worker", "examples.albums:app", "--startup-timeout", "0", "--dsn", refused_dsn())
    line = error_line(run(*args), 1)
    assert line.endswith("check that the server is running and that the DSN (from --dsn) is right")


def test_every_command_names_its_dsn_option() -> None:
    line = error_line(run("queue", "list", "--dsn", refused_dsn()), 1)
    assert line.endswith("check that the server is running and that the DSN (from --dsn) is right")


# -- worker settings --------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "requirement"),
    [
        ("--vt", "-1", "must be >= 1 second"),
        ("--vt", "0", "must be >= 1 second"),
        ("--concurrency", "0", "must be >= 1"),
        ("--readers", "0", "must be >= 1"),
        ("--batch", "-1", "must be >= 0 (0: a prefetch sized by the handlers' rate)"),
        ("--hard-timeout", "-1", "must be >= 0"),
        ("--shutdown-grace", "-2.5", "must be >= 0"),
        ("--poll-interval", "-1", "must be >= 0"),
        ("--startup-timeout", "-1", "must be >= 0"),
    ],
)
def test_a_bad_worker_option_is_a_usage_error_naming_it(
    option: str, value: str, requirement: str
) -> None:
    # No DSN at all: the options are refused before anything connects.
    line = error_line(run("worker", "examples.albums:app", option, value), 2)
    assert line == (
        f"Invalid value for '{option}': {requirement}, got {value} (see `pgqueue worker --help`)"
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"PGQUEUE_VT": "-1"}, "Invalid value for PGQUEUE_VT: must be >= 1 second, got '-1'"),
        (
            {"PGQUEUE_VT": "soon"},
            "Invalid value for PGQUEUE_VT: must be a whole number, got 'soon'",
        ),
        (
            {"PGQUEUE_CONCURRENCY": "0"},
            "Invalid value for PGQUEUE_CONCURRENCY: must be >= 1, got '0'",
        ),
        (
            {"PGQUEUE_POLL_INTERVAL": "fast"},
            "Invalid value for PGQUEUE_POLL_INTERVAL: must be a number, got 'fast'",
        ),
        (
            {"PGQUEUE_LISTEN": "maybe"},
            "Invalid value for PGQUEUE_LISTEN: must be on or off, got 'maybe'",
        ),
        (
            {"PGQUEUE_HEARTBEAT_FRACTION": "1.5"},
            "Invalid value for PGQUEUE_HEARTBEAT_FRACTION: must be between 0 and 1, got '1.5'",
        ),
        (
            {"PGQUEUE_ACK": "keep"},
            "Invalid value for PGQUEUE_ACK: must be delete or archive, got 'keep'",
        ),
        (
            {"PGQUEUE_BACKOFF_BASE": "10", "PGQUEUE_BACKOFF_MAX": "1"},
            "Invalid value for PGQUEUE_BACKOFF_MAX: must be >= backoff_base (10), got '1'",
        ),
    ],
)
def test_a_bad_worker_setting_in_the_environment_is_a_usage_error_naming_it(
    env: dict[str, str], expected: str
) -> None:
    line = error_line(run("worker", "examples.albums:app", **env), 2)
    assert line == f"{expected} (see `pgqueue worker --help`)"


def test_every_bad_worker_setting_is_named_at_once() -> None:
    line = error_line(run("worker", "examples.albums:app", "--vt", "0", PGQUEUE_CONCURRENCY="0"), 2)
    assert "Invalid value for PGQUEUE_CONCURRENCY: must be >= 1, got '0'" in line
    assert "invalid value for '--vt': must be >= 1 second, got 0" in line


def test_a_flag_wins_over_a_bad_environment_variable() -> None:
    line = error_line(run("worker", "examples.albums:app", "--vt", "5", PGQUEUE_VT="soon"), 1)
    assert line.startswith("no database given")  # past the settings: --vt won


# -- MODULE:APP -------------------------------------------------------------------


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on the Python path for this test's modules."""
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_app_path_naming_a_missing_attribute_says_so_and_lists_the_apps() -> None:
    line = error_line(run("worker", "examples.albums:nope"), 2)
    assert line == (
        "Invalid value for 'MODULE:APP': module 'examples.albums' has no attribute 'nope';"
        " its pgqueue.App objects: app (use examples.albums:app)"
        " (see `pgqueue worker --help`)"
    )


def test_an_app_path_naming_something_else_says_what_it_is() -> None:
    line = error_line(run("worker", "examples.albums:WORK_QUEUE"), 2)
    assert "'examples.albums:WORK_QUEUE' is of type str, not a pgqueue.App;" in line
    assert "its pgqueue.App objects: app (use examples.albums:app)" in line


def test_an_app_path_naming_a_module_with_no_app_says_so(modules: Path) -> None:
    (modules / "pgq_no_apps.py").write_text("x = 1\n")
    line = error_line(run("worker", "pgq_no_apps:app"), 2)
    assert "module 'pgq_no_apps' has no attribute 'app', and no pgqueue.App at all" in line


def test_an_app_path_without_its_app_part_suggests_one() -> None:
    line = error_line(run("worker", "examples.albums"), 2)
    assert line == (
        "Invalid value for 'MODULE:APP': expected MODULE:APP, got 'examples.albums';"
        " its pgqueue.App objects: app (use examples.albums:app)"
        " (see `pgqueue worker --help`)"
    )


def test_an_app_path_naming_no_module_says_so() -> None:
    line = error_line(run("worker", "nosuchmodule:app"), 2)
    assert line.startswith(
        "Invalid value for 'MODULE:APP': no module named 'nosuchmodule' on the Python path"
    ), line


def test_an_app_module_whose_own_import_fails_is_an_error_not_a_usage_error(
    modules: Path,
) -> None:
    (modules / "pgq_broken_app.py").write_text("import pgq_no_such_dependency\n")
    line = error_line(run("worker", "pgq_broken_app:app"), 1)
    assert line == ("importing 'pgq_broken_app' failed: No module named 'pgq_no_such_dependency'")


def test_the_worker_command_finds_an_app_in_the_current_directory(tmp_path: Path) -> None:
    # The installed `pgqueue` script, as a user runs it from their project.
    script = Path(sys.executable).parent / "pgqueue"
    (tmp_path / "pgq_tasks_here.py").write_text("app = 42\n")
    result = subprocess.run(
        [str(script), "worker", "pgq_tasks_here:app"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2, result.stderr
    assert "'pgq_tasks_here:app' is of type int, not a pgqueue.App" in result.stderr
