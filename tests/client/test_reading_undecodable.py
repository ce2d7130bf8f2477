"""A message Python cannot decode, among healthy ones: poisoned alone, at once; the rest read.

No entry takes such a document any more (the door refuses nesting beyond 255
levels), so these tests plant one as the owner would find it: written by an
older version, an import or a direct write (`plant`). Before, the read leased
the whole batch and raised in Python: every worker of the queue died on it,
and after max_attempts restarts its healthy neighbours were poisoned unread.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from support.db import plant

from pgqueue import AsyncClient, Client, Undecodable

DEEP = "[" * 10000 + "]" * 10000  # past every Python's json: 3.13 reads 3,000 levels


@pytest.fixture
def bad(client: Client, sql: Any) -> dict[str, int]:
    """Queue q: a healthy message, one too deep, one whose headers are too deep, a healthy one."""
    client.create_queue("q", max_attempts=5)
    ids = {"first": client.send("q", {"n": 1})}
    ids["deep"] = plant(sql, "q", DEEP)
    ids["deep_headers"] = plant(sql, "q", '{"n": 2}', '{"h": ' + DEEP + "}")
    ids["last"] = client.send("q", {"n": 3})
    return ids


def poisoned(sql: Any) -> dict[int, tuple[int, str, str]]:
    rows = sql.execute(
        "SELECT msg_id, read_ct, reason, length(message::text) FROM pgqueue.poison"
    ).fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_a_read_hands_out_the_rest_and_poisons_each_undecodable_one_alone(
    client: Client, sql: Any, bad: dict[str, int], captured_logs: list[dict[str, Any]]
) -> None:
    got = client.read("q", vt=30, qty=10)
    assert [m.msg_id for m in got] == [bad["first"], bad["last"]]
    gone = poisoned(sql)
    assert set(gone) == {bad["deep"], bad["deep_headers"]}
    read_ct, reason, chars = gone[bad["deep"]]
    assert read_ct == 1 and reason.startswith("undecodable message: Python cannot decode it")
    assert "RecursionError" in reason and chars == len(DEEP)  # the document kept whole
    assert gone[bad["deep_headers"]][1].startswith("undecodable headers")
    logged = [e for e in captured_logs if e["event"] == "message.undecodable"]
    assert sorted(e["msg_id"] for e in logged) == [bad["deep"], bad["deep_headers"]]
    assert all(e["queue"] == "q" and e["read_ct"] == 1 for e in logged)


def test_every_read_survives_one(client: Client, sql: Any, bad: dict[str, int], dsn: str) -> None:
    assert [m.msg_id for m in client.read_with_poll("q", vt=30, qty=1, max_poll_seconds=1)] == [
        bad["first"]
    ]
    got = client.read_or_wait("q", vt=30, qty=10, max_wait_seconds=1)
    assert [m.msg_id for m in got] == [bad["last"]]

    async def more() -> list[int]:
        async with await AsyncClient.from_dsn(dsn, max_size=1) as ac:
            return [m.msg_id for m in await ac.read("q", vt=30, qty=10)]

    assert asyncio.run(more()) == []
    assert set(poisoned(sql)) == {bad["deep"], bad["deep_headers"]}


def test_a_read_in_the_callers_transaction_poisons_in_it(
    client: Client, sql: Any, bad: dict[str, int], dsn: str
) -> None:
    with psycopg.connect(dsn) as conn:
        got = client.read("q", vt=30, qty=10, conn=conn)
        assert len(got) == 2
        conn.rollback()  # the leases and the poisoning go together
    assert poisoned(sql) == {}
    assert len(client.read("q", vt=30, qty=10)) == 2


def test_an_undecodable_member_counts_as_poisoned_and_its_barrier_fires(
    client: Client, sql: Any
) -> None:
    client.create_queue("work")
    client.create_queue("done")
    bid = client.fan_out("work", [1, 2], callback_queue="done", callback_message={})
    [first, second] = [r.msg_id for r in client.barrier_results(bid)]
    sql.execute("UPDATE pgqueue.message SET message = %s::jsonb WHERE msg_id = %s", (DEEP, first))
    [healthy] = client.read("work", vt=30, qty=10)
    client.complete_member("work", healthy.msg_id)
    assert [r.outcome for r in client.barrier_results(bid)] == ["poisoned", "succeeded"]
    [callback] = client.read("done", vt=30, qty=5)
    assert callback.callback is not None and callback.callback.state == "failed"
    assert second == healthy.msg_id


def test_peek_and_the_poison_table_show_an_undecodable(
    client: Client, sql: Any, bad: dict[str, int]
) -> None:
    shown = {p.msg_id: p for p in client.peek("q", qty=10)}
    assert isinstance(shown[bad["deep"]].message, Undecodable)
    assert isinstance(shown[bad["deep_headers"]].headers, Undecodable)
    assert shown[bad["first"]].message == {"n": 1}
    client.read("q", vt=30, qty=10)
    listed = {p.msg_id: p for p in client.poison_list("q")}
    one = client.poison_get("q", bad["deep"])
    for p in (listed[bad["deep"]], one):
        assert p is not None and isinstance(p.message, Undecodable)
        assert p.message.chars == len(DEEP) and p.message.text.startswith("[[[")


def test_pop_leaves_it_out_and_logs_its_text(
    client: Client, sql: Any, bad: dict[str, int], captured_logs: list[dict[str, Any]]
) -> None:
    got = client.pop("q", qty=10)
    assert [m.msg_id for m in got] == [bad["first"], bad["last"]]
    logged = [e for e in captured_logs if e["event"] == "message.undecodable"]
    assert {e["msg_id"] for e in logged} == {bad["deep"], bad["deep_headers"]}
    assert all(e["action"] == "lost: it was popped" and e["text"] for e in logged)


def test_a_backslash_before_u0000_in_a_string_is_no_nul_and_is_sent(client: Client) -> None:
    """json.dumps writes a backslash and "u0000" as \\\\u0000: no NUL character, stored fine."""
    client.create_queue("text")
    client.send("text", {"path": "C:\\u0000"})
    [msg] = client.read("text", vt=30, qty=1)
    assert msg.message == {"path": "C:\\u0000"}


def test_a_result_python_cannot_decode_shows_as_such_and_the_others_read(
    client: Client, sql: Any
) -> None:
    """A member's result is not checked at the door (a worker's ack of a batch must not fail
    for one): its readers decode row by row. Before, barrier_results raised for the lot."""
    from pgqueue import Step

    client.create_queue("work")
    client.create_queue("done")
    bid = client.fan_out("work", [1, 2], callback_queue="done", callback_message={})
    a, b = client.read("work", vt=30, qty=5)
    sql.execute("SELECT pgqueue.complete_member('work', %s, 'failed', %s::jsonb)", (a.msg_id, DEEP))
    client.complete_member("work", b.msg_id, result={"ok": True})
    first, second = client.barrier_results(bid)
    assert isinstance(first.result, Undecodable) and second.result == {"ok": True}
    [failure] = client.barrier_failures(bid)
    assert isinstance(failure.result, Undecodable)
    wid = client.start_workflow("w", [Step("s", "work", 1)])
    [step_msg] = client.read("work", vt=30, qty=5)
    sql.execute(
        "SELECT pgqueue.complete_member('work', %s, 'succeeded', %s::jsonb)",
        (step_msg.msg_id, DEEP),
    )
    [result] = client.step_results(wid, "s")
    assert isinstance(result.result, Undecodable)
