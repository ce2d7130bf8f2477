"""The least-privilege roles (sql/0007_roles.sql), with real login roles on the real server.

Every test logs in as roles of its own (`pgq_t_<id>_<what>`, members of the
group roles) over a real connection, never SET ROLE, and drops them afterwards:
roles are cluster-wide. Each refused call asserts the exact error it gets.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict
from support.db import blocks_another, create_database, drop_database, wait_until, with_dbname
from support.roles import as_user, drop_roles

import pgqueue
from pgqueue import (
    AsyncClient,
    Client,
    InvalidArgument,
    MigrationError,
    Poison,
    Step,
    Worker,
    WorkerSettings,
)
from pgqueue._calls import Call, scalar
from pgqueue._calls import single_flight as claims_calls
from pgqueue._calls import workers as workers_calls
from pgqueue._calls.barrier import barrier_links
from pgqueue._calls.guard import guard_call
from pgqueue._cli import main
from pgqueue._errors import PermissionDenied
from pgqueue._migrate import available, current_version, migrate
from pgqueue._roles import CONSUMER, FUNCTION_ROLES, GROUP_ROLES, OPERATOR, PRODUCER

LATEST = available()[-1].version

# A worker's heartbeat on queue jobs: 2 acks.
HEARTBEAT = workers_calls.worker_heartbeat(
    uuid.uuid4(), "host", 1, ["jobs"], 1, 0, False, {"jobs": (2, 0, 0)}
)


@pytest.fixture
def producer(make_login: Callable[..., str], connect_as: Callable[[str], Client]) -> Client:
    return connect_as(make_login("producer", PRODUCER))


@pytest.fixture
def consumer(make_login: Callable[..., str], connect_as: Callable[[str], Client]) -> Client:
    return connect_as(make_login("consumer", CONSUMER))


@pytest.fixture
def operator(make_login: Callable[..., str], connect_as: Callable[[str], Client]) -> Client:
    return connect_as(make_login("operator", OPERATOR))


def login_of(client: Client) -> str:
    with client.connection() as conn:
        return str(conn.info.user)


def refused(call: Callable[[], Any], function: str, login: str, grant: str | None) -> str:
    """The call raises PermissionDenied for pgqueue.`function`, naming the login and the grant."""
    with pytest.raises(PermissionDenied) as info:
        call()
    text = str(info.value)
    assert text.startswith(f"permission denied for function {function}: "), text
    if grant is None:
        assert f"pgqueue.{function} is internal to pgqueue" in text, text
    else:
        assert f"role {login} may not call pgqueue.{function}" in text, text
        assert f"GRANT {grant} TO {login};" in text, text
    assert "docs/security.md" in text and "\n" not in text
    return text


def seeded(client: Client) -> dict[str, Any]:
    """As the owner: queues jobs and done, a live message, a poison message, a barrier, a claim."""
    client.create_queue("jobs", max_attempts=1)
    client.create_queue("done")
    live = client.send("jobs", {"n": 1})
    doomed = client.send("jobs", {"n": 2})
    client.poison("jobs", doomed, "bad")
    barrier = client.fan_out("jobs", [{"m": 0}], callback_queue="done", callback_message={})
    assert client.run(claims_calls.claim("key", "owner", 30))
    return {"live": live, "poisoned": doomed, "barrier": barrier}


# -- what each role may not do -------------------------------------------------

# (function the call needs, the call); every one of them changes or reveals
# messages, queues or the poison table.
NOT_FOR_PRODUCERS: list[tuple[str, Callable[[Client, dict[str, Any]], Any]]] = [
    ("read", lambda c, s: c.read("jobs", vt=30, qty=1)),
    ("read_with_poll", lambda c, s: c.read_with_poll("jobs", max_poll_seconds=0)),
    ("pop", lambda c, s: c.pop("jobs")),
    ("delete", lambda c, s: c.delete("jobs", s["live"])),
    ("delete", lambda c, s: c.delete_many("jobs", [s["live"]])),
    ("archive", lambda c, s: c.archive("jobs", s["live"])),
    ("archive", lambda c, s: c.archive_many("jobs", [s["live"]])),
    ("set_vt", lambda c, s: c.set_vt("jobs", s["live"], 0)),
    ("set_vt", lambda c, s: c.set_vt("jobs", s["live"], 0, error="x")),
    ("poison", lambda c, s: c.poison("jobs", s["live"], "mine")),
    ("complete_members", lambda c, s: c.complete_member("jobs", s["live"])),
    ("peek", lambda c, s: c.peek("jobs")),
    ("metrics", lambda c, s: c.metrics("jobs")),
    ("metrics_all", lambda c, s: c.metrics_all()),
    ("list_queues", lambda c, s: c.list_queues()),
    ("create_queue", lambda c, s: c.create_queue("other")),
    ("purge_queue", lambda c, s: c.purge_queue("jobs")),
    ("purge_queue_chunk", lambda c, s: c.purge_queue_chunk("jobs", up_to_msg_id=10**6)),
    ("drop_queue", lambda c, s: c.drop_queue("jobs")),
    ("poison_list", lambda c, s: c.poison_list("jobs")),
    ("poison_get", lambda c, s: c.poison_get("jobs", s["poisoned"])),
    ("poison_requeue", lambda c, s: c.poison_requeue("jobs", [s["poisoned"]])),
    ("poison_purge", lambda c, s: c.poison_purge("jobs")),
    ("barrier_status", lambda c, s: c.barrier_status(s["barrier"])),
    ("barrier_results", lambda c, s: c.barrier_results(s["barrier"])),
    ("list_barriers", lambda c, s: c.list_barriers()),
    ("expire_barriers", lambda c, s: c.expire_barriers()),
    ("list_claims", lambda c, s: c.list_claims()),
    ("purge_claims", lambda c, s: c.purge_claims(older_than_seconds=0)),
    ("claim", lambda c, s: c.run(claims_calls.claim("key", "thief", 30))),
    ("guard", lambda c, s: c.run(guard_call("g"))),
    ("pause_queue", lambda c, s: c.pause_queue("jobs")),
    ("resume_queue", lambda c, s: c.resume_queue("jobs")),
    ("list_workers", lambda c, s: c.list_workers()),
    ("queue_rates", lambda c, s: c.queue_rates()),
    ("sample_rates", lambda c, s: c.sample_rates()),
    ("worker_heartbeat", lambda c, s: c.run(HEARTBEAT)),
    ("worker_deregister", lambda c, s: c.run(workers_calls.worker_deregister(uuid.uuid4()))),
]


def test_producer_cannot_read_ack_purge_drop_or_repair(client: Client, producer: Client) -> None:
    state = seeded(client)
    login = login_of(producer)
    for function, call in NOT_FOR_PRODUCERS:
        grant = FUNCTION_ROLES[function][0]
        refused(partial(call, producer, state), function, login, grant)
    # nothing changed: the live message is still unread, the poison row still there
    live, member = client.peek("jobs")
    assert (live.msg_id, live.read_ct, member.read_ct) == (state["live"], 0, 0)
    assert [p.msg_id for p in client.poison_list("jobs")] == [state["poisoned"]]
    assert client.list_claims()[0].owner == "owner"


def test_producer_cannot_touch_tables_sequences_or_internal_functions(
    dsn: str, client: Client, producer: Client
) -> None:
    seeded(client)
    login = login_of(producer)
    with psycopg.connect(dsn) as admin:
        tables = [
            r[0]
            for r in admin.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'pgqueue' ORDER BY 1"
            )
        ]
        sequences = [
            r[0]
            for r in admin.execute(
                "SELECT sequencename FROM pg_sequences WHERE schemaname = 'pgqueue' ORDER BY 1"
            )
        ]
        internal = [
            r[0]
            for r in admin.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc p"
                " WHERE p.pronamespace = 'pgqueue'::regnamespace"
                "   AND (p.proname LIKE '\\_%' OR p.proname = 'grant_roles') ORDER BY 1"
            )
        ]
    assert {"message", "poison", "archive", "queue", "barrier", "claim"} <= set(tables)
    assert any(s.startswith("lane_") for s in sequences)  # the per-queue ones too
    with psycopg.connect(as_user(dsn, login), autocommit=True) as conn:

        def denied(statement: str, what: str) -> None:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
                conn.execute(statement)
            assert re.fullmatch(what, info.value.diag.message_primary or ""), str(info.value)

        for t in tables:
            if t != "schema_version":  # the version check at startup reads it
                denied(f"SELECT * FROM pgqueue.{t}", f"permission denied for table {t}")
            denied(f"DELETE FROM pgqueue.{t}", f"permission denied for table {t}")
            denied(
                f"UPDATE pgqueue.{t} SET {_first_column(dsn, t)} = NULL",
                f"permission denied for table {t}",
            )
            denied(f"TRUNCATE pgqueue.{t}", f"permission denied for table {t}")
        for s in sequences:
            denied(f"SELECT nextval('pgqueue.{s}')", f"permission denied for sequence {s}")
            denied(f"SELECT setval('pgqueue.{s}', 1)", f"permission denied for sequence {s}")
        for signature in internal:
            has = conn.execute("SELECT has_function_privilege(%s, 'EXECUTE')", (signature,))
            assert has.fetchone() == (False,), signature
        denied("SELECT pgqueue._ts_us(now())", "permission denied for function _ts_us")
        denied(
            "SELECT * FROM pgqueue._queue('jobs'::text)", "permission denied for function _queue"
        )
        denied("SELECT pgqueue.grant_roles()", "permission denied for function grant_roles")
        denied("CREATE TABLE pgqueue.mine (x int)", "permission denied for schema pgqueue")
    # and through the client the error says what it is
    helper = Call("helper", "SELECT pgqueue._ts_us(now())", (), scalar)
    refused(lambda: producer.run(helper), "_ts_us", login, None)


def _first_column(dsn: str, table: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum = 1",
            (f"pgqueue.{table}",),
        ).fetchone()
    assert row is not None
    return str(row[0])


NOT_FOR_CONSUMERS: list[tuple[str, Callable[[Client, dict[str, Any]], Any]]] = [
    ("create_queue", lambda c, s: c.create_queue("other")),
    ("purge_queue", lambda c, s: c.purge_queue("jobs")),
    ("purge_queue_chunk", lambda c, s: c.purge_queue_chunk("jobs", up_to_msg_id=10**6)),
    ("drop_queue", lambda c, s: c.drop_queue("jobs")),
    ("peek", lambda c, s: c.peek("jobs")),
    ("poison_list", lambda c, s: c.poison_list("jobs")),
    ("poison_get", lambda c, s: c.poison_get("jobs", s["poisoned"])),
    ("poison_count", lambda c, s: c.poison_count("jobs")),
    ("poison_ids", lambda c, s: c.poison_ids("jobs")),
    ("poison_requeue", lambda c, s: c.poison_requeue("jobs", [s["poisoned"]])),
    ("poison_purge", lambda c, s: c.poison_purge("jobs")),
    ("poison_purge", lambda c, s: c.poison_purge("jobs", [s["poisoned"]])),
    ("list_barriers", lambda c, s: c.list_barriers()),
    ("barrier_failures", lambda c, s: c.barrier_failures(s["barrier"])),
    ("list_claims", lambda c, s: c.list_claims()),
    ("purge_claims", lambda c, s: c.purge_claims(older_than_seconds=0)),
    ("pause_queue", lambda c, s: c.pause_queue("jobs")),
    ("resume_queue", lambda c, s: c.resume_queue("jobs")),
    ("list_workers", lambda c, s: c.list_workers()),
    ("queue_rates", lambda c, s: c.queue_rates()),
]


def test_consumer_cannot_purge_drop_or_repair_the_poison_table(
    client: Client, consumer: Client
) -> None:
    state = seeded(client)
    login = login_of(consumer)
    for function, call in NOT_FOR_CONSUMERS:
        refused(partial(call, consumer, state), function, login, OPERATOR)
    assert client.metrics("jobs").queue_length == 2  # the live message and the member
    assert [p.msg_id for p in client.poison_list("jobs")] == [state["poisoned"]]


def test_operator_cannot_read_ack_or_complete(client: Client, operator: Client) -> None:
    state = seeded(client)
    login = login_of(operator)
    refused(lambda: operator.read("jobs"), "read", login, CONSUMER)
    refused(lambda: operator.pop("jobs"), "pop", login, CONSUMER)
    refused(lambda: operator.delete("jobs", state["live"]), "delete", login, CONSUMER)
    refused(lambda: operator.complete_member("jobs", 1), "complete_members", login, CONSUMER)
    refused(lambda: operator.poison("jobs", state["live"], "x"), "poison", login, CONSUMER)
    refused(lambda: operator.run(HEARTBEAT), "worker_heartbeat", login, CONSUMER)
    assert client.peek("jobs")[0].read_ct == 0


def test_role_in_no_group_can_do_nothing(
    dsn: str, client: Client, make_login: Callable[..., str], connect_as: Callable[[str], Client]
) -> None:
    seeded(client)
    login = make_login("nobody")
    nobody = connect_as(login)
    for call in (
        lambda: nobody.send("jobs", 1),
        lambda: nobody.read("jobs"),
        lambda: nobody.list_queues(),
        lambda: nobody.poison_list(),
    ):
        with pytest.raises(PermissionDenied) as info:
            call()
        assert str(info.value) == (
            f"permission denied for schema pgqueue: role {login} is in none of pgqueue's roles;"
            f" grant it the one it needs ({', '.join(GROUP_ROLES)}),"
            f" e.g. GRANT pgqueue_consumer TO {login}; (see docs/security.md)"
        )
    with psycopg.connect(as_user(dsn, login)) as conn, pytest.raises(PermissionDenied):
        current_version(conn)
    result = cli(as_user(dsn, login), "queue", "list")
    assert one_line_error(result).startswith(
        "pgqueue: error: permission denied for schema pgqueue: role"
    )
    assert client.metrics("jobs").queue_length == 2


# -- what each role does ------------------------------------------------------


def test_producer_sends_batches_fans_out_and_dedupes(client: Client, producer: Client) -> None:
    client.create_queue("jobs")
    client.create_queue("done")
    first = producer.send("jobs", {"n": 1}, headers={"h": 1}, delay=0)
    keyed = producer.send("jobs", {"n": 2}, dedupe_key="root:A")
    assert producer.send("jobs", {"n": 3}, dedupe_key="root:A") == keyed  # single flight
    batch = producer.send_batch("jobs", [{"n": i} for i in range(5)])
    barrier = producer.fan_out(
        "jobs", [{"m": i} for i in range(3)], callback_queue="done", callback_message={"ok": 1}
    )
    # a retried fan_out (same id) finds the first one and sends nothing twice
    again = producer.fan_out(
        "jobs",
        [{"m": i} for i in range(3)],
        callback_queue="done",
        callback_message={"ok": 1},
        barrier_id=barrier,
    )
    assert again == barrier
    with producer.connection() as conn, conn.transaction():  # transactional enqueue
        producer.send("jobs", {"n": 9}, conn=conn)
    delayed = producer.send("jobs", {"n": 10}, delay=60)
    ids = [m.msg_id for m in client.peek("jobs", qty=100)]
    assert ids[:7] == [first, keyed, *batch] and delayed == ids[-1] and len(ids) == 12
    assert client.barrier_status(barrier).total == 3

    async def send_async() -> int:
        async with await AsyncClient.from_dsn(str(producer.pool.conninfo)) as aio:
            return await aio.send("jobs", {"async": True})

    assert asyncio.run(send_async()) > delayed


def test_consumer_reads_acks_nacks_completes_poisons_guards_and_claims(
    client: Client, producer: Client, consumer: Client
) -> None:
    client.create_queue("jobs", max_attempts=5)
    client.create_queue("done")
    a, b, c, d, e = producer.send_batch("jobs", [{"n": i} for i in range(5)])
    got = consumer.read("jobs", vt=30, qty=5)
    assert [m.msg_id for m in got] == [a, b, c, d, e]
    assert consumer.delete("jobs", a) is True and consumer.delete("jobs", a) is False
    assert consumer.delete_many("jobs", [b]) == [b]
    assert consumer.archive("jobs", c) is True
    nacked = consumer.set_vt("jobs", d, 0, error="ValueError: later")
    assert nacked is not None and nacked.msg_id == d
    assert consumer.poison("jobs", e, "cannot decode") is True
    assert [m.msg_id for m in consumer.read_with_poll("jobs", max_poll_seconds=1)] == [d]
    assert consumer.archive_many("jobs", [d]) == [d]
    assert consumer.pop("jobs") == []
    assert consumer.list_queues()[0].queue_name == "done"
    assert consumer.metrics("jobs").poison_length == 1

    barrier = producer.fan_out(
        "jobs", [{"m": 0}, {"m": 1}], callback_queue="done", callback_message={"album": 1}
    )
    m0, m1 = consumer.read("jobs", vt=30, qty=2)
    assert consumer.complete_member("jobs", m0.msg_id, result={"r": 0}) is not None
    [status] = consumer.complete_members("jobs", [m1.msg_id], outcomes=["failed"])
    assert status.state == "fired" and (status.succeeded, status.failed) == (1, 1)
    assert consumer.barrier_status(barrier).state == "fired"
    assert [r.outcome for r in consumer.barrier_results(barrier)] == ["succeeded", "failed"]
    [callback] = consumer.read("done", vt=30, qty=1)
    assert callback.is_callback
    with consumer.connection() as conn, conn.transaction():
        assert pgqueue.guard(conn, f"album:{barrier}") is True
    with consumer.connection() as conn, conn.transaction():
        assert pgqueue.guard(conn, f"album:{barrier}") is False
    assert consumer.expire_barriers() == 0

    with consumer.claim("orchestrate:A", lease_seconds=30) as held:
        assert held.acquired
        held.finish()
    with consumer.claim("orchestrate:A") as late:
        assert not late.acquired  # the tombstone
    assert consumer.run(claims_calls.renew("k", "me", 30)) is False
    assert consumer.run(claims_calls.release("k", "me")) is False


def test_consumer_waits_on_listen_and_wakes_on_a_send(
    client: Client, producer: Client, consumer: Client
) -> None:
    client.create_queue("jobs")
    threading.Timer(0.5, lambda: producer.send("jobs", {"wake": True})).start()
    started = time.monotonic()
    got = consumer.read_or_wait("jobs", vt=30, qty=1, max_wait_seconds=300)
    assert [m.message for m in got] == [{"wake": True}]
    # woken by the send (0.5 s), not its 300 s wait: a bound far above what load adds
    assert time.monotonic() - started < 60


def test_operator_pauses_and_watches_workers_and_rates_that_consumers_report(
    client: Client, operator: Client, consumer: Client
) -> None:
    client.create_queue("jobs")
    assert operator.pause_queue("jobs", actor="ops") is True
    assert consumer.read("jobs") == []  # paused: a NOTICE, no error
    assert consumer.run(HEARTBEAT) == {"jobs": True}
    consumer.send("jobs", {"n": 1})
    assert operator.resume_queue("jobs") is True
    assert [m.message for m in consumer.read("jobs")] == [{"n": 1}]
    assert consumer.sample_rates() >= 0 and operator.sample_rates() >= 0
    assert [w.worker_id for w in operator.list_workers()] == [HEARTBEAT.params[0]]
    rates = operator.queue_rates(["jobs"], minutes=2)
    assert sum(r.acked for r in rates) == 2 and {r.queue_name for r in rates} == {"jobs"}
    assert consumer.run(workers_calls.worker_deregister(HEARTBEAT.params[0])) is True
    assert operator.list_workers() == []


def test_consumer_worker_runs_a_fan_out_to_its_callback(
    dsn: str, client: Client, producer: Client, consumer: Client
) -> None:
    client.create_queue("resize", max_attempts=3)
    client.create_queue("album_done")
    login = login_of(consumer)
    called: list[tuple[dict[str, Any], bool]] = []
    app = pgqueue.App()

    @app.handler("resize")
    def resize(msg: pgqueue.Message) -> dict[str, Any]:
        if msg.message.get("corrupt"):
            raise Poison("image cannot be decoded")
        if msg.read_ct == 1 and msg.member_index == 1:
            raise RuntimeError("flaky")  # nacked with set_vt, then retried
        return {"ok": msg.member_index}

    @app.handler("album_done", transactional=True)
    def album_done(msg: pgqueue.Message, conn: psycopg.Connection[Any]) -> None:
        called.append((msg.callback, pgqueue.guard(conn, f"album:{msg.barrier_id}")))

    barrier = producer.fan_out(
        "resize",
        [{"photo": 0}, {"photo": 1}, {"corrupt": True}, {"photo": 3}],
        callback_queue="album_done",
        callback_message={"album": 7},
    )
    wclient = Client.from_dsn(as_user(dsn, login), max_size=8)
    settings = WorkerSettings(
        poll_interval=0.2, vt=5, backoff_base=0.01, backoff_max=0.01, sweep_interval=0.2
    )
    worker = Worker(app, wclient, settings)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(called) == 1)
        wait_until(lambda: client.metrics("album_done").queue_length == 0)
    finally:
        worker.stop()
        thread.join(15)
        wclient.close()
    assert not thread.is_alive()
    [(cb, first)] = called
    assert first is True and cb is not None and cb.barrier_id == barrier
    assert (cb.succeeded, cb.failed, cb.state) == (3, 1, "failed")
    outcomes = [r.outcome for r in client.barrier_results(barrier)]
    assert outcomes == ["succeeded", "succeeded", "poisoned", "succeeded"]
    assert client.metrics("resize").queue_length == 0
    [poisoned] = client.poison_list("resize")
    assert poisoned.reason == "image cannot be decoded"
    with psycopg.connect(dsn) as admin:
        ledger = admin.execute("SELECT key FROM pgqueue.idempotency").fetchall()
    assert ledger == [(f"album:{barrier}",)]


def test_a_worker_whose_role_may_not_read_refuses_to_start(
    dsn: str, client: Client, operator: Client
) -> None:
    client.create_queue("jobs")
    app = pgqueue.App()
    app.handler("jobs")(lambda msg: None)
    worker = Worker(app, operator, WorkerSettings(poll_interval=0.2))
    login = login_of(operator)
    # the operator may list the queues (the first check), not read them
    refused(lambda: worker.run(install_signals=False), "read", login, CONSUMER)


# -- the operator and the command line ------------------------------------------


def cli(dsn: str, *args: str, input: str | None = None) -> Result:
    """Run `pgqueue ARGS --dsn DSN` in-process."""
    return CliRunner().invoke(main, [*args, "--dsn", dsn], input=input)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def one_line_error(result: Result) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_operator_runs_the_command_line(
    dsn: str, client: Client, make_login: Callable[..., str], consumer: Client
) -> None:
    op = as_user(dsn, make_login("operator", OPERATOR))
    ok(cli(op, "queue", "create", "jobs", "done", "--max-attempts", "1"))
    assert "jobs" in ok(cli(op, "queue", "list", "--json"))
    assert json.loads(ok(cli(op, "send", "jobs", '{"n": 1}', "--json")))["msg_ids"] == [1]
    ok(cli(op, "send", "jobs", input='{"n": 2}\n{"n": 3}\n'))
    ok(cli(op, "send", "jobs", '{"n": 4}', "--dedupe-key", "k"))
    assert [m["msg_id"] for m in json.loads(ok(cli(op, "peek", "jobs", "--json")))] == [1, 2, 3, 4]
    [m] = json.loads(ok(cli(op, "metrics", "jobs", "--json")))
    assert m["queue_length"] == 4
    ok(cli(op, "metrics"))
    # the consumer reads everything once (max_attempts 1): the next read poisons it
    assert len(consumer.read("jobs", vt=0, qty=10)) == 4
    assert consumer.read("jobs", vt=0, qty=10) == []
    assert "max_attempts exceeded" in ok(cli(op, "poison", "list", "jobs"))
    ok(cli(op, "poison", "list", "--since", "1h", "--reason", "max", "--json"))
    assert json.loads(ok(cli(op, "poison", "show", "jobs", "1", "--json")))["msg_id"] == 1
    assert "requeued 1 message" in ok(cli(op, "poison", "requeue", "jobs", "1", "--yes"))
    assert "requeued 1 message" in ok(cli(op, "poison", "requeue", "jobs", "2", "--yes"))
    assert "purged 2 poison messages" in ok(cli(op, "poison", "purge", "jobs", "--all", "--yes"))
    barrier = client.fan_out(
        "jobs", [{"m": 0}], callback_queue="done", callback_message={}, deadline_seconds=0
    )
    listed = json.loads(ok(cli(op, "barrier", "list", "--json")))
    assert [(b["barrier_id"], b["state"]) for b in listed] == [(barrier, "open")]
    assert ok(cli(op, "barrier", "expire")) == "expired 1 barrier\n"
    shown = json.loads(ok(cli(op, "barrier", "show", barrier, "--json")))
    assert [f["outcome"] for f in shown["failures"]] == ["timed_out"]
    assert client.barrier_status(barrier).state == "expired"
    ok(cli(op, "claims", "list", "--json"))
    ok(cli(op, "claims", "purge", "--older-than", "1d", "--yes"))
    ok(cli(op, "queue", "purge", "jobs", "--yes"))
    assert client.metrics("jobs").queue_length == 0
    ok(cli(op, "queue", "drop", "jobs", "--yes"))
    assert [q.queue_name for q in client.list_queues()] == ["done"]
    assert "up to date" in ok(cli(op, "migrate"))


def test_operator_trims_the_archive_and_the_guards(
    dsn: str, client: Client, operator: Client
) -> None:
    client.create_queue("jobs")
    ids = client.send_batch("jobs", [{"n": i} for i in range(5)])
    client.read("jobs", qty=5)
    assert client.archive_many("jobs", ids) == ids
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(
            "UPDATE pgqueue.archive SET archived_at = archived_at - interval '2 days'"
            " WHERE msg_id = ANY(%s)",
            (ids[:3],),
        )
        admin.execute("SELECT pgqueue.guard('old')")
        admin.execute("UPDATE pgqueue.idempotency SET created_at = now() - interval '2 days'")
        chunk = Call("purge_archive", "SELECT pgqueue.purge_archive(86400, 2)", (), scalar)
        assert [operator.run(chunk) for _ in range(3)] == [2, 1, 0]
        guards = Call("purge_guards", "SELECT pgqueue.purge_guards(86400)", (), scalar)
        assert operator.run(guards) == 1
        left = admin.execute("SELECT msg_id FROM pgqueue.archive ORDER BY 1").fetchall()
    assert [r[0] for r in left] == ids[3:]


def test_producer_errors_on_the_command_line_are_one_line(
    dsn: str, client: Client, make_login: Callable[..., str]
) -> None:
    client.create_queue("jobs")
    login = make_login("producer", PRODUCER)
    prod = as_user(dsn, login)
    assert json.loads(ok(cli(prod, "send", "jobs", "1", "--json")))["msg_ids"] == [1]
    line = one_line_error(cli(prod, "queue", "purge", "jobs", "--yes"))
    assert line == (
        f"pgqueue: error: permission denied for function metrics: role {login} may not call"
        f" pgqueue.metrics; grant it one of pgqueue_consumer, pgqueue_operator:"
        f" GRANT pgqueue_consumer TO {login}; (see docs/security.md)"
    )
    line = one_line_error(cli(prod, "poison", "purge", "jobs", "1", "--yes"))
    assert line.startswith("pgqueue: error: permission denied for function poison_purge: ")
    assert f"GRANT pgqueue_operator TO {login};" in line
    assert client.metrics("jobs").queue_length == 1


# -- schema version and migrations ----------------------------------------------


def test_every_role_checks_the_schema_version_but_only_the_owner_migrates(
    dsn: str, make_login: Callable[..., str]
) -> None:
    for group in GROUP_ROLES:
        with psycopg.connect(as_user(dsn, make_login("v", group)), autocommit=True) as conn:
            assert current_version(conn) == LATEST
            assert migrate(conn) == []  # nothing pending: fine to ask
    operator_dsn = as_user(dsn, make_login("operator", OPERATOR))
    with psycopg.connect(dsn, autocommit=True) as admin:  # pretend 0007 is pending
        admin.execute("DELETE FROM pgqueue.schema_version WHERE version = %s", (LATEST,))
    with (
        psycopg.connect(operator_dsn, autocommit=True) as conn,
        pytest.raises(MigrationError) as info,
    ):
        migrate(conn)
    login = conninfo_to_dict(operator_dsn)["user"]
    # the server's own words depend on the pending migration's first statement
    # (a CREATE in the schema, or an ALTER of one of its tables)
    text = str(info.value)
    assert text.startswith(f"role {login} may not change schema pgqueue (")
    denied = r"\((permission denied for schema pgqueue|must be owner of (table|index) \w+)\);"
    assert re.search(denied, text)
    assert text.endswith(
        "; run `pgqueue migrate` as the role that owns the schema, the one that first migrated"
        " this database (see docs/security.md)"
    )
    line = one_line_error(cli(operator_dsn, "migrate"))
    assert line.startswith(f"pgqueue: error: role {login} may not change schema pgqueue")


# -- the layout itself ----------------------------------------------------------


def functions(dsn: str, columns: str, *params: Any) -> list[tuple[Any, ...]]:
    """`columns` of every function in schema pgqueue (pg_proc p, pg_language l)."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            f"SELECT {columns} FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
            " WHERE p.pronamespace = 'pgqueue'::regnamespace",
            params,
        ).fetchall()


def test_python_role_table_matches_the_grants(dsn: str) -> None:
    rows = functions(
        dsn,
        "p.proname, array(SELECT r FROM unnest(%s::text[]) r"
        "                  WHERE has_function_privilege(r, p.oid, 'EXECUTE') ORDER BY r)",
        list(GROUP_ROLES),
    )
    granted: dict[str, set[tuple[str, ...]]] = {}
    for name, roles in rows:
        granted.setdefault(name, set()).add(tuple(roles))
    expected = {name: {tuple(sorted(roles))} for name, roles in FUNCTION_ROLES.items()}
    api = {n: r for n, r in granted.items() if not n.startswith("_") and n != "grant_roles"}
    assert api == expected  # every API function granted, overloads alike, as pgqueue/roles.py says
    internal = {n: r for n, r in granted.items() if n not in api}
    assert internal and all(r == {()} for r in internal.values()), internal


def test_api_functions_run_as_owner_with_a_fixed_path_and_helpers_still_inline(dsn: str) -> None:
    public = functions(dsn, "p.proname, has_function_privilege('public', p.oid, 'EXECUTE')")
    assert [name for name, executable in public if executable] == []
    for name, secdef, config, language in functions(
        dsn, "p.proname, p.prosecdef, p.proconfig, l.lanname"
    ):
        if name in FUNCTION_ROLES:
            assert secdef and "search_path=pg_catalog, pgqueue, pg_temp" in config, name
        elif name != "_oldest_writer":  # definer since 0005, for pg_stat_activity
            assert not secdef, name
            if language == "sql":  # inlined into their callers: no SET clause
                assert config is None, name
    with psycopg.connect(dsn) as conn:
        # not constants: a function kept as a call would show by its name
        plan = conn.execute(
            "EXPLAIN (VERBOSE, COSTS OFF) SELECT pgqueue._ts_us(now() + g * interval '1s'),"
            " pgqueue._us_ts(g), pgqueue._channel(g::text) FROM generate_series(1, 2) g"
        ).fetchall()
    text = "\n".join(r[0] for r in plan)
    assert "_ts_us" not in text and "_us_ts" not in text and "_channel" not in text, text
    assert "CASE" in text


@dataclass
class OwnedDb:
    """A database migrated by `owner`, a role that is no superuser and may not create roles."""

    owner: str
    dsn: str
    roles: list[str] = field(default_factory=list)  # created by the test, dropped after it


@pytest.fixture
def owned_db(server_dsn: str, make_login: Callable[..., str]) -> Iterator[OwnedDb]:
    owner = make_login("owner")
    db = create_database(server_dsn)
    owned = OwnedDb(owner, with_dbname(server_dsn, db))
    try:
        with psycopg.connect(owned.dsn, autocommit=True) as admin:
            admin.execute(
                pgsql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                    pgsql.Identifier(db), pgsql.Identifier(owner)
                )
            )
        yield owned
    finally:
        try:
            drop_roles(server_dsn, [owned.dsn], owned.roles)
        finally:
            drop_database(server_dsn, db)


def rename_groups(dsns: list[str], tag: str) -> list[str]:
    """Point pgqueue.role_grant of each database at new group roles (that do not exist); sorted.

    For tests of role creation that must not touch the real, cluster-wide ones.
    """
    for dsn in dsns:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                "UPDATE pgqueue.role_grant SET roles = array("
                " SELECT replace(r, 'pgqueue_', %s) FROM unnest(roles) r)",
                (f"pgq_t_{tag}_",),
            )
    return sorted(f"pgq_t_{tag}_{g.removeprefix('pgqueue_')}" for g in GROUP_ROLES)


def migrate_noting(dsn: str) -> tuple[list[int], list[tuple[str | None, str | None]]]:
    """Migrate as the DSN's role: the versions applied, and the NOTICEs raised (message, hint)."""
    notices: list[tuple[str | None, str | None]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append((d.message_primary, d.message_hint)))
        versions = [m.version for m in migrate(conn)]
    # each migration that adds API functions repeats grant_roles()'s advice:
    # the latest wording of each message is what pgqueue migrate shows
    latest = {message: hint for message, hint in notices}
    return versions, list(latest.items())


# A safe floor never raised: never set, or set to the bottom by the first read
# on this server (0022).
BOTTOM = ((None,), (1,))


def safe_floor(conn: psycopg.Connection[Any]) -> Any:
    """Where the fresh lane's safe floor of queue 1 stands (BOTTOM: never raised)."""
    return conn.execute("SELECT pg_sequence_last_value('pgqueue.lane_1_safe_f_id')").fetchone()


def test_owner_without_createrole_migrates_and_grants_roles_created_later(
    server_dsn: str, owned_db: OwnedDb, make_login: Callable[..., str]
) -> None:
    owner, db_dsn = owned_db.owner, owned_db.dsn
    owner_dsn = as_user(db_dsn, owner)
    assert migrate_noting(owner_dsn)[0][-1] == LATEST
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        conn.execute("SELECT pgqueue.create_queue('jobs')")
        conn.execute("SELECT pgqueue.send('jobs', '1')")
    # the group roles existed already: a consumer of this database works,
    # and its calls run as the (unprivileged) owner
    with Client.from_dsn(as_user(db_dsn, make_login("consumer", CONSUMER))) as c:
        assert [m.message for m in c.read("jobs")] == [1]

    # Roles that do not exist yet, and an owner that may not create them:
    # a NOTICE that says what to do, and grants once an administrator did.
    renamed = rename_groups([db_dsn], uuid.uuid4().hex[:10])
    owned_db.roles.extend(renamed)
    notices: list[tuple[str | None, str | None]] = []
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append((d.message_primary, d.message_hint)))
        assert conn.execute("SELECT pgqueue.grant_roles()").fetchone() == ([],)
    message, hint = notices[-1]
    assert message == (
        f"pgqueue: role {owner} may not create roles, so {', '.join(renamed)}"
        " do not exist and nobody may call pgqueue's functions but the owner"
    )
    creates = " ".join(f"CREATE ROLE {r} NOLOGIN;" for r in renamed)
    assert hint == (
        f"Have an administrator run {creates} then run SELECT pgqueue.grant_roles();"
        f" as {owner} (see docs/security.md)."
    )
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        for name in renamed:
            admin.execute(pgsql.SQL("CREATE ROLE {} NOLOGIN").format(pgsql.Identifier(name)))
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT pgqueue.grant_roles()").fetchone() == (renamed,)
    late = make_login("late", renamed[0])  # the new consumer group
    with Client.from_dsn(as_user(db_dsn, late)) as c:
        assert c.read("jobs") == []
        with pytest.raises(PermissionDenied):
            c.purge_queue("jobs")


def test_owner_needs_pg_read_all_stats_for_reads_to_raise_the_safe_floors(
    server_dsn: str, owned_db: OwnedDb, make_login: Callable[..., str]
) -> None:
    owner, db_dsn = owned_db.owner, owned_db.dsn
    applied, notices = migrate_noting(as_user(db_dsn, owner))
    assert applied[-1] == LATEST and notices == [
        (
            f"pgqueue: role {owner}, the owner of schema pgqueue, cannot see other roles'"
            " sessions in pg_stat_activity",
            f"Have an administrator run GRANT pg_read_all_stats TO {owner}; without it, reads"
            " cannot raise the read lanes' safe floors while sessions of other roles are"
            " connected (see docs/security.md).",
        )
    ]
    with psycopg.connect(as_user(db_dsn, owner), autocommit=True) as conn:
        conn.execute("SELECT pgqueue.create_queue('jobs')")
        # a msg_id drawn, so that the fresh lane's safe floor has one to pass
        conn.execute("SELECT pgqueue.delete('jobs', pgqueue.send('jobs', '1'))")
    worker = make_login("consumer", CONSUMER)
    # an idle session of another role, as there always is one in production
    with (
        psycopg.connect(db_dsn, autocommit=True) as bystander,
        Client.from_dsn(as_user(db_dsn, worker), min_size=0, max_size=1) as c,
    ):
        c.read("jobs")  # the first read of a queue runs the late sweep
        time.sleep(1.2)  # the next one is due a second later
        c.read("jobs")
        # the bystander counts as infinitely old: never raised off the bottom
        assert safe_floor(bystander) in BOTTOM
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(
                pgsql.SQL("GRANT pg_read_all_stats TO {}").format(pgsql.Identifier(owner))
            )
        wait_until(lambda: c.read("jobs") == [] and safe_floor(bystander) not in BOTTOM)
    with psycopg.connect(as_user(db_dsn, owner), autocommit=True) as conn:
        said: list[str | None] = []
        conn.add_notice_handler(lambda d: said.append(d.message_primary))
        assert conn.execute("SELECT pgqueue.grant_roles()").fetchone() == (sorted(GROUP_ROLES),)
    assert said == []  # nothing more to advise


def test_a_late_send_by_another_role_is_found_even_when_the_owner_cannot_see_it(
    owned_db: OwnedDb, make_login: Callable[..., str]
) -> None:
    # A producer of another role sends in a transaction that stays open for
    # seconds. The owner, which runs the late sweep, cannot see that session's
    # details in pg_stat_activity: the sweep must count it as infinitely old
    # (not leave it out), or it raises the safe floor above the message, which
    # then commits below every floor and is never read.
    owner, db_dsn = owned_db.owner, owned_db.dsn
    migrate_noting(as_user(db_dsn, owner))
    with psycopg.connect(as_user(db_dsn, owner), autocommit=True) as conn:
        conn.execute("SELECT pgqueue.create_queue('jobs')")
    consumer = Client.from_dsn(as_user(db_dsn, make_login("consumer", CONSUMER)))
    with consumer, psycopg.connect(as_user(db_dsn, make_login("producer", PRODUCER))) as slow:
        slow.execute("SELECT pgqueue.send('jobs', '\"late\"')")  # the transaction stays open
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # reads, and late sweeps, go on meanwhile
            assert consumer.read("jobs") == []
            time.sleep(0.1)
        slow.commit()
        got: list[pgqueue.Message] = []
        wait_until(lambda: bool(got.extend(consumer.read("jobs")) or got))
    assert [m.message for m in got] == ["late"]


def test_migrations_of_two_databases_create_each_role_once(
    server_dsn: str, dsn: str, template_db: str
) -> None:
    other = create_database(server_dsn, template=template_db)
    dsns = [dsn, with_dbname(server_dsn, other)]
    names = rename_groups(dsns, uuid.uuid4().hex[:10])
    try:
        results: list[Any] = []
        with psycopg.connect(dsns[0]) as first:  # a transaction: its roles stay uncommitted
            assert first.execute("SELECT pgqueue.grant_roles()").fetchone() == (names,)

            def second() -> None:
                with psycopg.connect(dsns[1], autocommit=True) as conn:
                    results.append(conn.execute("SELECT pgqueue.grant_roles()").fetchone())

            t = threading.Thread(target=second)
            t.start()

            wait_until(lambda: blocks_another(first))  # the second waits on its CREATE ROLE
            assert t.is_alive() and results == []
            first.commit()
            t.join(60)
        assert results == [(names,)]
        for d in dsns:
            with psycopg.connect(d) as conn:
                has = conn.execute(
                    "SELECT has_function_privilege(%s, 'pgqueue.read(text,integer,integer)',"
                    " 'EXECUTE')",
                    (names[0],),  # the consumer group
                ).fetchone()
                assert has == (True,)
    finally:
        try:
            drop_roles(server_dsn, dsns, names)
        finally:
            drop_database(server_dsn, other)


def test_permission_error_without_a_known_login_still_says_what_to_grant() -> None:
    error = pgqueue._errors.permission_denied("permission denied for function read")
    assert str(error) == (
        "permission denied for function read: this connection's role may not call pgqueue.read;"
        " grant it pgqueue_consumer: GRANT pgqueue_consumer TO <login role>; (see docs/security.md)"
    )
    quoted = pgqueue._errors.permission_denied("permission denied for table message", "App User")
    assert str(quoted) == (
        "permission denied for table message: role App User may not use pgqueue's tables"
        " directly; call pgqueue's functions (see docs/security.md)"
    )
    peek = pgqueue._errors.permission_denied("permission denied for function peek", "App User")
    assert 'GRANT pgqueue_operator TO "App User";' in str(peek)


# -- what a hostile caller's headers and settings cannot do -------------------


def test_a_producer_cannot_forge_a_callback_that_the_readme_guard_would_trust(
    client: Client, producer: Client, dsn: str
) -> None:
    client.create_queue("work")
    client.create_queue("done")
    bid = client.fan_out("work", ["m"], callback_queue="done", callback_message={"album": 7})
    forged = {"_pg_transport": True, "barrier_id": bid, "succeeded": 1, "state": "fired"}
    with pytest.raises(InvalidArgument, match='header "_pg_transport" is reserved'):
        producer.send("done", {"album": 7}, headers=forged)
    with pytest.raises(InvalidArgument, match="reserved"):
        producer.send_batch("done", [1, 2], headers=[None, {"_pg_anything": 1}])
    with pytest.raises(InvalidArgument, match="reserved"):
        producer.fan_out("work", [1], callback_queue="done", callback_message={}, headers=forged)
    with (
        psycopg.connect(as_user(dsn, login_of(producer)), autocommit=True) as raw,
        pytest.raises(psycopg.errors.InvalidParameterValue, match="reserved"),
    ):
        raw.execute("SELECT pgqueue.send('done', '{}', '{\"x\": 1, \"_pg_transport\": true}')")
    assert client.metrics("done").queue_length == 0  # nothing of the refused calls landed
    # the real callback passes the README's guard once, and only it
    [m] = client.read("work", vt=30, qty=1)
    client.complete_member("work", m.msg_id)
    [callback] = client.read("done", vt=30, qty=10)
    assert callback.is_callback and callback.barrier_id == bid
    with client.connection() as conn, conn.transaction():
        assert pgqueue.guard(conn, f"album-done:{callback.barrier_id}")
    # a value that merely contains the text is fine
    assert producer.send("done", 1, headers={"note": '"_pg_transport'}) > 0


def test_a_producer_cannot_forge_a_callbacks_trace_or_its_member_links(
    client: Client, producer: Client, dsn: str
) -> None:
    client.create_queue("work")
    client.create_queue("done")
    bid = client.fan_out("work", ["m"], callback_queue="done", callback_message={})
    stranger = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with (
        psycopg.connect(as_user(dsn, login_of(producer)), autocommit=True) as raw,
    ):
        # the reserved trace headers cannot be written through a caller's headers
        for statement in (
            "SELECT pgqueue.send('done', '{}', %s::jsonb)",
            "SELECT pgqueue.send_batch('done', ARRAY['1'::jsonb], ARRAY[%s::jsonb])",
            "SELECT pgqueue.fan_out('work', ARRAY['1'::jsonb], 'done', '{}', NULL, %s::jsonb)",
        ):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="reserved"):
                raw.execute(statement, (json.dumps({"_pg_traceparent": stranger}),))
        # nor can a producer record a member's run, or read them back
        [m] = client.read("work", vt=30, qty=1)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            raw.execute(
                "SELECT * FROM pgqueue.complete_members('work', ARRAY[%s::bigint],"
                " NULL, NULL, NULL, ARRAY[%s])",
                (m.msg_id, stranger),
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            raw.execute("SELECT * FROM pgqueue.barrier_links(%s)", (bid,))
    assert client.metrics("done").queue_length == 0
    assert client.barrier_status(bid).remaining == 1  # nothing counted
    assert client.run(barrier_links(bid, 128)) == []


@pytest.mark.parametrize("setting", ["completed", "purged", "anything"])
def test_a_consumer_session_setting_does_not_change_how_members_count(
    client: Client, consumer: Client, setting: str
) -> None:
    client.create_queue("work")
    client.create_queue("done")
    bid = client.fan_out("work", list(range(4)), callback_queue="done", callback_message={})
    msgs = consumer.read("work", vt=30, qty=4)
    with consumer.connection() as conn, conn.transaction():
        conn.execute("SELECT set_config('pgqueue.removal_reason', %s, true)", (setting,))
        consumer.delete_many("work", [m.msg_id for m in msgs[:2]], conn=conn)
        consumer.archive_many("work", [m.msg_id for m in msgs[2:]], conn=conn)
    s = client.barrier_status(bid)
    assert (s.state, s.succeeded, s.failed) == ("fired", 4, 0)
    assert len(client.read("done", vt=30, qty=10)) == 1


def test_a_producer_starts_and_watches_workflows_but_cannot_cancel_or_forge_them(
    client: Client, producer: Client, dsn: str
) -> None:
    client.create_queue("steps")
    client.create_queue("done")
    wid = producer.start_workflow(
        "root-A", [Step("a", "steps", 1), Step("b", "steps", 2, depends_on=("a",))]
    )
    assert producer.workflow_status(wid).state == "running"  # "is a run of A pending?"
    forged = {"_pg_transport": True, "workflow_id": wid, "state": "succeeded"}
    with pytest.raises(InvalidArgument, match="reserved"):
        producer.start_workflow("x", [Step("a", "steps", 1, headers=forged)])
    with pytest.raises(PermissionDenied):
        producer.cancel_workflow(wid)
    with pytest.raises(PermissionDenied):
        producer.step_results(wid, "a")
    # the keys a step's messages carry are the workflow's, whatever the step's headers say
    [msg] = client.read("steps", vt=30, qty=1)
    assert (msg.workflow_id, msg.step) == (wid, "a")
    spoof = producer.start_workflow(
        "spoof", [Step("a", "steps", 1, headers={"workflow_id": "root-A", "step": "b"})]
    )
    [other] = [m for m in client.read("steps", vt=30, qty=5) if m.msg_id != msg.msg_id]
    assert (other.workflow_id, other.step) == (spoof, "a")


def _expected_grants(conn: psycopg.Connection[Any]) -> tuple[dict[str, set[str]], list[str]]:
    """What the one role model grants, derived here from pgqueue.role_grant alone.

    Every function and relation of both schemas -> the roles that may call or
    read it; and the functions it has not classified (not internal by name, no
    row). The rule, as docs/security.md states it: a function named `_...` is
    internal (no one); any other is its row's, by signature or by schema and
    name; a relation is its rows' (`*` matching any characters), no row: no one.
    """
    import fnmatch

    rows = conn.execute("SELECT object, roles, kind FROM pgqueue.role_grant").fetchall()
    by_signature = {o: set(r) for o, r, k in rows if k == "function" and "(" in o}
    by_name = {o: set(r) for o, r, k in rows if k == "function" and "(" not in o}
    relation_rows = [(o, set(r)) for o, r, k in rows if k == "relation"]
    expected: dict[str, set[str]] = {}
    unclassified = []
    for signature, schema, name in conn.execute(
        "SELECT p.oid::regprocedure::text, n.nspname, p.proname FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname IN ('pgqueue', 'pgmq')"
    ):
        if name.startswith("_"):
            expected[signature] = set()
        elif signature in by_signature:
            expected[signature] = by_signature[signature]
        elif f"{schema}.{name}" in by_name:
            expected[signature] = by_name[f"{schema}.{name}"]
        else:
            unclassified.append(signature)
    for schema, name in conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname IN ('pgqueue', 'pgmq') AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')"
    ):
        qualified = f"{schema}.{name}"
        readers: set[str] = set()
        for pattern, roles in relation_rows:
            if fnmatch.fnmatchcase(qualified, pattern):
                readers |= roles
        expected[f"relation {qualified}"] = readers
    return expected, unclassified


def _actual_grants(conn: psycopg.Connection[Any]) -> dict[str, set[str]]:
    """Who may call each function and read each relation of both schemas, from the catalog;
    a relation any role may write, or anything PUBLIC may use, shows as such."""
    actual: dict[str, set[str]] = {}
    for signature, roles, public in conn.execute(
        "SELECT p.oid::regprocedure::text,"
        " array(SELECT r FROM unnest(%s::text[]) r"
        "        WHERE has_function_privilege(r, p.oid, 'EXECUTE')),"
        " has_function_privilege('public', p.oid, 'EXECUTE')"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname IN ('pgqueue', 'pgmq')",
        (list(GROUP_ROLES),),
    ):
        actual[signature] = set(roles) | ({"PUBLIC"} if public else set())
    for qualified, readers, writers, public in conn.execute(
        "SELECT n.nspname || '.' || c.relname,"
        " array(SELECT r FROM unnest(%(roles)s::text[]) r"
        "        WHERE CASE WHEN c.relkind = 'S' THEN has_sequence_privilege(r, c.oid, 'SELECT')"
        "                   ELSE has_table_privilege(r, c.oid, 'SELECT') END),"
        " array(SELECT r FROM unnest(%(roles)s::text[]) r"
        "        WHERE CASE WHEN c.relkind = 'S'"
        "                   THEN has_sequence_privilege(r, c.oid, 'USAGE, UPDATE')"
        "                   ELSE has_table_privilege(r, c.oid,"
        "                        'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER') END),"
        " CASE WHEN c.relkind = 'S'"
        "      THEN has_sequence_privilege('public', c.oid, 'SELECT, USAGE, UPDATE')"
        "      ELSE has_table_privilege('public', c.oid, 'SELECT, INSERT, UPDATE, DELETE') END"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname IN ('pgqueue', 'pgmq') AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')",
        {"roles": list(GROUP_ROLES)},
    ):
        actual[f"relation {qualified}"] = (
            set(readers) | {f"{w} writes" for w in writers} | ({"PUBLIC"} if public else set())
        )
    return actual


def test_every_function_and_relation_of_both_schemas_is_granted_as_the_one_role_model_says(
    dsn: str,
) -> None:
    """pgqueue.role_grant is the one statement of who may do what, for pgqueue's functions,
    the pgmq facade's functions and views alike; a new function it does not classify fails."""
    from pgqueue._pgmq import install

    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        conn.execute("SELECT pgqueue.create_queue('plain')")
        conn.execute("SELECT pgmq.create('Mixed.Case')")  # views q_mixed.case, a_...
        expected, unclassified = _expected_grants(conn)
        actual = _actual_grants(conn)
        stale = conn.execute(
            "SELECT g.object FROM pgqueue.role_grant g WHERE g.kind = 'function' AND NOT EXISTS ("
            "  SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            "   WHERE p.oid::regprocedure::text = g.object"
            "      OR n.nspname || '.' || p.proname = g.object)"
        ).fetchall()
    assert unclassified == [], (
        "functions no row of pgqueue.role_grant classifies: add one (roles '{}' for none)"
    )
    assert stale == []  # every row names something that exists
    assert any(k.startswith("pgmq.") for k in expected) and "relation pgmq.q_mixed.case" in expected
    wrong = {k: (expected[k], actual[k]) for k in expected if expected[k] != actual[k]}
    assert wrong == {}


def test_a_function_nobody_classified_fails_the_derivation(dsn: str) -> None:
    """The check above can fail: a new API-looking function with no row is caught."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION pgqueue.new_api(integer) RETURNS integer LANGUAGE sql AS 'SELECT 1'"
        )
        _, unclassified = _expected_grants(conn)
        assert unclassified == ["pgqueue.new_api(integer)"]
        conn.execute("SELECT pgqueue.grant_roles()")
        # unclassified, it is granted to no one (PUBLIC's right taken too)
        assert _actual_grants(conn)["pgqueue.new_api(integer)"] == set()
