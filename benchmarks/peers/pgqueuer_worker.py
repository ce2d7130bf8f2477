"""One PgQueuer worker process with a no-op handler, for the drain benchmark.

    python -m benchmarks.peers.pgqueuer_worker DSN [--driver asyncpg|psycopg] [--batch-size N]
        [--max-concurrent-tasks N]

Runs `pgqueuer.run` (the Python form of `pgq run`) on uvloop until SIGTERM; prints
"ready" once its connection is open, just before PgQueuer starts consuming.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pgqueuer
from pgqueuer import PgQueuer
from pgqueuer.models import Job

from benchmarks.peers import pgqueuer_peer
from benchmarks.peers.pgqueuer_peer import ENTRYPOINT, _run, driver


def main() -> None:
    """Parse the arguments and run the worker until it is told to stop."""
    ap = argparse.ArgumentParser()
    ap.add_argument("dsn")
    ap.add_argument("--driver", default=pgqueuer_peer.DRIVER)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--max-concurrent-tasks", type=int, default=None)
    args = ap.parse_args()
    pgqueuer_peer.DRIVER = args.driver

    @asynccontextmanager
    async def factory() -> AsyncIterator[PgQueuer]:
        async with driver(args.dsn) as drv:
            pgq = PgQueuer(drv)

            @pgq.entrypoint(ENTRYPOINT)
            async def noop(job: Job) -> None:
                return None

            print("ready", flush=True)
            yield pgq

    _run(
        pgqueuer.run(
            factory,
            batch_size=args.batch_size,
            max_concurrent_tasks=args.max_concurrent_tasks,
        )
    )


if __name__ == "__main__":
    main()
