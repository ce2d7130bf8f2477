"""Does an ack that waits for a concurrent lease still find the message, with split keys?

A probe of docs/design/one-entry-sends.md, section 3, on a scratch schema of
the server named by --dsn (dropped afterwards). The message table's primary
key is split into two partial unique indexes, fresh and the rest. One session
leases message 7 (moving it from the fresh index to the other) and holds the
transaction open; another deletes message 7 by id and waits; the lease
commits. Each way of writing the delete prints its plan and how many rows it
deleted: 1 means the ack found the leased message, 0 that it missed it.

    python -m benchmarks.whatif.split_keys_epq [--dsn DSN]
"""

from __future__ import annotations

import argparse
import threading
import time

import psycopg

from benchmarks.common import DEFAULT_DSN

FRESH = "(read_ct = 0 AND vt <= enqueued_at AND group_key IS NULL)"
WAYS = {
    "one qual naming both predicates": (
        f"DELETE FROM whatif_epq.m WHERE queue_id = 1 AND msg_id = 7"
        f" AND ({FRESH} OR {FRESH} IS NOT TRUE)"
    ),
    "two lookups, then a delete by ctid": (
        "DELETE FROM whatif_epq.m WHERE ctid = ANY (ARRAY("
        f"SELECT ctid FROM whatif_epq.m WHERE queue_id = 1 AND msg_id = 7 AND {FRESH}"
        " UNION ALL"
        " SELECT ctid FROM whatif_epq.m WHERE queue_id = 1 AND msg_id = 7"
        f" AND {FRESH} IS NOT TRUE))"
    ),
}


def setup(dsn: str) -> None:
    """The scratch schema: a message table with the split keys and the timed lane."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS whatif_epq CASCADE")
        conn.execute("CREATE SCHEMA whatif_epq")
        conn.execute(
            "CREATE TABLE whatif_epq.m (queue_id integer NOT NULL, msg_id bigint NOT NULL,"
            " read_ct integer NOT NULL DEFAULT 0, enqueued_at timestamptz NOT NULL,"
            " vt timestamptz NOT NULL, group_key text)"
        )
        conn.execute(f"CREATE UNIQUE INDEX ON whatif_epq.m (queue_id, msg_id) WHERE {FRESH}")
        conn.execute(
            f"CREATE UNIQUE INDEX ON whatif_epq.m (queue_id, msg_id) WHERE {FRESH} IS NOT TRUE"
        )
        conn.execute(
            "CREATE INDEX ON whatif_epq.m (queue_id, vt, msg_id)"
            " WHERE (read_ct <> 0 OR vt > enqueued_at) AND group_key IS NULL"
        )
        conn.execute(
            "INSERT INTO whatif_epq.m SELECT 1, g, 0, now(), now() FROM generate_series(1, 1000) g"
        )


def trial(dsn: str, delete: str) -> tuple[int, str]:
    """Rows the delete removed while it waited for a lease of message 7, and its plan."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE whatif_epq.m SET read_ct = 0, vt = enqueued_at WHERE msg_id = 7")
    out: dict[str, object] = {}
    with psycopg.connect(dsn) as lease:
        lease.execute(
            "UPDATE whatif_epq.m SET read_ct = read_ct + 1,"
            " vt = clock_timestamp() + interval '30 seconds' WHERE queue_id = 1 AND msg_id = 7"
        )

        def ack() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SET enable_seqscan = off")
                out["plan"] = "\n".join(str(r[0]) for r in conn.execute("EXPLAIN " + delete))
                with conn.transaction(force_rollback=True):
                    out["rows"] = conn.execute(delete).rowcount

        waiter = threading.Thread(target=ack)
        waiter.start()
        time.sleep(0.5)  # the delete is now waiting for the lease's row lock
        lease.commit()
        waiter.join(30)
    return int(str(out["rows"])), str(out["plan"])


def main() -> None:
    """Print, for each way of writing an ack, whether it found the leased message."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=DEFAULT_DSN, help="a server with a database to use")
    dsn = ap.parse_args().dsn
    setup(dsn)
    try:
        for label, delete in WAYS.items():
            rows, plan = trial(dsn, delete)
            print(f"{label}: deleted {rows} ({'found' if rows == 1 else 'MISSED'})")
            print("    " + plan.replace("\n", "\n    "))
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS whatif_epq CASCADE")


if __name__ == "__main__":
    main()
