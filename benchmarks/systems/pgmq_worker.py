"""A PGMQ consumer process for the drain benchmark: read 100, ack them with one delete.

python -m benchmarks.systems.pgmq_worker DSN
"""

from __future__ import annotations

import signal
import sys
import time

import psycopg

READ = "SELECT msg_id, message FROM pgmq.read('bench', 30, 100)"
DELETE = "SELECT count(*) FROM pgmq.delete('bench', %s::bigint[])"


def main() -> None:
    """Consume until SIGTERM, after saying "ready" on stdout."""
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    with psycopg.connect(sys.argv[1], autocommit=True) as conn:
        conn.execute("SELECT 1")
        print("ready", flush=True)
        while not stopping:
            ids = [msg_id for msg_id, _ in conn.execute(READ).fetchall()]  # handle: no-op
            if ids:
                conn.execute(DELETE, (ids,))  # ack the batch
            else:
                time.sleep(0.1)  # empty: poll again soon


if __name__ == "__main__":
    main()
