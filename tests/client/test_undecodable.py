"""Documents no reader can decode: every entry refuses them, and every reader survives one.

The entries refuse a document nested more than 255 levels deep (22023, one
line, nothing sent). One that got in another way (an older version, `pgqueue
pgmq import` before it checked, a direct write: `plant`) is poisoned alone by
the read that meets it, with the rest of the read handed out. An integer
longer than Python's default limit (4,300 digits) is not refused: it is read
exactly. tests/client/test_reading_undecodable.py has the first cases; here,
each reader in turn, both clients, the caller's transaction committed, a
barrier fired by the poisoning itself, and the door at every entry.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from support.db import plant

from pgqueue import AsyncClient, Client, InvalidArgument, InvalidMessage, Message, Undecodable

DEEP = "[" * 10000 + "]" * 10000  # past every Python's json: 3.13 reads 3,000 levels
BIG = "9" * 5000  # past Python's default of 4,300 digits
BIG_INT = 10**5000 - 1  # the same, made without a conversion the limit would stop


@pytest.fixture(autouse=True)
def default_digit_limit() -> Iterator[None]:
    """Python's default digit limit: an in-process CLI test before this one lifts it."""
    saved = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(4300)
    yield
    sys.set_int_max_str_digits(saved)


def arrays(levels: int) -> str:
    """A JSON value inside `levels` nested arrays."""
    return "[" * levels + "1" + "]" * levels


def objects(levels: int) -> str:
    """A JSON value inside `levels` nested objects."""
    return '{"a":' * levels + "1" + "}" * levels


@pytest.fixture
def mixed(client: Client, sql: Any) -> dict[str, int]:
    """Queue q: healthy messages around one too deep, one with deep headers, one long integer."""
    client.create_queue("q", max_attempts=5)
    return {
        "first": client.send("q", {"n": 1}),
        "deep": plant(sql, "q", DEEP),
        "big": plant(sql, "q", f'{{"n": {BIG}}}', f'{{"h": -{BIG}}}'),
        "deep_headers": plant(sql, "q", '{"n": 2}', '{"h": ' + DEEP + "}"),
        "last": client.send("q", {"n": 3}),
    }


def poison_rows(sql: Any) -> dict[int, tuple[int, str, str, str | None]]:
    """msg_id -> (read_ct, reason, message as text, headers as text) of the poison table."""
    rows = sql.execute(
        "SELECT msg_id, read_ct, reason, message::text, headers::text FROM pgqueue.poison"
    ).fetchall()
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}


def assert_neighbours_handed_out_and_the_bad_ones_poisoned(
    got: list[Message], mixed: dict[str, int], sql: Any, logs: list[dict[str, Any]]
) -> None:
    assert [m.msg_id for m in got] == [mixed["first"], mixed["big"], mixed["last"]]
    big = next(m for m in got if m.msg_id == mixed["big"])
    assert big.message == {"n": BIG_INT} and big.headers == {"h": -BIG_INT}
    gone = poison_rows(sql)
    assert set(gone) == {mixed["deep"], mixed["deep_headers"]}
    read_ct, reason, message, _ = gone[mixed["deep"]]
    assert read_ct == 1  # as leased: the poisoning was fenced by this read's lease
    assert reason.startswith("undecodable message: Python cannot decode it (RecursionError")
    assert message == DEEP  # kept whole
    read_ct, reason, message, headers = gone[mixed["deep_headers"]]
    assert read_ct == 1 and reason.startswith("undecodable headers: Python cannot decode it")
    assert message == '{"n": 2}' and headers == '{"h": ' + DEEP + "}"
    logged = [e for e in logs if e["event"] == "message.undecodable"]
    assert sorted(e["msg_id"] for e in logged) == [mixed["deep"], mixed["deep_headers"]]
    assert all(e["action"] == "poisoned" and e["read_ct"] == 1 for e in logged)
    assert sql.execute("SELECT count(*) FROM pgqueue.message").fetchone()[0] == 3


def _async(dsn: str, read: Callable[[AsyncClient], Any]) -> list[Message]:
    async def go() -> list[Message]:
        async with await AsyncClient.from_dsn(dsn, max_size=2) as ac:
            got: list[Message] = await read(ac)
            return got

    return asyncio.run(go())


READERS: dict[str, Callable[[Client, str], list[Message]]] = {
    "read": lambda c, dsn: c.read("q", vt=30, qty=10),
    "read_with_poll": lambda c, dsn: c.read_with_poll("q", vt=30, qty=10, max_poll_seconds=1),
    "read_or_wait": lambda c, dsn: c.read_or_wait("q", vt=30, qty=10, max_wait_seconds=1),
    "async read": lambda c, dsn: _async(dsn, lambda ac: ac.read("q", vt=30, qty=10)),
    "async read_with_poll": lambda c, dsn: _async(
        dsn, lambda ac: ac.read_with_poll("q", vt=30, qty=10, max_poll_seconds=1)
    ),
    "async read_or_wait": lambda c, dsn: _async(
        dsn, lambda ac: ac.read_or_wait("q", vt=30, qty=10, max_wait_seconds=1)
    ),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_each_reader_hands_out_exactly_the_neighbours_and_poisons_each_bad_one_alone(
    client: Client,
    sql: Any,
    dsn: str,
    mixed: dict[str, int],
    captured_logs: list[dict[str, Any]],
    reader: str,
) -> None:
    got = READERS[reader](client, dsn)
    assert_neighbours_handed_out_and_the_bad_ones_poisoned(got, mixed, sql, captured_logs)


def test_read_or_wait_on_a_queue_holding_only_one_returns_nothing_and_poisons_it(
    client: Client, sql: Any
) -> None:
    client.create_queue("q")
    deep = plant(sql, "q", DEEP)
    assert client.read_or_wait("q", vt=30, qty=5, max_wait_seconds=0.5) == []
    assert set(poison_rows(sql)) == {deep}


def test_a_read_in_the_callers_transaction_poisons_in_it_and_commits_with_it(
    client: Client, sql: Any, dsn: str, mixed: dict[str, int]
) -> None:
    with psycopg.connect(dsn) as conn:
        got = client.read("q", vt=30, qty=10, conn=conn)
        assert len(got) == 3
        inside = conn.execute("SELECT msg_id FROM pgqueue.poison ORDER BY msg_id").fetchall()
        assert [r[0] for r in inside] == [mixed["deep"], mixed["deep_headers"]]
        assert poison_rows(sql) == {}  # not committed yet
        conn.commit()
    assert set(poison_rows(sql)) == {mixed["deep"], mixed["deep_headers"]}


def test_pop_leaves_it_out_and_logs_its_text_sync_and_async(
    client: Client, sql: Any, dsn: str, mixed: dict[str, int], captured_logs: list[dict[str, Any]]
) -> None:
    first = client.pop("q", qty=2)
    assert [m.msg_id for m in first] == [mixed["first"]]
    rest = _async(dsn, lambda ac: ac.pop("q", qty=10))
    assert [m.msg_id for m in rest] == [mixed["big"], mixed["last"]]
    assert rest[0].message == {"n": BIG_INT}
    logged = {e["msg_id"]: e for e in captured_logs if e["event"] == "message.undecodable"}
    assert set(logged) == {mixed["deep"], mixed["deep_headers"]}
    assert logged[mixed["deep"]]["text"] == DEEP[:1000]  # the start of what was lost
    assert logged[mixed["deep"]]["chars"] == len(DEEP)
    assert all(e["action"] == "lost: it was popped" for e in logged.values())
    assert poison_rows(sql) == {}  # at most once: popped means gone
    assert sql.execute("SELECT count(*) FROM pgqueue.message").fetchone()[0] == 0


def test_peek_and_the_poison_table_show_an_undecodable_in_both_clients(
    client: Client, dsn: str, mixed: dict[str, int]
) -> None:
    peeked = {p.msg_id: p for p in client.peek("q", qty=10)}
    assert isinstance(peeked[mixed["deep"]].message, Undecodable)
    assert isinstance(peeked[mixed["deep_headers"]].headers, Undecodable)
    assert peeked[mixed["deep_headers"]].message == {"n": 2}
    assert peeked[mixed["big"]].message == {"n": BIG_INT}
    client.read("q", vt=30, qty=10)

    async def shown() -> tuple[Any, Any]:
        async with await AsyncClient.from_dsn(dsn, max_size=1) as ac:
            listed = {p.msg_id: p for p in await ac.poison_list("q")}
            return listed, await ac.poison_get("q", mixed["deep_headers"])

    listed, one = asyncio.run(shown())
    deep = listed[mixed["deep"]].message
    assert isinstance(deep, Undecodable)
    assert deep.chars == len(DEEP) and deep.error.startswith("RecursionError")
    assert one is not None and isinstance(one.headers, Undecodable) and one.message == {"n": 2}


def test_the_poisoning_of_the_last_member_fires_its_barrier_as_failed(
    client: Client, sql: Any
) -> None:
    client.create_queue("work")
    client.create_queue("done")
    bid = client.fan_out("work", [1, 2], callback_queue="done", callback_message={"b": 1})
    [first, second] = [r.msg_id for r in client.barrier_results(bid)]
    sql.execute("UPDATE pgqueue.message SET message = %s::jsonb WHERE msg_id = %s", (DEEP, second))
    [healthy] = client.read("work", vt=30, qty=1)
    assert healthy.msg_id == first
    client.complete_member("work", first)
    assert client.read("done", vt=30, qty=5) == []  # one member still open
    assert client.read("work", vt=30, qty=5) == []  # the other: poisoned by this read
    outcomes = [(r.msg_id, r.outcome) for r in client.barrier_results(bid)]
    assert outcomes == [(first, "succeeded"), (second, "poisoned")]
    [callback] = client.read("done", vt=30, qty=5)
    assert callback.message == {"b": 1}
    assert callback.callback is not None and callback.callback.state == "failed"


# -- the door ---------------------------------------------------------------

# Each entry that takes a document, in each place it takes one, and what its
# refusal calls it: %(doc)s is a document, %(headers)s headers, nested N levels.
ENTRIES: list[tuple[str, str, str]] = [
    ("send", "SELECT pgqueue.send('q', %(doc)s::jsonb)", "message"),
    ("send headers", "SELECT pgqueue.send('q', '1', %(headers)s::jsonb)", "headers"),
    (
        "send_batch",
        "SELECT pgqueue.send_batch('q', ARRAY['1'::jsonb, %(doc)s::jsonb, '3'])",
        "messages[2]",
    ),
    (
        "send_batch headers",
        "SELECT pgqueue.send_batch('q', ARRAY['1'::jsonb, '2'], ARRAY[NULL, %(headers)s::jsonb])",
        "headers",
    ),
    ("send_keyed", "SELECT pgqueue.send_keyed('q', %(doc)s::jsonb, 'k')", "message"),
    (
        "send_keyed headers",
        "SELECT pgqueue.send_keyed('q', '1', 'k', %(headers)s::jsonb)",
        "headers",
    ),
    (
        "fan_out member",
        "SELECT pgqueue.fan_out('q', ARRAY['1'::jsonb, %(doc)s::jsonb], 'cb', '{}')",
        "messages[2]",
    ),
    (
        "fan_out callback_message",
        "SELECT pgqueue.fan_out('q', ARRAY['1'::jsonb], 'cb', %(doc)s::jsonb)",
        "callback_message",
    ),
    (
        "fan_out headers",
        "SELECT pgqueue.fan_out('q', ARRAY['1'::jsonb], 'cb', '{}', headers => %(headers)s::jsonb)",
        "headers",
    ),
    (
        "open_barrier member",
        "SELECT pgqueue.open_barrier('q', 'cb', '{}', messages => ARRAY[%(doc)s::jsonb])",
        "messages[1]",
    ),
    (
        "open_barrier callback_message",
        "SELECT pgqueue.open_barrier('q', 'cb', %(doc)s::jsonb)",
        "callback_message",
    ),
    (
        "add_members",
        "SELECT pgqueue.add_members('open', ARRAY['1'::jsonb, '2', %(doc)s::jsonb])",
        "messages[3]",
    ),
    (
        "start_workflow step message",
        "SELECT pgqueue.start_workflow('w', jsonb_build_array(jsonb_build_object("
        "'step', 'a', 'queue', 'q', 'message', %(doc)s::jsonb)))",
        'step "a" messages[1]',
    ),
    (
        "start_workflow step messages",
        "SELECT pgqueue.start_workflow('w', jsonb_build_array(jsonb_build_object("
        "'step', 'a', 'queue', 'q', 'messages', jsonb_build_array(1, %(doc)s::jsonb))))",
        'step "a" messages[2]',
    ),
    (
        "start_workflow step headers",
        "SELECT pgqueue.start_workflow('w', jsonb_build_array(jsonb_build_object("
        "'step', 'a', 'queue', 'q', 'message', 1, 'headers', %(headers)s::jsonb)))",
        "headers",
    ),
    (
        "start_workflow callback_message",
        'SELECT pgqueue.start_workflow(\'w\', \'[{"step": "a", "queue": "q", "message": 1}]\','
        " 'cb', %(doc)s::jsonb)",
        "callback_message",
    ),
    (
        "start_workflow headers",
        'SELECT pgqueue.start_workflow(\'w\', \'[{"step": "a", "queue": "q", "message": 1}]\','
        " headers => %(headers)s::jsonb)",
        "headers",
    ),
    (
        "add_steps",
        "SELECT pgqueue.add_steps('growing', jsonb_build_array(jsonb_build_object("
        "'step', 'b', 'queue', 'q', 'message', %(doc)s::jsonb)))",
        'step "b" messages[1]',
    ),
    ("pgmq.send", "SELECT pgmq.send('pq', %(doc)s::jsonb)", "message"),
    ("pgmq.send headers", "SELECT pgmq.send('pq', '1', %(headers)s::jsonb)", "headers"),
    (
        "pgmq.send_batch",
        "SELECT pgmq.send_batch('pq', ARRAY['1'::jsonb, %(doc)s::jsonb])",
        "messages[2]",
    ),
    (
        "pgmq.send_batch headers",
        "SELECT pgmq.send_batch('pq', ARRAY['1'::jsonb, '2'], ARRAY[NULL, %(headers)s::jsonb])",
        "headers",
    ),
]

# What an entry that sends nothing leaves as it was.
STATE = (
    "SELECT (SELECT count(*) FROM pgqueue.message), (SELECT count(*) FROM pgqueue.barrier),"
    " (SELECT count(*) FROM pgqueue.barrier_member), (SELECT count(*) FROM pgqueue.workflow),"
    " (SELECT count(*) FROM pgqueue.workflow_step)"
)


@pytest.fixture
def door(client: Client, sql: Any) -> Any:
    """Queues q and cb, an open barrier `open`, an unsealed workflow `growing`, the facade's pq."""
    import pgqueue._pgmq

    client.create_queue("q")
    client.create_queue("cb")
    client.open_barrier("q", callback_queue="cb", callback_message={}, barrier_id="open")
    sql.execute(
        "SELECT pgqueue.start_workflow('growing',"
        ' \'[{"step": "a", "queue": "q", "message": 1}]\', sealed => false)'
    )
    pgqueue._pgmq.install(sql)
    sql.execute("SELECT pgmq.create('pq')")
    return sql


@pytest.mark.parametrize(("entry", "statement", "named"), ENTRIES, ids=[e[0] for e in ENTRIES])
def test_every_entry_refuses_256_levels_in_one_line_and_takes_255(
    door: Any, entry: str, statement: str, named: str
) -> None:
    before = door.execute(STATE).fetchone()
    for deep in (arrays, objects):
        refused = {"doc": deep(256), "headers": '{"h": ' + deep(255) + "}"}
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            door.execute(statement, refused)
        assert caught.value.sqlstate == "22023"
        assert caught.value.diag.message_primary == f"{named} is nested more than 255 levels deep"
        assert door.execute(STATE).fetchone() == before  # nothing sent, nothing armed
    door.execute(statement, {"doc": arrays(255), "headers": '{"h": ' + objects(254) + "}"})
    assert door.execute(STATE).fetchone() != before


def test_255_levels_in_a_message_and_its_headers_are_read_by_python(
    client: Client, sql: Any
) -> None:
    client.create_queue("q")
    sql.execute(
        "SELECT pgqueue.send('q', %s::jsonb, %s::jsonb)",
        (arrays(255), '{"h": ' + objects(254) + "}"),
    )
    [msg] = client.read("q", vt=30, qty=10)
    depth, value = 0, msg.message
    while isinstance(value, list):
        depth, value = depth + 1, value[0]
    assert (depth, value) == (255, 1)
    depth, value = 0, msg.headers
    while isinstance(value, dict):
        depth, value = depth + 1, value.get("h", value.get("a"))
    assert (depth, value) == (255, 1)
    assert client.poison_list("q") == []


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def test_a_python_send_too_deep_for_its_encoder_is_an_invalid_message_and_sends_nothing(
    client: Client, sql: Any
) -> None:
    client.create_queue("q")
    with pytest.raises(InvalidMessage, match="message is nested too deep for Python's JSON"):
        client.send("q", nested(100_000))
    with pytest.raises(InvalidMessage, match="nested too deep"):
        client.send_batch("q", [1, nested(100_000)])
    assert sql.execute("SELECT count(*) FROM pgqueue.message").fetchone()[0] == 0


def test_a_python_send_the_database_refuses_names_the_depth_and_sends_nothing(
    client: Client, sql: Any
) -> None:
    client.create_queue("q")
    client.create_queue("cb")
    refusals = {
        "message is nested more than 255 levels deep": lambda: client.send("q", nested(300)),
        "headers is nested more than 255 levels deep": lambda: client.send(
            "q", 1, headers={"h": nested(300)}
        ),
        "messages[2] is nested more than 255 levels deep": lambda: client.send_batch(
            "q", [1, nested(300), 3]
        ),
        "callback_message is nested more than 255 levels deep": lambda: client.fan_out(
            "q", [1], callback_queue="cb", callback_message=nested(300)
        ),
    }
    for said, send in refusals.items():
        with pytest.raises(InvalidArgument) as caught:
            send()
        assert not isinstance(caught.value, InvalidMessage)  # Python encoded it; SQL refused
        assert str(caught.value).startswith(said)
    assert sql.execute("SELECT count(*) FROM pgqueue.message").fetchone()[0] == 0
