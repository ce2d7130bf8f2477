"""The example app of compose/: albums of photos, one thumbnail job per photo.

The producer (`python -m examples.albums produce`) fans each album out as one
barrier: a member per photo, with the callback `album_ready` when every
thumbnail is done. Consumers run `pgqueue worker examples.albums:app`:
- `thumbnails` does the per-photo work (EXAMPLE_WORK_SECONDS of it, to stand
  in for real work) and returns the thumbnail's size, the member's result;
- `album_ready` is the callback: transactional, guarded by the barrier id, so
  a redelivered callback records the album once (table example_albums).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

import psycopg

import pgqueue

WORK_QUEUE = "thumbnails"
CALLBACK_QUEUE = "album_ready"
SCHEMA = """
CREATE TABLE IF NOT EXISTS example_albums (
    album text PRIMARY KEY,
    barrier_id text NOT NULL,
    photos integer NOT NULL,
    thumbnails integer NOT NULL,
    failed integer NOT NULL,
    ready_at timestamptz NOT NULL DEFAULT now()
)
"""

app = pgqueue.App()


@app.handler(WORK_QUEUE)
def thumbnail(msg: pgqueue.Message) -> dict[str, Any]:
    """Make one thumbnail; its size is the barrier member's result."""
    time.sleep(float(os.environ.get("EXAMPLE_WORK_SECONDS", "0.05")))
    if msg.message.get("corrupt"):
        raise pgqueue.Poison("image cannot be decoded")
    return {"photo": msg.message["photo"], "bytes": 1000 + len(msg.message["photo"]) * 37}


@app.handler(CALLBACK_QUEUE, transactional=True)
def album_ready(msg: pgqueue.Message, conn: psycopg.Connection[Any]) -> None:
    """Record the album once, in the same transaction as the callback's ack."""
    done = msg.callback  # what the firing wrote; None on anything else sent here
    if done is None or done.kind != "barrier":
        raise pgqueue.Poison("not a barrier's callback")
    if not pgqueue.guard(conn, f"album-ready:{done.barrier_id}"):
        return  # a redelivered callback: already recorded
    body = msg.message
    conn.execute(SCHEMA)
    conn.execute(
        "INSERT INTO example_albums (album, barrier_id, photos, thumbnails, failed)"
        " VALUES (%s, %s, %s, %s, %s)",
        (
            body["album"],
            done.barrier_id,
            body["photos"],
            done.succeeded,
            done.failed,
        ),
    )


def produce(client: pgqueue.Client, albums: int, photos: int, every: float) -> list[int]:
    """Fan out `albums` albums of `photos` photos, one every `every` seconds; barrier ids."""
    client.create_queue(WORK_QUEUE)
    client.create_queue(CALLBACK_QUEUE)
    with client.connection() as conn:
        conn.execute(SCHEMA)
    barriers = []
    for a in range(albums):
        album = f"album-{os.getpid()}-{a}"
        members = [{"album": album, "photo": f"{album}/p{i}.jpg"} for i in range(photos)]
        barriers.append(
            client.fan_out(
                WORK_QUEUE,
                members,
                callback_queue=CALLBACK_QUEUE,
                callback_message={"album": album, "photos": photos},
            )
        )
        if every and a + 1 < albums:
            time.sleep(every * random.uniform(0.5, 1.5))
    return barriers


def main(argv: list[str] | None = None) -> int:
    """`python -m examples.albums produce ...`: the compose producer."""
    ap = argparse.ArgumentParser(prog="python -m examples.albums")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("produce", help="fan out albums of thumbnail jobs")
    p.add_argument(
        "--dsn", default=None, help="Postgres DSN [default: $PGQUEUE_DSN, then $DATABASE_URL]"
    )
    p.add_argument("--albums", type=int, default=int(os.environ.get("EXAMPLE_ALBUMS", "10")))
    p.add_argument("--photos", type=int, default=int(os.environ.get("EXAMPLE_PHOTOS", "50")))
    p.add_argument(
        "--every", type=float, default=float(os.environ.get("EXAMPLE_EVERY_SECONDS", "1"))
    )
    args = ap.parse_args(argv)
    try:
        # None: $PGQUEUE_DSN, then $DATABASE_URL, as the pgqueue command finds it.
        # Behind PgBouncer, PGQUEUE_PREPARE_THRESHOLD=off turns prepared statements off.
        with pgqueue.Client.from_dsn(args.dsn, max_size=2) as client:
            barriers = produce(client, args.albums, args.photos, args.every)
    except pgqueue.PgQueueError as exc:
        print(f"examples.albums: error: {exc}", file=sys.stderr)
        return 1
    print(f"fanned out {len(barriers)} album(s) of {args.photos} photos: barriers {barriers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
