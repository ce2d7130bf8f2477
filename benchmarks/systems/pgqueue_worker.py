"""A pgqueue worker process with a no-op handler, for the drain benchmark.

python -m benchmarks.systems.pgqueue_worker DSN [--concurrency N] [--batch N] [--batch-handler]
"""

from __future__ import annotations

import argparse
import os

from benchmarks.otel_modes import install_from_env
from pgqueue import App, Client, Message, Worker, WorkerSettings
from pgqueue._log import configure_logging

app = App()


@app.handler("bench")
def noop(msg: Message) -> None:
    """Do nothing: the benchmark measures the queue, not the work."""


batch_app = App()


@batch_app.handler("bench", batch=True)
def noop_batch(msgs: list[Message]) -> None:
    """Do nothing with a whole read."""


def main() -> None:
    """Run the worker until SIGTERM, after saying "ready" on stdout."""
    ap = argparse.ArgumentParser()
    ap.add_argument("dsn")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--batch-handler", action="store_true", help="one handler call per read")
    ap.add_argument("--readers", type=int, default=1)
    args = ap.parse_args()
    configure_logging(json=True, level="WARNING")
    install_from_env()  # PGQUEUE_BENCH_OTEL: off unless asked
    settings = WorkerSettings(
        concurrency=args.concurrency, batch=args.batch, readers=args.readers, poll_interval=0.1
    )
    client = Client.from_dsn(args.dsn, max_size=settings.pool_size)
    client.metrics("bench")  # connected before the clock starts
    print("ready", flush=True)
    code = Worker(batch_app if args.batch_handler else app, client, settings).run()
    client.close()
    os._exit(code)


if __name__ == "__main__":
    main()
