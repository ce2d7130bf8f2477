"""The Django app: pgqueue's schema follows every `manage.py migrate`."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig  # type: ignore[import-untyped]
from django.db import connections  # type: ignore[import-untyped]
from django.db.models.signals import post_migrate  # type: ignore[import-untyped]


class PgQueueConfig(AppConfig):  # type: ignore[misc]
    """pgqueue.contrib.django, labelled `pgqueue`."""

    name = "pgqueue.contrib.django"
    label = "pgqueue"
    verbose_name = "pgqueue"

    def ready(self) -> None:
        """Apply pgqueue's pending migrations after each migrate, not only the first."""
        post_migrate.connect(_migrate_after, sender=self, dispatch_uid="pgqueue.migrate")


def _migrate_after(using: str, **_: Any) -> None:
    # The Django migration 0001 applies pgqueue's schema once and is then
    # recorded for good; a later pgqueue release brings new SQL migrations that
    # no new Django migration names, so every `migrate` applies what is pending
    # (one short transaction when nothing is).
    from pgqueue.contrib.django.schema import migrate_if_configured

    migrate_if_configured(connections[using])
