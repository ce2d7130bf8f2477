"""A worker process whose handler sleeps 1 ms, traced as PGQUEUE_BENCH_OTEL says.

python -m benchmarks.tracing_worker DSN
"""

from __future__ import annotations

import os
import sys
import time

from benchmarks.otel_modes import install_from_env
from pgqueue import App, Client, Message, Worker, WorkerSettings
from pgqueue._log import configure_logging

app = App()


@app.handler("bench")
def work(msg: Message) -> None:
    """Some work: a millisecond's wait, as a short I/O call would take."""
    time.sleep(0.001)


def main() -> None:
    """Run until SIGTERM, after saying "ready" on stdout."""
    configure_logging(json=True, level="WARNING")
    install_from_env()
    settings = WorkerSettings(concurrency=4, poll_interval=0.1)
    client = Client.from_dsn(sys.argv[1], max_size=settings.pool_size)
    client.metrics("bench")
    print("ready", flush=True)
    code = Worker(app, client, settings).run()
    client.close()
    os._exit(code)


if __name__ == "__main__":
    main()
