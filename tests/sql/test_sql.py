"""The core contract called as raw SQL, the way psql or another language would."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest


@pytest.fixture
def q(sql: Any) -> str:
    sql.execute("SELECT pgqueue.create_queue('raw', 2)")
    return "raw"


def one(sql: Any, query: str, *params: Any) -> Any:
    return sql.execute(query, params).fetchone()[0]


def test_sql_send_read_delete_roundtrip(sql: Any, q: str) -> None:
    msg_id = one(sql, "SELECT pgqueue.send('raw', '{\"a\": 1}', '{\"h\": true}')")
    rows = sql.execute("SELECT * FROM pgqueue.read('raw', 30, 10)").fetchall()
    assert [(r[0], r[1], r[4], r[5]) for r in rows] == [(msg_id, 1, {"a": 1}, {"h": True})]
    assert one(sql, "SELECT pgqueue.delete('raw', %s)", msg_id) is True
    assert one(sql, "SELECT pgqueue.delete('raw', %s)", msg_id) is False


def test_sql_named_arguments_match_the_contract(sql: Any, q: str) -> None:
    a = one(sql, "SELECT pgqueue.send(queue_name => 'raw', message => '1', dedupe_key => 'k')")
    b = one(sql, "SELECT pgqueue.send(queue_name => 'raw', message => '2', dedupe_key => 'k')")
    assert a == b
    rows = sql.execute("SELECT * FROM pgqueue.read(queue_name => 'raw', vt => 5, qty => 1)")
    assert len(rows.fetchall()) == 1


def test_sql_batch_archive_and_metrics(sql: Any, q: str) -> None:
    ids = [
        r[0]
        for r in sql.execute(
            "SELECT * FROM pgqueue.send_batch('raw', ARRAY['1','2','3']::jsonb[])"
        ).fetchall()
    ]
    archived = sql.execute(
        "SELECT * FROM pgqueue.archive('raw', %s::bigint[])", (ids[:2],)
    ).fetchall()
    assert sorted(r[0] for r in archived) == ids[:2]
    metrics = sql.execute("SELECT queue_length, total_messages FROM pgqueue.metrics('raw')")
    assert metrics.fetchone() == (1, 3)


def test_sql_poison_drop_after_max_attempts(sql: Any, q: str) -> None:
    msg_id = one(sql, "SELECT pgqueue.send('raw', '\"boom\"')")
    for _ in range(2):
        assert len(sql.execute("SELECT * FROM pgqueue.read('raw', 0, 1)").fetchall()) == 1
    assert sql.execute("SELECT * FROM pgqueue.read('raw', 0, 1)").fetchall() == []
    row = sql.execute("SELECT msg_id, read_ct, reason FROM pgqueue.poison_list('raw')").fetchone()
    assert row[:2] == (msg_id, 2) and "max_attempts" in row[2]


def test_sql_unknown_queue_has_its_own_sqlstate(sql: Any) -> None:
    with pytest.raises(psycopg.Error) as info:
        sql.execute("SELECT pgqueue.send('missing', '1')")
    assert info.value.sqlstate == "PGQ01"
    assert info.value.diag.message_hint is not None


def test_sql_negative_vt_is_invalid_parameter_value(sql: Any, q: str) -> None:
    with pytest.raises(psycopg.Error) as info:
        sql.execute("SELECT * FROM pgqueue.read('raw', -1, 1)")
    assert info.value.sqlstate == "22023"


def test_sql_malformed_json_is_rejected_and_nothing_inserted(sql: Any, q: str) -> None:
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        sql.execute("SELECT pgqueue.send('raw', '{not json')")
    assert one(sql, "SELECT queue_length FROM pgqueue.metrics('raw')") == 0


def test_sql_null_message_in_batch_is_rejected_whole(sql: Any, q: str) -> None:
    with pytest.raises(psycopg.Error, match=r"messages\[2\] is NULL"):
        sql.execute("SELECT pgqueue.send_batch('raw', ARRAY['1', NULL]::jsonb[])")
    assert one(sql, "SELECT queue_length FROM pgqueue.metrics('raw')") == 0


def test_sql_set_vt_and_pop(sql: Any, q: str) -> None:
    msg_id = one(sql, "SELECT pgqueue.send('raw', '1')")
    sql.execute("SELECT * FROM pgqueue.read('raw', 300, 1)")
    assert sql.execute("SELECT * FROM pgqueue.pop('raw')").fetchall() == []
    assert len(sql.execute("SELECT * FROM pgqueue.set_vt('raw', %s, 0)", (msg_id,)).fetchall()) == 1
    assert [r[0] for r in sql.execute("SELECT * FROM pgqueue.pop('raw')").fetchall()] == [msg_id]
