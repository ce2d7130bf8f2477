"""`manage.py pgqueue_worker MODULE:APP [options]`: `pgqueue worker` on PGQUEUE's DSN.

The same command as `pgqueue worker` (docs/worker.md), with the same options,
run in the Django process (handlers may use the ORM) and connected to the
DSN of settings.PGQUEUE unless `--dsn` is given.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from django.core.management.base import BaseCommand  # type: ignore[import-untyped]

from pgqueue.contrib.django.conf import dsn, get_settings

# Options manage.py itself reads before any command runs; not the worker's.
_DJANGO_OPTIONS = ("--settings", "--pythonpath")


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run the handlers of MODULE:APP (a pgqueue.App) until SIGTERM; `pgqueue worker`."

    def run_from_argv(self, argv: list[str]) -> None:
        """Hand every argument to `pgqueue worker`, whose options these are."""
        _worker(_without_django_options(argv[2:]), f"{os.path.basename(argv[0])} {argv[1]}")

    def print_help(self, prog_name: str, subcommand: str) -> None:
        """`manage.py help pgqueue_worker`: the worker's own help."""
        _worker(["--help"], f"{os.path.basename(prog_name)} {subcommand}")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        # For call_command("pgqueue_worker", "shop.tasks:app", "--queue", "orders").
        parser.add_argument("worker_args", nargs=argparse.REMAINDER)

    def handle(self, *args: Any, **options: Any) -> None:
        _worker([*args, *options["worker_args"]], "pgqueue_worker")


def _without_django_options(args: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _DJANGO_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in _DJANGO_OPTIONS)):
            kept.append(arg)
    return kept


def _worker(args: list[str], prog_name: str) -> None:
    from pgqueue._cli.run import worker

    if "--help" not in args and not any(a == "--dsn" or a.startswith("--dsn=") for a in args):
        args = [*args, "--dsn", dsn(get_settings())]
    # Exits the process: with the worker's code once it stops, 2 on a usage error.
    worker.main(args=args, prog_name=prog_name)
