"""What an adversarial review of the dashboard broke, each kept as a test.

Every test here failed before its fix: a shell-injectable suggested command,
a suggested command broader than the confirmation, 404s and 500s for an
outage, a partial bulk action left unlogged, a session that outlived its
token, an act past the cap, a confirmation claiming a filter it ignored, an
empty actor let in, a deeply nested payload that broke pages, crafted
parameters answered with 500, a forged result banner, a "loopback" host
name that resolves elsewhere.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support.extras import needs_extra

needs_extra("web")

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.testclient import TestClient
from support.dashboard_data import hidden_fields, seed
from support.db import plant

from pgqueue import Client, InvalidArgument
from pgqueue.web import create_app


@pytest.fixture
def web(dsn: str, client: Client) -> Iterator[TestClient]:
    """The app on a seeded database."""
    seed(client)
    with TestClient(create_app(dsn, allow_owner=True, secret="s" * 32)) as tc:
        yield tc


def _poison_many(sql: Any, queue: str, n: int, reason: str, ago: str = "1 minute") -> None:
    sql.execute(
        "INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,"
        " reason, message) SELECT q.queue_id,"
        " 1000000 + g + coalesce((SELECT max(msg_id) FROM pgqueue.poison), 0), 3, now(),"
        " now() - %s::interval, %s, '{}'"
        " FROM generate_series(1, %s) g, pgqueue.queue q WHERE q.queue_name = %s",
        (ago, reason, n, queue),
    )


def _unescape(text: str) -> str:
    import html

    return html.unescape(text)


def test_the_suggested_command_is_quoted_for_the_shell_and_as_narrow_as_the_confirmation(
    web: TestClient, client: Client, sql: Any
) -> None:
    client.create_queue("bulk")
    evil = "'; touch /tmp/pwned; echo '"
    _poison_many(sql, "bulk", 10_005, evil, ago="1 minute")
    _poison_many(sql, "bulk", 3, evil, ago="3 days")  # outside the 1h window
    page = web.get(
        "/poison/confirm",
        params={"action": "purge", "all": "1", "queue": "bulk", "reason": evil, "since": "1h"},
    )
    assert "would purge <b>10005</b> messages" in page.text
    [command] = re.findall(r"<pre>(.*?)</pre>", page.text, re.S)
    argv = shlex.split(_unescape(command))
    assert argv[:5] == ["pgqueue", "poison", "purge", "bulk", "--all"]
    assert argv[argv.index("--reason") + 1] == evil  # one argument, whatever it holds
    assert argv[argv.index("--since") + 1] == "1h"


def test_an_outage_is_a_503_that_says_so_quickly(dsn: str, client: Client, sql: Any) -> None:
    seed(client)
    with TestClient(create_app(dsn, allow_owner=True)) as web:
        assert web.get("/queue?name=emails").status_code == 200
        name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(psycopg.conninfo.make_conninfo(dsn, dbname="postgres")) as admin:
            admin.autocommit = True
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            try:
                for path in ("/", "/workers", "/queue?name=emails", "/poison", "/barriers"):
                    web.app.state.pgqueue.snapshot.taken = 0.0
                    response = web.get(path)
                    assert response.status_code == 503, (path, response.status_code)
                    assert "does not answer" in response.text, path
            finally:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def test_a_bulk_action_that_fails_part_way_logs_and_reports_what_it_changed(
    web: TestClient, client: Client, sql: Any, captured_logs: list[dict[str, Any]]
) -> None:
    client.create_queue("bulk2")
    _poison_many(sql, "bulk2", 600, "boom")
    sql.execute(
        # a counter, not a count of the table per row: that is quadratic, and
        # took the dashboard's statement timeout on a loaded machine
        "CREATE SEQUENCE pgqueue.test_fail_seq"
    )
    sql.execute(
        "CREATE FUNCTION pgqueue.test_fail() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF nextval('pgqueue.test_fail_seq') > 550 THEN"
        " RAISE EXCEPTION 'simulated failure' USING ERRCODE = '22023'; END IF; RETURN NEW; END $$"
    )
    sql.execute(
        "CREATE TRIGGER test_fail BEFORE INSERT ON pgqueue.message"
        " FOR EACH ROW EXECUTE FUNCTION pgqueue.test_fail()"
    )
    sql.execute("SELECT pgqueue.purge_queue(queue_name) FROM pgqueue.list_queues()")
    confirm = web.get("/poison/confirm", params={"action": "requeue", "all": "1", "queue": "bulk2"})
    response = web.post("/poison/act", data=hidden_fields(confirm.text), follow_redirects=False)
    assert response.status_code == 500
    assert "500 messages were requeued before" in response.text
    [logged] = [e for e in captured_logs if e.get("event") == "web.action"]
    assert logged["changed"] == 500 and "simulated failure" in logged["error"]


def test_a_session_ends_when_its_token_is_replaced(
    dsn: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(client)
    monkeypatch.setenv("PGQUEUE_WEB_TOKEN", "t" * 24)
    with TestClient(create_app(dsn, allow_owner=True, secret="k" * 32)) as web:
        web.post("/login", data={"token": "t" * 24})
        cookie = web.cookies.get("pgqueue_session")
        assert cookie and web.get("/").status_code == 200
    monkeypatch.setenv("PGQUEUE_WEB_TOKEN", "u" * 24)
    with TestClient(create_app(dsn, allow_owner=True, secret="k" * 32)) as web:
        web.cookies.set("pgqueue_session", cookie)
        assert web.get("/", follow_redirects=False).status_code in (303, 401)


def test_the_act_refuses_past_the_cap_and_without_its_cut_off(
    web: TestClient, client: Client, sql: Any
) -> None:
    client.create_queue("bulk3")
    _poison_many(sql, "bulk3", 10_020, "boom")
    token = re.search(r'name="csrf" value="([^"]+)"', web.get("/queue?name=emails").text)
    assert token
    form = {"action": "requeue", "all": "1", "queue": "bulk3", "csrf": token[1]}
    no_cut_off = web.post("/poison/act", data=form, follow_redirects=False)
    assert no_cut_off.status_code == 400
    form["before"] = "2999-01-01T00:00:00+00:00"
    too_many = web.post("/poison/act", data=form, follow_redirects=False)
    assert too_many.status_code == 400 and "pgqueue poison requeue" in too_many.text
    assert client.poison_count("bulk3") == 10_020  # nothing changed


@pytest.mark.parametrize(
    "params",
    [
        {"action": "purge", "all": "1", "queue": "orders", "since": "15min"},
        {"action": "purge", "m": "orders:²"},
        {"action": "purge", "all": "1", "queue": "orders", "before": "0001-01-01T00:00:00+01:00"},
        {"action": "purge", "all": "1", "queue": "orders", "before": "9999-12-31T23:59:59-01:00"},
        {
            "action": "purge",
            "all": "1",
            "queue": "orders",
            "before": "0001-01-02T00:00:00+00:00",
            "since": "7d",
        },
    ],
)
def test_crafted_selections_are_refused_with_400(web: TestClient, params: dict[str, str]) -> None:
    response = web.get("/poison/confirm", params=params)
    assert response.status_code == 400, response.text


@pytest.mark.parametrize(
    "path",
    [
        '/poison?cursor=["2024-01-01T00:00:00+00:00",Infinity,1]',
        '/poison?cursor=["0001-01-01T00:00:00+01:00",1,1]',
        '/barriers?cursor=["0001-01-01T00:00:00+01:00","x"]',
    ],
)
def test_crafted_cursors_are_refused_with_400(web: TestClient, path: str) -> None:
    assert web.get(path).status_code == 400


def test_a_result_banner_cannot_be_forged_by_a_link(web: TestClient) -> None:
    page = web.get("/poison?done=purge&n=12345")
    assert "Purged 12345" not in page.text


def test_an_empty_actor_from_the_host_is_refused(dsn: str, client: Client) -> None:
    seed(client)

    def forwarded(request: Request) -> str | None:
        return request.headers.get("x-forwarded-user")

    dashboard = create_app(dsn, auth=forwarded, allow_owner=True)
    host = Starlette(
        routes=[Mount("/ops", app=dashboard)],
        lifespan=lambda app: dashboard.router.lifespan_context(dashboard),
    )
    with TestClient(host) as web:
        assert web.get("/ops/", headers={"x-forwarded-user": ""}).status_code == 401
        assert web.get("/ops/", headers={"x-forwarded-user": "ann"}).status_code == 200


def test_a_deeply_nested_payload_breaks_no_page(web: TestClient, sql: Any, client: Client) -> None:
    client.create_queue("deep")
    deep = "[" * 5000 + "]" * 5000  # no send takes it; an import or an older version may have
    plant(sql, "deep", deep, '{"h": ' + deep + "}")
    msg_id = plant(sql, "deep", deep, '{"h": ' + deep + "}")
    sql.execute("SELECT pgqueue.poison('deep', %s, 'too deep')", (msg_id,))
    for path in (
        "/queue?name=deep",
        "/poison?queue=deep",
        f"/poison/message?queue=deep&id={msg_id}",
    ):
        assert web.get(path).status_code == 200, path


def test_host_names_that_only_look_like_loopback_need_a_login() -> None:
    from pgqueue._web.security import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("127.evil.example")
    assert not is_loopback("0.0.0.0")


def test_weak_or_ambiguous_logins_are_refused(monkeypatch: pytest.MonkeyPatch, dsn: str) -> None:
    monkeypatch.setenv("PGQUEUE_WEB_BASIC_AUTH", "alice:pw")
    with pytest.raises(InvalidArgument, match="at least 12"):
        create_app(dsn)
    monkeypatch.setenv("PGQUEUE_WEB_BASIC_AUTH", "token:long-enough-password")
    with pytest.raises(InvalidArgument, match="token"):
        create_app(dsn)
