"""pgqueue.contrib.django in a real Django project (tests/django_project), on the real server.

Django's settings are global to a process, so the project runs in
subprocesses (`manage.py ...`), each on a database of this test's own: the
pytest process never configures Django.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.extras import needs_extra

from pgqueue import Client
from pgqueue._migrate import available

needs_extra("django")

PROJECT = Path(__file__).resolve().parents[1] / "django_project"
DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def django_section() -> str:
    """The doc's "## Django" section, up to the next `## ` heading."""
    text = DOC.read_text()
    start = text.index("\n## Django\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _env(dsn: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGQUEUE_", "DJANGO_"))}
    return {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings", "SHOP_DATABASE_DSN": dsn, **extra}


def manage(
    dsn: str, *args: str, check: bool = True, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python manage.py ARGS` of the test project on `dsn`; fails the test on a non-zero exit."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=_env(dsn, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def shell(dsn: str, code: str) -> str:
    """Run `code` in `manage.py shell` (the project set up); what it printed."""
    return manage(dsn, "shell", "--no-imports", "-c", code).stdout


def one(dsn: str, query: str) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def orders(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT item FROM shop_order ORDER BY id")]


def messages(dsn: str) -> list[Any]:
    """The live messages of the queue `orders`, oldest first."""
    with Client.from_dsn(dsn, max_size=1) as client:
        return [m.message for m in client.peek("orders", qty=100)]


@pytest.fixture
def shop(empty_dsn: str) -> Iterator[str]:
    """A fresh database without pgqueue, migrated by the project's `manage.py migrate`."""
    manage(empty_dsn, "migrate")
    yield empty_dsn


POST = """
from django.test import Client
response = Client(raise_request_exception=False).post(
    "/orders/", {body}, content_type="application/json"
)
print(response.status_code)
"""


def test_migrate_applies_pgqueue_schema_and_is_idempotent(empty_dsn: str) -> None:
    first = manage(empty_dsn, "migrate")
    assert "Applying pgqueue.0001_pgqueue_schema..." in first.stdout
    versions = [m.version for m in available()]
    assert (
        one(empty_dsn, "SELECT array_agg(version ORDER BY version) FROM pgqueue.schema_version")
        == versions
    )
    again = manage(empty_dsn, "migrate")
    assert "No migrations to apply" in again.stdout
    assert one(empty_dsn, "SELECT count(*) FROM pgqueue.schema_version") == len(versions)
    assert one(empty_dsn, "SELECT count(*) FROM django_migrations WHERE app = 'pgqueue'") == 1
    # the project's own migration created its queue on pgqueue's schema
    with Client.from_dsn(empty_dsn, max_size=1) as client:
        assert [q.max_attempts for q in client.list_queues() if q.queue_name == "orders"] == [5]


def test_migrate_accepts_a_database_already_migrated_by_pgqueue_migrate(dsn: str) -> None:
    before = one(dsn, "SELECT array_agg(applied_at ORDER BY version) FROM pgqueue.schema_version")
    manage(dsn, "migrate")
    after = one(dsn, "SELECT array_agg(applied_at ORDER BY version) FROM pgqueue.schema_version")
    assert after == before  # nothing re-applied
    assert one(dsn, "SELECT count(*) FROM django_migrations WHERE app = 'pgqueue'") == 1


def test_migrate_applies_what_a_newer_pgqueue_adds_after_0001_was_recorded(shop: str) -> None:
    # As if the database had been migrated by an older pgqueue: its last migration pending.
    last = available()[-1]
    with psycopg.connect(shop) as conn:
        conn.execute("DELETE FROM pgqueue.schema_version WHERE version = %s", (last.version,))
    manage(shop, "migrate")
    assert one(shop, "SELECT max(version) FROM pgqueue.schema_version") == last.version


def test_migrate_refuses_a_database_that_is_not_postgresql(empty_dsn: str) -> None:
    done = manage(empty_dsn, "migrate", check=False, SHOP_DATABASE_ENGINE="sqlite")
    assert done.returncode != 0
    assert "pgqueue needs PostgreSQL, but Django database 'default' uses the sqlite" in done.stderr


def test_rolled_back_order_leaves_no_row_and_no_message(shop: str) -> None:
    out = shell(shop, POST.format(body='{"item": "book", "fail": True}'))
    assert out.split() == ["500"]
    assert orders(shop) == []
    assert messages(shop) == []


def test_committed_order_leaves_one_row_and_one_message(shop: str) -> None:
    out = shell(shop, POST.format(body='{"item": "book"}'))
    assert out.split() == ["200"]
    assert orders(shop) == ["book"]
    (order_id,) = (r for r in [one(shop, "SELECT id FROM shop_order")])
    assert messages(shop) == [{"order": order_id}]


def test_rolled_back_savepoint_keeps_the_outer_send(shop: str) -> None:
    shell(
        shop,
        """
from django.db import transaction
from pgqueue.contrib.django import send
from shop.models import Order

with transaction.atomic():
    outer = Order.objects.create(item="outer")
    send("orders", {"order": outer.pk})
    try:
        with transaction.atomic():
            inner = Order.objects.create(item="inner")
            send("orders", {"order": inner.pk})
            raise ValueError("inner block fails")
    except ValueError:
        pass
""",
    )
    assert orders(shop) == ["outer"]
    assert messages(shop) == [{"order": one(shop, "SELECT id FROM shop_order")}]


def test_send_outside_atomic_autocommits(shop: str) -> None:
    # The process ends without a commit of its own: a message left in an open
    # transaction would be rolled back at disconnect.
    shell(
        shop,
        "from pgqueue.contrib.django import send_batch\n"
        "send_batch('orders', [{'order': 1}, {'order': 2}])",
    )
    assert messages(shop) == [{"order": 1}, {"order": 2}]


def test_pgqueue_worker_processes_a_message_and_stops_on_sigterm(shop: str, tmp_path: Path) -> None:
    assert shell(shop, POST.format(body='{"item": "lamp"}')).split() == ["200"]
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "pgqueue_worker", "shop.tasks:app", "--queue", "orders"],
            cwd=PROJECT,
            env=_env(shop, PGQUEUE_POLL_INTERVAL="0.2"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120  # an outer bound: it ends when all are shipped
        while not one(shop, "SELECT bool_and(shipped) FROM shop_order"):
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert messages(shop) == []  # acked


def test_pgqueue_worker_help_is_the_worker_help(empty_dsn: str) -> None:
    done = manage(empty_dsn, "help", "pgqueue_worker")
    assert "Usage: manage.py pgqueue_worker [OPTIONS] MODULE:APP" in done.stdout
    assert "--concurrency" in done.stdout


def _doc_blocks() -> list[tuple[str, str]]:
    """The doc's code blocks that name a file of the test project on their first line."""
    blocks = re.findall(r"```python\n# (\S+\.py)\n(.*?)```", django_section(), re.S)
    assert blocks, f"{DOC} shows no project file"
    return blocks


def test_doc_shows_the_test_projects_code() -> None:
    for name, code in _doc_blocks():
        source = (PROJECT / name).read_text()
        assert code in source, f"{DOC.name}'s {name} is not the code of tests/django_project/{name}"


def test_manage_test_runs_the_projects_test_case_on_a_migrated_test_database(
    empty_dsn: str, server_dsn: str
) -> None:
    done = manage(empty_dsn, "test", "shop", "--noinput", check=False)
    assert done.returncode == 0, done.stderr
    assert "Ran 1 test" in done.stderr
    test_db = "test_" + one(empty_dsn, "SELECT current_database()")
    assert one(server_dsn, f"SELECT count(*) FROM pg_database WHERE datname = '{test_db}'") == 0


def test_migrations_inside_atomic_commit_or_roll_back_with_it(empty_dsn: str) -> None:
    shell(
        empty_dsn,
        """
from django.db import connection, transaction
from pgqueue.contrib.django.schema import migrate_if_configured

try:
    with transaction.atomic():
        assert migrate_if_configured(connection)
        raise RuntimeError("roll back")
except RuntimeError:
    pass
""",
    )
    assert one(empty_dsn, "SELECT to_regclass('pgqueue.schema_version')") is None
