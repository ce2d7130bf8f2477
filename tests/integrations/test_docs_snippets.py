"""docs/integrations.md's SQLAlchemy snippets, run as a user would run them.

Each snippet marked `<!-- snippet: NAME -->` runs in a Python process of its
own on a fresh database with a table `orders` and a queue `orders`; the
Alembic revision runs through Alembic itself, after a first revision of the
application's own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgqueue import Client

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
ORDERS = "CREATE TABLE orders (id serial PRIMARY KEY, item text NOT NULL)"


def snippets() -> dict[str, str]:
    """The doc's marked Python blocks, by name."""
    found = re.findall(
        r"<!-- snippet: ([\w-]+) -->\n```python\n(.*?)```", DOC.read_text(), re.DOTALL
    )
    return dict(found)


@pytest.fixture
def shop(dsn: str) -> str:
    """A migrated database with the application's table and queue."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ORDERS)
    with Client.from_dsn(dsn) as client:
        client.create_queue("orders")
    return dsn


def as_url(dsn: str) -> str:
    """The DSN as a postgresql:// URL, the form an SQLAlchemy URL is made from."""
    p = conninfo_to_dict(dsn)
    password = f":{p['password']}" if p.get("password") else ""
    host, port = str(p.get("host", "127.0.0.1")), p.get("port", 5432)
    user = f"{p.get('user', 'postgres')}{password}"
    if host.startswith("/"):  # a socket directory (the embedded server)
        return f"postgresql://{user}@/{p['dbname']}?host={host}&port={port}"
    return f"postgresql://{user}@{host}:{port}/{p['dbname']}"


def run(code: str, dsn: str, cwd: Path | None = None) -> None:
    """Run a snippet in a fresh interpreter; fail with its output when it fails."""
    env = {**os.environ, "PGQUEUE_DSN": as_url(dsn)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_doc_marks_the_snippets_this_file_runs() -> None:
    assert set(snippets()) >= {"sqlalchemy-session", "sqlalchemy-async-session", "alembic-revision"}


@pytest.mark.parametrize("name", ["sqlalchemy-session", "sqlalchemy-async-session"])
def test_an_sqlalchemy_snippet_runs(shop: str, name: str) -> None:
    pytest.importorskip("sqlalchemy", reason="needs pgqueue-py[sqlalchemy]")
    run(snippets()[name], shop)


def test_the_alembic_revision_migrates_with_the_application(empty_dsn: str, tmp_path: Path) -> None:
    pytest.importorskip("alembic", reason="needs alembic")
    versions = tmp_path / "migrations" / "versions"
    versions.mkdir(parents=True)
    (tmp_path / "migrations" / "env.py").write_text(
        textwrap.dedent(
            """
            import os

            from alembic import context
            from sqlalchemy import create_engine

            url = os.environ["PGQUEUE_DSN"].replace("postgresql://", "postgresql+psycopg://", 1)
            engine = create_engine(url)
            with engine.connect() as connection:
                context.configure(connection=connection, target_metadata=None)
                with context.begin_transaction():
                    context.run_migrations()
            """
        )
    )
    (tmp_path / "migrations" / "script.py.mako").write_text("")
    (versions / "0001_initial.py").write_text(
        textwrap.dedent(
            f"""
            from alembic import op

            revision = "0001_initial"
            down_revision = None


            def upgrade() -> None:
                op.execute("{ORDERS}")
            """
        )
    )
    (versions / "0002_pgqueue.py").write_text(snippets()["alembic-revision"])
    upgrade = (
        "from alembic import command\n"
        "from alembic.config import Config\n"
        "cfg = Config()\n"
        "cfg.set_main_option('script_location', 'migrations')\n"
        "command.upgrade(cfg, 'head')\n"
    )
    run(upgrade, empty_dsn, cwd=tmp_path)
    with Client.from_dsn(empty_dsn) as client:
        assert client.migrate() == [], "the revision applied every pgqueue migration"
        client.create_queue("orders")
        client.send("orders", {"n": 1})
    with psycopg.connect(empty_dsn) as conn:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    assert row == ("0002_pgqueue",)
    run(upgrade, empty_dsn, cwd=tmp_path)  # again: nothing to do
