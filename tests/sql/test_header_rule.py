"""The one header rule: pgqueue writes only `_pg_` keys, no caller can, handlers trust only those.

Every test here that plays a hostile producer logs in as a real
`pgqueue_producer` role. The rule's argument is in sql/schema/queue.sql ("The
one header rule") and docs/security.md ("What a handler may trust").
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.roles import as_user

from pgqueue import Client, Message
from pgqueue._migrate import _apply_next, available, migrate
from pgqueue._pgmq import install
from pgqueue._roles import CONSUMER, PRODUCER
from pgqueue.types import CALLBACK, MEMBER, STEP, TRANSPORT_MARKER

# Every function of either schema whose source names a reserved key, and why
# it may. A function that writes headers any other way fails the test below.
NAMES_A_RESERVED_KEY = {
    # the rule's writers
    "pgqueue._trace_headers": "writes _pg_traceparent and _pg_tracestate",
    "pgqueue._member_headers": "writes _pg_member and _pg_step",
    "pgqueue._callback_headers": "writes _pg_transport and _pg_callback",
    # the rule's checks of a caller's headers
    "pgqueue._headers_problem": "finds a caller's key that starts with _pg_",
    "pgqueue.send": "the fast path's check for a _pg_ key (then _require_headers)",
    # reads of what the writers wrote
    "pgqueue._insert_members": "reads back the index _member_headers wrote",
}

RESERVED_KEY = re.compile(r"""['"]_pg_""")


def function_sources(conn: psycopg.Connection[Any]) -> dict[str, str]:
    rows = conn.execute(
        "SELECT n.nspname || '.' || p.proname, p.prosrc FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname IN ('pgqueue', 'pgmq')"
    ).fetchall()
    found: dict[str, str] = {}
    for name, src in rows:
        found[name] = found.get(name, "") + src
    return found


def test_only_the_header_rules_functions_name_a_reserved_key(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)  # the pgmq facade's functions too
        sources = function_sources(conn)
    assert any(name.startswith("pgmq.") for name in sources)
    naming = {name for name, src in sources.items() if RESERVED_KEY.search(src)}
    assert naming == set(NAMES_A_RESERVED_KEY), (
        "a function names a _pg_ key outside the header rule; make its headers with"
        " _member_headers or _callback_headers (sql/schema/queue.sql)"
    )


@pytest.fixture
def producer(make_login: Callable[..., str], dsn: str) -> Client:
    role = make_login("producer", PRODUCER)
    return Client.from_dsn(as_user(dsn, role), max_size=2)


@pytest.fixture
def consumer(make_login: Callable[..., str], dsn: str) -> Client:
    role = make_login("consumer", CONSUMER)
    return Client.from_dsn(as_user(dsn, role), max_size=2)


def live(sql: psycopg.Connection[Any], queue: str) -> list[Message]:
    """Every live message of a queue, as a handler would get it (nothing leased)."""
    rows = sql.execute(
        "SELECT m.msg_id, m.read_ct, m.enqueued_at, m.vt, m.message, m.headers"
        " FROM pgqueue.message m JOIN pgqueue.queue q USING (queue_id)"
        " WHERE q.queue_name = %s ORDER BY m.msg_id",
        (queue,),
    ).fetchall()
    return [Message(queue, *r) for r in rows]


def test_a_workflow_started_with_a_victims_callback_headers_passes_for_nothing_of_it(
    client: Client, producer: Client, sql: Any
) -> None:
    """The review's attack: a stepless workflow ends at once and calls back into the victim's
    queue with the victim's barrier's id and counts in its headers."""
    for q in ("work", "album_done"):
        client.create_queue(q)
    victim = client.fan_out("work", [1, 2, 3], callback_queue="album_done", callback_message={})
    forged = {"barrier_id": victim, "total": 3, "succeeded": 3, "failed": 0, "state": "succeeded"}
    producer.start_workflow("evil", [], callback_queue="album_done", headers=forged)
    [msg] = live(sql, "album_done")
    assert msg.is_callback  # a real callback: of the workflow the producer started
    assert msg.barrier_id is None and msg.member_index is None
    assert msg.callback is not None
    assert (msg.callback.kind, msg.callback.workflow_id, msg.callback.barrier_id) == (
        "workflow",
        "evil",
        None,
    )
    assert msg.workflow_id == "evil" and msg.step is None
    assert msg.caller_headers == forged  # the producer's, as sent: a handler trusts none of it
    assert client.barrier_status(victim).remaining == 3


def test_a_fan_out_with_a_workflows_callback_headers_passes_for_no_workflow(
    client: Client, producer: Client, sql: Any
) -> None:
    for q in ("work", "done"):
        client.create_queue(q)
    forged = {"workflow_id": "nightly", "step": "charge", "steps": {"charge": "succeeded"}}
    bid = producer.fan_out("work", [], callback_queue="done", callback_message={}, headers=forged)
    [msg] = live(sql, "done")
    assert msg.is_callback and msg.callback is not None and msg.callback.kind == "barrier"
    assert msg.workflow_id is None and msg.step is None and msg.barrier_id == bid
    assert msg.callback.steps is None


def test_a_plain_message_with_every_plain_key_identifies_nothing(
    client: Client, producer: Client, sql: Any
) -> None:
    client.create_queue("work")
    forged = {
        "barrier_id": "b",
        "member_index": 0,
        "workflow_id": "w",
        "step": "s",
        "kind": "barrier",
        "state": "succeeded",
        "transport": True,
    }
    producer.send("work", {}, headers=forged)
    producer.send_batch("work", [{}], headers=[forged])
    producer.send_keyed("work", {}, dedupe_key="k", headers=forged)
    msgs = live(sql, "work")
    assert len(msgs) == 3
    for m in msgs:
        assert not m.is_callback and m.callback is None
        assert (m.barrier_id, m.member_index, m.workflow_id, m.step) == (None, None, None, None)
        assert m.caller_headers == forged == m.headers


def test_a_step_message_is_told_apart_by_what_only_pgqueue_writes(
    client: Client, producer: Client, sql: Any
) -> None:
    from pgqueue import Step

    client.create_queue("steps")
    producer.start_workflow("w1", [Step("charge", "steps", {"n": 1}, headers={"step": "other"})])
    [msg] = live(sql, "steps")
    assert (msg.workflow_id, msg.step) == ("w1", "charge")
    assert msg.headers is not None
    assert msg.headers[STEP] == {"workflow_id": "w1", "step": "charge"}
    assert msg.headers[MEMBER]["index"] == 0 and msg.member_index == 0
    assert msg.caller_headers == {"step": "other"}  # the step's own headers, as given


# Every entry a producer (or anyone) can make a message through, as SQL, with
# headers that carry {"%s": ...}: each must refuse a reserved key and send nothing.
ENTRIES = {
    "send": "SELECT pgqueue.send('work', '{}', %(h)s::jsonb)",
    "send_keyed": "SELECT pgqueue.send_keyed('work', '{}', 'k', %(h)s::jsonb)",
    "send_batch": "SELECT pgqueue.send_batch('work', ARRAY['{}'::jsonb], ARRAY[%(h)s::jsonb])",
    "fan_out": (
        "SELECT pgqueue.fan_out('work', ARRAY['{}'::jsonb], 'work', '{}', headers => %(h)s::jsonb)"
    ),
    "open_barrier": "SELECT pgqueue.open_barrier('work', 'work', '{}', headers => %(h)s::jsonb)",
    "start_workflow": "SELECT pgqueue.start_workflow('w', '[]', 'work', '{}', %(h)s::jsonb)",
    "a step's headers": (
        "SELECT pgqueue.start_workflow('w', jsonb_build_array(jsonb_build_object("
        "'step', 's', 'queue', 'work', 'message', '{}'::jsonb, 'headers', %(h)s::jsonb)))"
    ),
    "pgmq.send": "SELECT pgmq.send('work', '{}', %(h)s::jsonb)",
    "pgmq.send_batch": "SELECT pgmq.send_batch('work', ARRAY['{}'::jsonb], ARRAY[%(h)s::jsonb])",
    "pgmq.send_topic": "SELECT pgmq.send_topic('work.x', '{}', %(h)s::jsonb, 0)",
    "pgmq.send_topic, routed nowhere": "SELECT pgmq.send_topic('none.x', '{}', %(h)s::jsonb, 0)",
    "pgmq.send_batch_topic, routed nowhere": (
        "SELECT * FROM pgmq.send_batch_topic('none.x', ARRAY['{}'::jsonb], ARRAY[%(h)s::jsonb], 0)"
    ),
}


@pytest.mark.parametrize("key", [TRANSPORT_MARKER, CALLBACK, MEMBER, STEP, "_pg_anything"])
def test_every_entry_refuses_a_reserved_key_and_sends_nothing(
    dsn: str, make_login: Callable[..., str], key: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        install(owner)
        owner.execute("SELECT pgqueue.create_queue('work')")
        owner.execute("SELECT pgmq.bind_topic('work.*', 'work')")
    role = make_login("producer", PRODUCER)
    headers = json.dumps({key: {"kind": "barrier", "barrier_id": "victim"}, "ok": 1})
    with psycopg.connect(as_user(dsn, role), autocommit=True) as conn:
        for what, statement in ENTRIES.items():
            with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
                conn.execute(statement, {"h": headers})
            assert f'header "{key}" is reserved' in str(err.value), what
    with psycopg.connect(dsn, autocommit=True) as owner:
        assert owner.execute("SELECT count(*) FROM pgqueue.message").fetchone() == (0,)
        assert owner.execute("SELECT count(*) FROM pgqueue.barrier").fetchone() == (0,)
        assert owner.execute("SELECT count(*) FROM pgqueue.workflow").fetchone() == (0,)


def test_messages_made_before_the_rule_are_rewritten_where_pgqueues_rows_say_what_they_are(
    empty_dsn: str,
) -> None:
    """0028 moves pgqueue's keys of live and poisoned messages under the new names."""
    before = [m for m in available() if m.version < 28]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        while _apply_next(conn, before, {}) is not None:
            pass
        for q in ("work", "cb", "steps"):
            conn.execute("SELECT pgqueue.create_queue(%s)", (q,))
        conn.execute(
            "SELECT pgqueue.fan_out('work', ARRAY['1','2']::jsonb[], 'cb', '{}', 'fired',"
            ' headers => \'{"tenant": "t"}\')'
        )
        conn.execute("SELECT pgqueue.fan_out('work', ARRAY['3']::jsonb[], 'cb', '{}', 'open')")
        (first,) = conn.execute(
            "SELECT msg_id FROM pgqueue.barrier_member WHERE barrier_id = 'fired'"
            " AND member_index = 0"
        ).fetchone()
        conn.execute("SELECT pgqueue.delete('work', %s)", (first,))
        conn.execute(
            "SELECT pgqueue.poison('work', msg_id, 'bad') FROM pgqueue.barrier_member"
            " WHERE barrier_id = 'fired' AND member_index = 1"
        )
        conn.execute(
            'SELECT pgqueue.start_workflow(\'wf\', \'[{"step": "a", "queue": "steps",'
            " \"message\": 1}]', 'cb', '{}', '{\"app\": 1}')"
        )
        conn.execute("SELECT pgqueue.start_workflow('empty', '[]', 'cb', '{}', '{\"app\": 2}')")
        plain = conn.execute(
            'SELECT pgqueue.send(\'work\', \'{}\', \'{"barrier_id": "fired", "state": "x"}\')'
        ).fetchone()
        migrate(conn)

        def headers(table: str, queue: str) -> list[dict[str, Any]]:
            return [
                r[0]
                for r in conn.execute(
                    f"SELECT headers FROM pgqueue.{table} t JOIN pgqueue.queue q USING (queue_id)"
                    " WHERE q.queue_name = %s ORDER BY msg_id",
                    (queue,),
                )
            ]

        [poisoned] = headers("poison", "work")
        assert poisoned == {"tenant": "t", MEMBER: {"barrier_id": "fired", "index": 1}}
        [open_member, plain_msg] = headers("message", "work")
        assert open_member == {MEMBER: {"barrier_id": "open", "index": 0}}
        assert plain_msg == {"barrier_id": "fired", "state": "x"}  # its producer's: untouched
        [step] = headers("message", "steps")
        assert step == {
            MEMBER: {"barrier_id": step[MEMBER]["barrier_id"], "index": 0},
            STEP: {"workflow_id": "wf", "step": "a"},
        }
        [barrier_cb, workflow_cb] = headers("message", "cb")
        assert barrier_cb == {
            "tenant": "t",
            TRANSPORT_MARKER: True,
            CALLBACK: {
                "kind": "barrier",
                "barrier_id": "fired",
                "state": "failed",
                "total": 2,
                "succeeded": 1,
                "failed": 1,
                "cancelled": 0,
                "outcomes": {"succeeded": 1, "poisoned": 1},
            },
        }
        assert workflow_cb == {
            "app": 2,
            TRANSPORT_MARKER: True,
            CALLBACK: {
                "kind": "workflow",
                "workflow_id": "empty",
                "state": "succeeded",
                "steps": {},
            },
        }
        assert plain is not None
