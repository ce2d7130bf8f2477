"""pgqueue's schema (all its SQL migrations) in the database PGQUEUE["DATABASE"] names.

A project migration that needs pgqueue's tables (one creating a queue, say)
depends on ("pgqueue", "0001_pgqueue_schema").
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations  # type: ignore[import-untyped]


def apply(apps: Any, schema_editor: Any) -> None:
    from pgqueue.contrib.django.schema import migrate_if_configured

    migrate_if_configured(schema_editor.connection)


class Migration(migrations.Migration):  # type: ignore[misc]
    # pgqueue commits each of its migrations in a transaction of its own, under
    # its advisory lock, exactly as `pgqueue migrate` does (so the two may run
    # at once, in either order): on Django's autocommit connection, not inside
    # an atomic block that would hold the lock and the DDL until Django commits.
    atomic = False

    dependencies: ClassVar[list[tuple[str, str]]] = []

    # Unapplying keeps the schema: it holds the queues' messages.
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(apply, migrations.RunPython.noop, elidable=False)
    ]
