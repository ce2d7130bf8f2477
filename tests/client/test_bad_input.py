"""Bad input at the Python and SQL boundaries, tried systematically: a clear error, nothing lost.

Queue names with quotes and semicolons, numbers far outside what Postgres'
integer holds, payloads with NUL characters and odd JSON, a 20 MB payload and
one past what jsonb can hold. Every call either works as documented or raises
pgqueue's InvalidArgument/InvalidMessage (never a raw driver error), and a
refused call leaves the queue as it was.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgqueue import Client, InvalidArgument
from pgqueue._errors import InvalidMessage

# fullmatch: a pattern ending in $ also matches before a final newline in Python
NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")
FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def as_decimals(value: Any) -> Any:
    """The JSON value with every number as a Decimal of its JSON text."""
    return json.loads(json.dumps(value), parse_float=Decimal, parse_int=Decimal)


def live(client: Client, queue: str) -> int:
    return client.metrics(queue).queue_length


@FAST
@given(
    name=st.text(max_size=60)
    | st.sampled_from(["x'; DROP TABLE pgqueue.message; --", 'a"b', "UPPER", "0lead", "ok_name"])
)
@example(name="_\n")  # refused by the server; found by hypothesis in CI
def test_queue_names_are_validated_never_interpolated(client: Client, name: str) -> None:
    before = {q.queue_name for q in client.list_queues()}
    if NAME.fullmatch(name):
        client.create_queue(name)
        assert name in {q.queue_name for q in client.list_queues()}
    else:
        with pytest.raises(InvalidArgument):
            client.create_queue(name)
        assert {q.queue_name for q in client.list_queues()} == before
    # nothing was injected: the tables are all still there and usable
    client.create_queue("canary")
    client.send("canary", {"ok": True})
    assert live(client, "canary") >= 1


@FAST
@given(
    value=st.integers(min_value=-(2**40), max_value=2**40)
    | st.sampled_from([0, 2**31 - 1, 2**31, -1])
)
def test_numbers_outside_their_range_are_one_clear_error(client: Client, value: int) -> None:
    client.create_queue("nums")
    before = live(client, "nums")
    calls = {
        "delay": lambda: client.send("nums", {}, delay=value),
        "vt": lambda: client.read("nums", vt=value, qty=0),
        "qty": lambda: client.read("nums", vt=1, qty=value) and None,
    }
    for name, call in calls.items():
        if 0 <= value <= 2**31 - 1 and not (name == "qty" and value > 0):
            call()  # accepted (qty > 0 would claim: left out)
            continue
        if name == "qty" and 0 < value <= 2**31 - 1:
            continue
        with pytest.raises(InvalidArgument, match=name):
            call()
    expected = before + (1 if 0 <= value <= 2**31 - 1 else 0)  # the one accepted send
    assert live(client, "nums") == expected


@FAST
@given(
    payload=json_values,
    headers=st.none()
    | st.dictionaries(st.text(max_size=8) | st.just("_pg_x"), json_values, max_size=3),
)
def test_payloads_round_trip_or_are_refused_whole(
    client: Client, payload: Any, headers: Any
) -> None:
    client.create_queue("payloads")
    client.purge_queue("payloads")
    has_nul = "\\u0000" in json.dumps(payload) + json.dumps(headers)
    if has_nul:
        with pytest.raises(InvalidMessage, match="NUL"):
            client.send("payloads", payload, headers=headers)
        assert live(client, "payloads") == 0
        return
    if any(k.startswith("_pg_") for k in headers or {}):
        with pytest.raises(InvalidArgument, match="reserved"):
            client.send("payloads", payload, headers=headers)
        assert live(client, "payloads") == 0
        return
    msg_id = client.send("payloads", payload, headers=headers)
    [got] = client.read("payloads", vt=30, qty=1)
    assert got.msg_id == msg_id
    # jsonb keeps a number's decimal value, not its Python type: 2.5e+16 comes back
    # as the int 25000000000000000, so numbers are compared as decimals
    assert as_decimals(got.message) == as_decimals(payload)
    for key, value in (headers or {}).items():
        assert as_decimals(got.headers[key]) == as_decimals(value)


def test_a_20_mb_payload_round_trips(client: Client) -> None:
    client.create_queue("big")
    payload = {"blob": "x" * (20 * 1024 * 1024), "n": 1}
    msg_id = client.send("big", payload)
    [got] = client.read("big", vt=30)
    assert (got.msg_id, got.message) == (msg_id, payload)
    assert client.delete("big", msg_id)


def test_a_payload_past_what_jsonb_holds_is_refused_whole(client: Client) -> None:
    client.create_queue("big")
    too_big = {"blob": "x" * (1 << 28)}  # one byte past jsonb's longest string
    with pytest.raises(InvalidMessage, match="store large data elsewhere"):
        client.send("big", too_big)
    with pytest.raises(InvalidMessage, match="Nothing was enqueued"):
        client.send_batch("big", [{"n": 1}, too_big, {"n": 2}])
    assert live(client, "big") == 0


SQL_CASES = [
    ("malformed JSON", "SELECT pgqueue.send('q', %s::jsonb)", ("{bad json",)),
    ("headers not an object", "SELECT pgqueue.send('q', '{}'::jsonb, '[1]'::jsonb)", ()),
    ("negative delay", "SELECT pgqueue.send('q', '{}'::jsonb, NULL, -5)", ()),
    ("negative vt", "SELECT count(*) FROM pgqueue.read('q', -1, 1)", ()),
    ("name with a semicolon", "SELECT pgqueue.create_queue('a;b')", ()),
    ("unknown queue", "SELECT pgqueue.send('no_such', '{}'::jsonb)", ()),
    ("NULL message", "SELECT pgqueue.send('q', NULL)", ()),
]


@pytest.mark.parametrize(("case", "statement", "args"), SQL_CASES, ids=[c[0] for c in SQL_CASES])
def test_the_sql_boundary_refuses_bad_input_and_changes_nothing(
    sql: psycopg.Connection[Any], case: str, statement: str, args: tuple[Any, ...]
) -> None:
    sql.execute("SELECT pgqueue.create_queue('q')")
    sql.execute("SELECT pgqueue.send('q', '{\"kept\": 1}'::jsonb)")
    with pytest.raises(psycopg.Error) as info:
        sql.execute(statement, args)
    err = info.value
    # a message that says what is wrong (with a hint where there is one), not a crash
    assert err.sqlstate is not None and err.sqlstate[:2] in ("22", "PG"), (case, err.sqlstate)
    assert err.diag.message_primary
    rows = sql.execute("SELECT message FROM pgqueue.message").fetchall()
    assert rows == [({"kept": 1},)]
    assert sql.execute("SELECT count(*) FROM pgqueue.queue").fetchone() == (1,)
