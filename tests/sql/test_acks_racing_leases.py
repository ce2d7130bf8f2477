"""An ack by id that waits for another session's lease of the same message still finds it.

A lease moves a message out of the fresh lane (its version becomes a timed
one). A statement that found the message by id and then waited for that
lease's row lock re-checks its conditions on the new version when the lease
commits. The key is two indexes since 0027, one holding fresh messages and
one every other (docs/design/one-entry-sends.md): a lookup by id names both
in one qual, which holds on either version, so the ack finds the message.
Two lookups, one per index, would lose it; so does an ack made to look in
the fresh half only (`AND read_ct = 0 AND vt <= enqueued_at` added to its
DELETE), which fails these tests.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from pgqueue import Client

QUEUE = "raced"

# (label, SQL taking (queue, msg_id, enqueued_at), what a found message returns)
ACKS = [
    ("delete", "SELECT pgqueue.delete(%s, %s::bigint)", [(True,)]),
    ("archive", "SELECT pgqueue.archive(%s, %s::bigint)", [(True,)]),
    ("delete many", "SELECT * FROM pgqueue.delete(%s, ARRAY[%s]::bigint[])", "ids"),
    ("archive many", "SELECT * FROM pgqueue.archive(%s, ARRAY[%s]::bigint[])", "ids"),
    (
        "fenced delete",
        "SELECT * FROM pgqueue.delete(%s, ARRAY[%s]::bigint[], ARRAY[%s]::timestamptz[])",
        "ids",
    ),
    (
        "fenced archive",
        "SELECT * FROM pgqueue.archive(%s, ARRAY[%s]::bigint[], ARRAY[%s]::timestamptz[])",
        "ids",
    ),
    ("set_vt", "SELECT msg_id FROM pgqueue.set_vt(%s, %s::bigint, 60)", "ids"),
    ("set_vt with an error", "SELECT msg_id FROM pgqueue.set_vt(%s, %s::bigint, 60, 'e')", "ids"),
    ("poison", "SELECT pgqueue.poison(%s, %s::bigint, 'by hand')", [(True,)]),
]


def _wait_for_lock(sql: psycopg.Connection[Any], app: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = sql.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND wait_event_type = 'Lock'",
            (app,),
        ).fetchone()
        if row and row[0]:
            return
        time.sleep(0.01)
    raise AssertionError(f"{app} never waited for the lease's row lock")


@pytest.mark.parametrize(("label", "call", "found"), ACKS, ids=[a[0] for a in ACKS])
@pytest.mark.parametrize("reader", ["read", "read many"])
def test_an_ack_waiting_for_a_lease_of_a_fresh_message_finds_it(
    client: Client,
    dsn: str,
    sql: psycopg.Connection[Any],
    label: str,
    call: str,
    found: Any,
    reader: str,
) -> None:
    client.create_queue(QUEUE)
    msg_id = client.send(QUEUE, {"n": 1})
    if reader == "read many":  # the batch read (_take), not the one-message read
        client.send(QUEUE, {"n": 2})
    row = sql.execute(
        "SELECT enqueued_at, read_ct, vt <= enqueued_at FROM pgqueue.message WHERE msg_id = %s",
        (msg_id,),
    ).fetchone()
    assert row is not None
    enqueued_at, read_ct, fresh = row
    assert (read_ct, fresh) == (0, True), "the message must start in the fresh lane"
    args: tuple[Any, ...] = (QUEUE, msg_id, enqueued_at) if "fenced" in label else (QUEUE, msg_id)
    app = f"acker-{label.replace(' ', '-')}"
    outcome: dict[str, Any] = {}

    with psycopg.connect(dsn) as lease:
        leased = lease.execute(
            "SELECT msg_id FROM pgqueue.read(%s, 30, %s)",
            (QUEUE, 2 if reader == "read many" else 1),
        ).fetchall()
        assert (msg_id,) in leased  # uncommitted: the lease holds the row lock

        def ack() -> None:
            try:
                with psycopg.connect(dsn, autocommit=True, application_name=app) as conn:
                    outcome["rows"] = conn.execute(call, args).fetchall()
            except BaseException as exc:  # reported below, with the test's own assertion
                outcome["error"] = exc

        acker = threading.Thread(target=ack)
        acker.start()
        try:
            _wait_for_lock(sql, app)
        finally:
            lease.commit()  # the message is now a timed one, leased for 30 s
            acker.join(30)

    assert "error" not in outcome, outcome
    assert outcome["rows"] == ([(msg_id,)] if found == "ids" else found), (label, outcome)
    live = sql.execute(
        "SELECT read_ct FROM pgqueue.message WHERE msg_id = %s", (msg_id,)
    ).fetchone()
    archived = sql.execute(
        "SELECT count(*) FROM pgqueue.archive WHERE msg_id = %s", (msg_id,)
    ).fetchone()
    if label.startswith("set_vt"):
        assert live == (1,)  # still there, the lease's read counted
    else:
        assert live is None, f"{label} left the message live"
        assert archived == ((1,) if "archive" in label else (0,))
