"""The dashboard over HTTP, in process: pages, escaping, CSRF, read-only, logins and roles.

The browser tests (test_web_browser.py) click through the same pages in
Chromium; these cover what needs no browser, on every machine.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.extras import needs_extra

needs_extra("web")

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient
from support.dashboard_data import IMG, SCRIPT, hidden_fields, seed

from pgqueue import Client
from pgqueue._web.security import Signer
from pgqueue.web import create_app

TEMPLATES = Path(__file__).parents[2] / "pgqueue" / "_web" / "templates"


@pytest.fixture
def seeded(client: Client) -> dict[str, Any]:
    """The dashboard's sample data in this test's database."""
    return seed(client)


@pytest.fixture
def web(dsn: str, seeded: dict[str, Any]) -> Iterator[TestClient]:
    """The app on the seeded database, as its owner (allowed here)."""
    with TestClient(create_app(dsn, allow_owner=True, secret="s" * 32)) as tc:
        yield tc


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "the page has no form with a CSRF token"
    return found[1]


PAGES = [
    ("/", ["orders", "emails", "reports", "paused"]),
    ("/queue?name=emails", ["user3@example.com", "Pause"]),
    ("/queue?name=reports", ["Resume", "paused"]),
    ("/poison", ["KeyError", "TimeoutError: warehouse API"]),
    ("/poison?queue=orders&reason=keyerror", ["SKU-101"]),
    ("/barriers", ["invoice-2026-11", "digest-42"]),
    ("/barrier?id=invoice-2026-11", ["card declined", "warehouse API", "Waiting on 2 members"]),
    ("/barrier?id=digest-42", ["fired", "as message"]),
    ("/workflows", ["nightly-etl"]),
    ("/workflow?id=nightly-etl", ["extract", "transform", "audit", "load", "cancelled"]),
    ("/workers", ["Workers"]),
]


@pytest.mark.parametrize(("path", "expected"), PAGES)
def test_every_page_shows_its_data(web: TestClient, path: str, expected: list[str]) -> None:
    response = web.get(path)
    assert response.status_code == 200, response.text
    for text in expected:
        assert text in response.text, f"{path} lacks {text!r}"
    assert response.headers["content-security-policy"].startswith("default-src 'self'")
    assert "'unsafe-inline'" not in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["cache-control"] == "no-store"


def test_hostile_payloads_headers_and_reasons_are_text(web: TestClient, seeded: Any) -> None:
    hostile = seeded["poisoned"][0]
    for path in ("/poison", f"/poison/message?queue=orders&id={hostile}"):
        html = web.get(path).text
        assert SCRIPT not in html and IMG not in html
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    html = web.get(f"/poison/message?queue=orders&id={hostile}").text
    assert "&lt;img src=x onerror=" in html


def test_no_template_opts_out_of_escaping() -> None:
    for path in TEMPLATES.glob("*.html"):
        text = path.read_text()
        assert "|safe" not in text.replace(" ", ""), path.name
        assert "autoescape false" not in text, path.name


def test_requeue_after_confirmation_changes_the_database(
    web: TestClient, client: Client, seeded: Any
) -> None:
    target = seeded["poisoned"][1]
    confirm = web.get("/poison/confirm", params={"action": "requeue", "m": f"orders:{target}"})
    assert "Requeue 1 message?" in confirm.text
    assert client.poison_get("orders", target) is not None  # nothing changed by looking
    done = web.post("/poison/act", data=hidden_fields(confirm.text), follow_redirects=False)
    assert done.status_code == 303
    assert "Requeued 1 message." in web.get(done.headers["location"]).text
    assert client.poison_get("orders", target) is None
    assert any(m.message == {"sku": "SKU-100", "qty": 1} for m in client.peek("orders", qty=50))


def test_all_matching_acts_on_exactly_the_confirmed_count(
    web: TestClient, client: Client, seeded: Any
) -> None:
    params = {"action": "purge", "all": "1", "queue": "orders", "reason": "KeyError"}
    confirm = web.get("/poison/confirm", params=params)
    assert "Purge 4 messages?" in confirm.text
    form = hidden_fields(confirm.text)
    # poisoned after the confirmation: left alone
    late = client.send("orders", {"late": True})
    client.poison("orders", late, "KeyError: late")
    web.post("/poison/act", data=form, follow_redirects=False)
    left = {p.msg_id for p in client.poison_list("orders", qty=100)}
    assert left == {seeded["poisoned"][0], late, *[m for m in seeded["members"][3:4]]}


def test_a_selection_is_changed_whole_or_not_at_all(
    web: TestClient, client: Client, seeded: Any
) -> None:
    a, b = seeded["poisoned"][1:3]
    confirm = web.get(
        "/poison/confirm", params=[("action", "purge"), ("m", f"orders:{a}"), ("m", f"orders:{b}")]
    )
    form = hidden_fields(confirm.text)
    client.poison_purge("orders", [b])  # someone else got there first
    response = web.post("/poison/act", data=form, follow_redirects=False)
    assert response.status_code == 409 and "nothing was changed" in response.text
    assert client.poison_get("orders", a) is not None


def test_a_post_without_its_token_or_from_another_site_is_refused(
    web: TestClient, client: Client, seeded: Any
) -> None:
    token = csrf_of(web.get("/queue?name=emails").text)
    refused = [
        web.post("/queue/pause", data={"name": "emails"}),
        web.post("/queue/pause", data={"name": "emails", "csrf": "x.1.y"}),
        web.post(
            "/queue/pause",
            data={"name": "emails", "csrf": Signer(b"other" * 8).sign("csrf", "local")},
        ),
        web.post(
            "/queue/pause",
            data={"name": "emails", "csrf": token},
            headers={"origin": "https://evil.example"},
        ),
        web.post(
            "/queue/pause",
            data={"name": "emails", "csrf": token},
            headers={"sec-fetch-site": "cross-site"},
        ),
    ]
    assert [r.status_code for r in refused] == [403] * 5
    assert not any(r.paused for r in _overview(client) if r.name == "emails")
    ok = web.post("/queue/pause", data={"name": "emails", "csrf": token}, follow_redirects=False)
    assert ok.status_code == 303
    assert any(r.paused for r in _overview(client) if r.name == "emails")


def _overview(client: Client) -> list[Any]:
    from pgqueue._web.queries import OVERVIEW

    return client.run(OVERVIEW)


def test_a_token_expires_and_belongs_to_one_actor() -> None:
    signer = Signer(b"k" * 32)
    token = signer.sign("csrf", "alice", now=1000.0)
    assert signer.verify("csrf", token, ttl=60, now=1030.0) == "alice"
    assert signer.verify("csrf", token, ttl=60, now=1061.0) is None
    assert signer.verify("session", token, ttl=60, now=1030.0) is None
    forged = token.replace(
        token.split(".")[0], base64.urlsafe_b64encode(b"bob").decode().rstrip("=")
    )
    assert signer.verify("csrf", forged, ttl=60, now=1030.0) is None


def test_pause_and_resume_are_logged_with_their_actor(
    web: TestClient, client: Client, captured_logs: list[dict[str, Any]]
) -> None:
    logs = captured_logs
    token = csrf_of(web.get("/queue?name=emails").text)
    web.post("/queue/pause", data={"name": "emails", "csrf": token})
    web.post("/queue/resume", data={"name": "emails", "csrf": token})
    actions = [
        (e["action"], e["actor"], e["changed"]) for e in logs if e.get("event") == "web.action"
    ]
    assert actions == [("queue.pause", "local", 1), ("queue.resume", "local", 1)]
    assert client.read("emails", vt=1, qty=1)  # resumed: reads work again


def test_read_only_offers_no_action_and_refuses_posts(dsn: str, seeded: Any) -> None:
    with TestClient(create_app(dsn, read_only=True, allow_owner=True)) as web:
        for path, _ in PAGES:
            html = web.get(path).text
            assert 'method="post"' not in html, path
            assert "Requeue" not in html and "Pause" not in html, path
        assert web.post("/queue/pause", data={"name": "emails"}).status_code in (403, 404, 405)
        assert web.get("/poison/confirm?action=purge&m=orders:1").status_code == 404


def test_read_only_sessions_cannot_write_even_by_a_missed_path(dsn: str, seeded: Any) -> None:
    from pgqueue._web.state import web_dsn

    with (
        psycopg.connect(web_dsn(dsn, read_only=True)) as conn,
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
    ):
        conn.execute("SELECT pgqueue.pause_queue('emails')")


def test_basic_auth_and_tokens(dsn: str, seeded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGQUEUE_WEB_BASIC_AUTH", "alice:correct-horse")
    monkeypatch.setenv("PGQUEUE_WEB_TOKEN", "t" * 24)
    with TestClient(create_app(dsn, allow_owner=True)) as web:
        assert web.get("/healthz").text == "ok"
        assert web.get("/").status_code == 401
        assert web.get("/", auth=("alice", "wrong")).status_code == 401
        assert web.get("/", auth=("mallory", "correct-horse")).status_code == 401
        page = web.get("/", auth=("alice", "correct-horse"))
        assert page.status_code == 200 and "alice" in page.text
        assert web.get("/", headers={"authorization": "Bearer " + "t" * 24}).status_code == 200
        assert web.get("/", headers={"authorization": "Bearer " + "u" * 24}).status_code == 401
        assert web.post("/login", data={"token": "nope"}).status_code == 403
        login = web.post("/login", data={"token": "t" * 24}, follow_redirects=False)
        assert login.status_code == 303
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert web.get("/").status_code == 200  # the cookie now


def test_too_short_secrets_are_refused(monkeypatch: pytest.MonkeyPatch, dsn: str) -> None:
    from pgqueue import InvalidArgument

    monkeypatch.setenv("PGQUEUE_WEB_TOKEN", "short")
    with pytest.raises(InvalidArgument, match="too short"):
        create_app(dsn)
    monkeypatch.delenv("PGQUEUE_WEB_TOKEN")
    monkeypatch.setenv("PGQUEUE_WEB_BASIC_AUTH", "alice")
    with pytest.raises(InvalidArgument, match="user:password"):
        create_app(dsn)


@pytest.fixture
def login_role(sql: Any, dsn: str) -> Iterator[Any]:
    """make(role_name, *groups): a login role in those groups; dropped at the end."""
    made: list[str] = []

    def make(name: str, *groups: str) -> str:
        in_role = f" IN ROLE {', '.join(groups)}" if groups else ""
        sql.execute(f"CREATE ROLE {name} LOGIN{in_role}")
        made.append(name)
        return psycopg.conninfo.make_conninfo(dsn, user=name)

    yield make
    for name in made:
        sql.execute(f"DROP OWNED BY {name}")
        sql.execute(f"DROP ROLE {name}")


def test_the_app_runs_as_an_operator_and_refuses_other_roles(
    dsn: str, seeded: Any, login_role: Any
) -> None:
    suffix = Path(dsn.split("dbname=")[-1].split()[0]).name[-8:]
    operator = login_role(f"web_op_{suffix}", "pgqueue_operator")
    consumer = login_role(f"web_co_{suffix}", "pgqueue_consumer")
    with TestClient(create_app(operator)) as web:
        for path, expected in PAGES:
            response = web.get(path)
            assert response.status_code == 200, (path, response.text)
            assert all(text in response.text for text in expected), path
        token = csrf_of(web.get("/queue?name=emails").text)
        assert web.post("/queue/pause", data={"name": "emails", "csrf": token}).status_code == 200
    with TestClient(create_app(consumer)) as web:
        response = web.get("/")
        assert response.status_code == 503 and "lacks pgqueue_operator" in response.text
    with TestClient(create_app(dsn)) as web:  # the owner, not allowed here
        response = web.get("/")
        assert response.status_code == 503 and "--allow-owner" in response.text


def test_mounted_under_a_path_of_the_host_app(dsn: str, seeded: Any) -> None:
    dashboard = create_app(dsn, allow_owner=True)
    host = Starlette(
        routes=[Mount("/ops/queues", app=dashboard)],
        lifespan=lambda app: dashboard.router.lifespan_context(dashboard),
    )
    with TestClient(host) as web:
        page = web.get("/ops/queues/")
        assert page.status_code == 200
        assert 'href="/ops/queues/poison"' in page.text
        assert 'href="/ops/queues/static/app.css"' in page.text
        assert web.get("/ops/queues/static/app.css").status_code == 200
        assert web.get("/ops/queues/barrier?id=invoice-2026-11").status_code == 200


def test_bad_requests_get_a_page_that_says_what_is_wrong(web: TestClient) -> None:
    cases = {
        "/queue?name=nope": (404, "does not exist"),
        "/queue": (400, "name a queue"),
        "/barrier?id=nope": (404, "does not exist"),
        "/poison?cursor=garbage": (400, "bad cursor"),
        "/poison/message?queue=orders&id=abc": (400, "message id"),
        "/poison/message?queue=orders&id=999999": (404, "no poison message"),
        "/poison/confirm?action=explode": (400, "requeue or purge"),
        "/workflow?id=nope": (404, "nope"),
    }
    for path, (status, text) in cases.items():
        response = web.get(path)
        assert (response.status_code, text in response.text) == (status, True), path


def test_through_pgbouncer_in_transaction_mode(
    server_dsn: str, dsn: str, seeded: Any, captured_logs: list[dict[str, Any]]
) -> None:
    """PgBouncer refuses the session settings a startup packet carries: the pages still work."""
    from psycopg.conninfo import conninfo_to_dict
    from support import pgbouncer

    if pgbouncer.binary() is None:
        pytest.skip("needs pgbouncer (apt-get install pgbouncer)")
    bouncer = pgbouncer.start(server_dsn)
    try:
        pooled = bouncer.dsn(str(conninfo_to_dict(dsn)["dbname"]))
        with TestClient(create_app(pooled, allow_owner=True)) as web:
            for path, expected in PAGES:
                response = web.get(path)
                assert response.status_code == 200, (path, response.text)
                assert all(text in response.text for text in expected), path
        # this bouncer drops `options`: a read-only app says it cannot make its sessions so
        with TestClient(create_app(pooled, allow_owner=True, read_only=True)) as web:
            assert web.get("/").status_code == 200
        assert any(e.get("event") == "web.session_settings_unsupported" for e in captured_logs)
        refusing = pgbouncer.start(server_dsn, ignore_startup_parameters="extra_float_digits")
        try:
            strict = refusing.dsn(str(conninfo_to_dict(dsn)["dbname"]))
            with TestClient(create_app(strict, allow_owner=True)) as web:
                assert web.get("/barriers").status_code == 200
        finally:
            refusing.stop()
        details = [
            e["detail"]
            for e in captured_logs
            if e.get("event") == "web.session_settings_unsupported"
        ]
        assert any("refused startup options" in d for d in details), details
    finally:
        bouncer.stop()
