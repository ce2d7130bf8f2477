"""What PGMQ raises and prints, the facade raises and prints: SQLSTATE, text, notices.

PGMQ's own regression tests and clients match on its errors (psycopg's
RaiseException is P0001; `LIKE '%must be non-negative%'`; pgmq-py's HTTP API
answers 42P01 with 404). Each case here runs one statement against real PGMQ
1.13 and against the facade, each side on its own fresh database prepared the
same way, and compares the SQLSTATE, the primary message and every notice and
warning. Only errors PGMQ has no counterpart for stay pgqueue's (the header
rule, names pgqueue cannot hold): those are asserted in test_facade_sql.py.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

SETUP = (
    "SELECT pgmq.create('q')",
    "SELECT pgmq.create('quiet')",
    "SELECT pgmq.create('loud')",
    "SELECT pgmq.enable_notify_insert('loud', 100)",
)

CASES = {
    # names
    "too long": "SELECT pgmq.create(repeat('a', 48))",
    "too long, validated": "SELECT pgmq.validate_queue_name(repeat('a', 48))",
    "47 is fine": "SELECT pgmq.validate_queue_name(repeat('a', 47))",
    "characters are format_table_name's": "SELECT pgmq.validate_queue_name('a$b')",
    "dollar": "SELECT pgmq.create('dollar$signed')",
    "semicolon": "SELECT pgmq.create_non_partitioned('a;b')",
    "dashes": "SELECT pgmq.create_unlogged('a--b')",
    "quote": "SELECT pgmq.create('it''s')",
    "format_table_name": "SELECT pgmq.format_table_name('x$', 'q')",
    "format_table_name lowercases": "SELECT pgmq.format_table_name('MiXed', 'a')",
    "injection on delete": "SELECT pgmq.delete('abc where false; create table x(i int); --', 1)",
    "created again": "SELECT pgmq.create('q')",
    # a queue that does not exist
    "send": "SELECT * FROM pgmq.send('missing', '{}')",
    "send_batch": "SELECT * FROM pgmq.send_batch('missing', ARRAY['{}']::jsonb[])",
    "read": "SELECT * FROM pgmq.read('missing', 30, 1)",
    "read_with_poll": "SELECT * FROM pgmq.read_with_poll('missing', 30, 1, 1, 10)",
    "pop": "SELECT * FROM pgmq.pop('missing')",
    "delete": "SELECT pgmq.delete('missing', 1::bigint)",
    "delete many": "SELECT * FROM pgmq.delete('missing', ARRAY[1]::bigint[])",
    "archive": "SELECT pgmq.archive('missing', 1::bigint)",
    "set_vt": "SELECT * FROM pgmq.set_vt('missing', 1::bigint, 5)",
    "metrics": "SELECT * FROM pgmq.metrics('missing')",
    "purge": "SELECT pgmq.purge_queue('missing')",
    "read, negative qty": "SELECT * FROM pgmq.read('q', 30, -1)",
    "read_with_poll, negative qty": "SELECT * FROM pgmq.read_with_poll('q', 30, -1, 1, 10)",
    "pop, negative qty": "SELECT * FROM pgmq.pop('q', -1)",
    "drop": "SELECT pgmq.drop_queue('missing')",
    "drop, deprecated form": "SELECT pgmq.drop_queue('q', true)",
    "detach_archive": "SELECT pgmq.detach_archive('q')",
    # batches
    "empty batch": "SELECT * FROM pgmq.send_batch('q', ARRAY[]::jsonb[])",
    "NULL batch": "SELECT * FROM pgmq.send_batch('q', NULL::jsonb[])",
    "empty batch with headers": (
        "SELECT * FROM pgmq.send_batch('q', ARRAY[]::jsonb[], ARRAY[]::jsonb[])"
    ),
    "headers of another length": (
        "SELECT * FROM pgmq.send_batch('q', ARRAY['1', '2']::jsonb[],"
        " ARRAY['{}', '{}', '{}']::jsonb[])"
    ),
    "headers of another length, delayed": (
        "SELECT * FROM pgmq.send_batch('q', ARRAY['1']::jsonb[], ARRAY[]::jsonb[], 5)"
    ),
    # notify on insert
    "enable, negative": "SELECT pgmq.enable_notify_insert('q', -1)",
    "enable, missing": "SELECT pgmq.enable_notify_insert('missing', 10)",
    "enable": "SELECT pgmq.enable_notify_insert('q', 10)",
    "enable again": "SELECT pgmq.enable_notify_insert('loud', 10)",
    "update, negative": "SELECT pgmq.update_notify_insert('loud', -5)",
    "update, missing": "SELECT pgmq.update_notify_insert('missing', 5)",
    "update, not notifying": "SELECT pgmq.update_notify_insert('quiet', 5)",
    "update": "SELECT pgmq.update_notify_insert('loud', 5)",
    "disable, not notifying": "SELECT pgmq.disable_notify_insert('quiet')",
    "disable, missing": "SELECT pgmq.disable_notify_insert('missing')",
    "throttle table": ("SELECT queue_name, throttle_interval_ms FROM pgmq.notify_insert_throttle"),
    # partitioned queues, on a database without pg_partman
    "partitioned": "SELECT pgmq.create_partitioned('p')",
    "partitioned, too long": "SELECT pgmq.create_partitioned(repeat('p', 48))",
    "partitioned, bad name": "SELECT pgmq.create_partitioned('p$')",
    "archive converted": "SELECT pgmq.convert_archive_partitioned('q')",
    "archive converted, long name": (
        "SELECT pgmq.create('long_queue_name_123456789012345678901234567890');"
        " SELECT pgmq.convert_archive_partitioned('long_queue_name_123456789012345678901234567890')"
    ),
    "archive of a missing queue converted": "SELECT pgmq.convert_archive_partitioned('missing')",
}


def outcome(dsn: str, statement: str) -> dict[str, Any]:
    """What one statement does on a database prepared by SETUP: rows or error, and its notices."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for step in SETUP:
            conn.execute(step)
        said: list[tuple[str | None, str | None]] = []
        conn.add_notice_handler(lambda d: said.append((d.severity_nonlocalized, d.message_primary)))
        try:
            got: Any = conn.execute(statement).fetchall()
        except psycopg.Error as exc:
            got = (exc.sqlstate, exc.diag.message_primary)
        return {"result": got, "notices": said}


@pytest.mark.parametrize("statement", list(CASES.values()), ids=list(CASES))
def test_the_facade_raises_and_prints_what_pgmq_does(
    real_pgmq_dsn: str, facade_dsn: str, statement: str
) -> None:
    real = outcome(real_pgmq_dsn, statement)
    assert outcome(facade_dsn, statement) == real


def test_the_cases_meet_pgmqs_errors_not_only_its_successes(real_pgmq_dsn: str) -> None:
    # a guard on the table above: most cases are refusals, with PGMQ's codes
    codes = [outcome(real_pgmq_dsn, s)["result"] for s in CASES.values()]
    raised = [c[0] for c in codes if isinstance(c, tuple)]
    assert raised.count("P0001") >= 15 and raised.count("42P01") >= 10
