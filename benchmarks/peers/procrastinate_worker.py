"""One procrastinate worker process with a no-op task, for the drain benchmark.

    python -m benchmarks.peers.procrastinate_worker DSN [--concurrency N] [--delete-jobs WHEN]

Runs `App.run_worker_async` (what `procrastinate worker` runs) until SIGTERM; prints
"ready" once its connection pool is open, just before the worker starts.
"""

from __future__ import annotations

import argparse
import asyncio

from benchmarks.peers.procrastinate_peer import QUEUE, make_app


def main() -> None:
    """Parse the arguments and run the worker until it is told to stop."""
    ap = argparse.ArgumentParser()
    ap.add_argument("dsn")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--delete-jobs", default="never")
    args = ap.parse_args()
    app = make_app(args.dsn, args.concurrency + 2)

    async def go() -> None:
        async with app.open_async():
            print("ready", flush=True)
            await app.run_worker_async(
                queues=[QUEUE],
                concurrency=args.concurrency,
                delete_jobs=args.delete_jobs,
            )

    asyncio.run(go())


if __name__ == "__main__":
    main()
