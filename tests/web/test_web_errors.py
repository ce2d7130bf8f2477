"""Every response carries the security headers, and no malformed parameter is a 500.

The walk enumerates the app's own routes: a route added without an entry in
ROUTES fails it until someone says what the route reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.extras import needs_extra

needs_extra("web")

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient
from support.dashboard_data import seed

from pgqueue import Client
from pgqueue._web import queries
from pgqueue.web import create_app

SECURITY = (
    "content-security-policy",
    "x-content-type-options",
    "referrer-policy",
    "x-frame-options",
    "cache-control",
)
BIG = "99999999999999999999999"  # past bigint

# Each route: its method, the path a request takes, and parameters that work;
# the walk replaces each parameter in turn by every value of MALFORMED. None:
# a parameter the route reads that the working request leaves out.
ROUTES: dict[str, tuple[str, str, dict[str, str | None]]] = {
    "/": ("GET", "/", {"q": "o", "sort": "poison", "dir": "asc", "page": "1"}),
    "/queue": ("GET", "/queue", {"name": "emails", "after": "0"}),
    "/poison": (
        "GET",
        "/poison",
        {"queue": "orders", "reason": "KeyError", "since": "7d", "cursor": None, "done": None},
    ),
    "/poison/message": ("GET", "/poison/message", {"queue": "orders", "id": "{poisoned}"}),
    "/barriers": ("GET", "/barriers", {"state": "open", "cursor": None}),
    "/barrier": ("GET", "/barrier", {"id": "invoice-2026-11"}),
    "/workflows": ("GET", "/workflows", {"state": "running"}),
    "/workflow": ("GET", "/workflow", {"id": "nightly-etl"}),
    "/workers": ("GET", "/workers", {}),
    "/healthz": ("GET", "/healthz", {}),
    "/login": ("GET", "/login", {}),  # its POST is walked below: every token is refused
    "/static": ("GET", "/static/app.css", {}),
    "/queue/{action:str}": ("POST", "/queue/resume", {"name": "emails"}),
    "/poison/confirm": (
        "GET",
        "/poison/confirm",
        {
            "action": "purge",
            "all": "1",
            "queue": "orders",
            "m": None,
            "reason": None,
            "since": None,
            "before": None,
        },
    ),
    "/poison/act": (
        "POST",
        "/poison/act",
        # all of orders poisoned before 2000: nothing, so the walk changes nothing
        {
            "action": "requeue",
            "all": "1",
            "queue": "orders",
            "m": None,
            "reason": None,
            "since": None,
            "before": "2000-01-01T00:00:00+00:00",
        },
    ),
}
MALFORMED = [
    BIG,
    "-1",
    "1.5",
    "\u00b2",  # a digit to str.isdigit(), not to int()
    "abc",
    "",
    "a\x00b",
    "x" * 3000,
    '["2024-01-01T00:00:00+00:00",1,' + BIG + "]",
    '["2024-01-01T00:00:00+00:00","a\\u0000b"]',
    "0001-01-01T00:00:00+01:00",
    "2024-13-45T25:61:00+00:00",
    "orders:" + BIG,
]
# Paths no route takes, or a route takes with a malformed part of its own.
ODD_PATHS = ["/queue/%00", "/queue/explode", "/static/..%2f..%2fapp.py", "/nope", "/poison/"]


@pytest.fixture
def seeded(client: Client) -> dict[str, Any]:
    """The dashboard's sample data in this test's database."""
    return seed(client)


@pytest.fixture
def web(dsn: str, seeded: dict[str, Any]) -> Iterator[TestClient]:
    """The app on the seeded database; a 500 is a response here, not a raised exception."""
    app = create_app(dsn, allow_owner=True, secret="s" * 32)
    with TestClient(app, raise_server_exceptions=False) as tc:
        yield tc


def security(response: httpx.Response) -> dict[str, str | None]:
    """The security headers a response carries."""
    return {name: response.headers.get(name) for name in SECURITY}


@pytest.fixture
def page_headers(web: TestClient) -> dict[str, str | None]:
    """The security headers of a page that works: what every response must carry."""
    page = web.get("/")
    assert page.status_code == 200
    expected = security(page)
    assert "frame-ancestors 'none'" in (expected["content-security-policy"] or "")
    assert expected["cache-control"] == "no-store"
    assert expected["x-frame-options"] == "DENY"
    return expected


def _csrf(web: TestClient) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', web.get("/queue?name=emails").text)
    assert found
    return found[1]


def test_every_route_answers_malformed_parameters_below_500_with_the_headers(
    web: TestClient, seeded: dict[str, Any], page_headers: dict[str, str | None]
) -> None:
    routes = {getattr(r, "path", None) for r in web.app.routes}  # type: ignore[attr-defined]
    assert routes == set(ROUTES), "classify the new route in ROUTES"
    csrf = _csrf(web)
    poisoned = str(seeded["poisoned"][1])
    seen: list[tuple[str, str, str, int]] = []
    for method, path, params in ROUTES.values():
        good = {k: v.format(poisoned=poisoned) for k, v in params.items() if v is not None}
        working = _send(web, method, path, good, csrf)
        assert working.status_code < 400, (path, working.status_code, working.text[:300])
        assert security(working) == page_headers, path
        for name in params:
            for bad in MALFORMED:
                response = _send(web, method, path, {**good, name: bad}, csrf)
                seen.append((path, name, bad[:30], response.status_code))
                assert response.status_code < 500, (path, name, bad[:40], response.text[:300])
                assert security(response) == page_headers, (path, name, bad[:40])
        refused = _send(web, "PUT", path, good, csrf)
        assert refused.status_code == 405 and "allow" in refused.headers, path
        assert security(refused) == page_headers, path
    for bad in MALFORMED:
        refused = _send(web, "POST", "/login", {"token": bad}, csrf)
        assert refused.status_code == 403 and security(refused) == page_headers, bad[:40]
    for path in ODD_PATHS:
        for method in ("GET", "POST", "PUT"):
            response = _send(web, method, path, {}, csrf)
            assert response.status_code < 500, (method, path, response.status_code)
            assert security(response) == page_headers, (method, path)
    assert {status for *_, status in seen} >= {400, 404}


def _send(
    web: TestClient, method: str, path: str, params: dict[str, str], csrf: str
) -> httpx.Response:
    if method == "GET":
        return web.get(path, params=params, follow_redirects=False)
    return web.request(method, path, data={**params, "csrf": csrf}, follow_redirects=False)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        (f"/queue?name=q&after={BIG}", "after must be a message id"),
        ("/queue?name=emails&after=-1", "after must be a message id"),
        ("/queue?name=emails&after=1.5", "after must be a message id"),
        (f"/poison/message?queue=orders&id={BIG}", "id must be a message id"),
        (f"/poison/confirm?action=purge&m=orders:{BIG}", "must be a message id"),
        ("/poison?reason=a%00b", "NUL character"),
        ("/barrier?id=a%00b", "NUL character"),
        ("/workflow?id=%00", "NUL character"),
        (f'/poison?cursor=["2024-01-01T00:00:00%2B00:00",1,{BIG}]', "bad cursor"),
        ('/barriers?cursor=["2024-01-01T00:00:00%2B00:00","a\\u0000b"]', "bad cursor"),
        (
            "/poison/confirm?action=purge&all=1&queue=orders&before=2024-13-45T00:00:00%2B00:00",
            "bad time",
        ),
    ],
)
def test_a_malformed_parameter_is_a_400_page_that_says_what_is_wrong(
    web: TestClient, path: str, says: str, page_headers: dict[str, str | None]
) -> None:
    response = web.get(path)
    assert response.status_code == 400, response.text[:300]
    assert "<h1>Bad request</h1>" in response.text and says in response.text
    assert security(response) == page_headers


def test_a_posted_nul_character_is_a_400_that_changes_nothing(
    web: TestClient, client: Client
) -> None:
    response = web.post("/queue/pause", data={"name": "emails\x00", "csrf": _csrf(web)})
    assert response.status_code == 400 and "NUL character" in response.text
    assert not any(r.paused for r in client.run(queries.OVERVIEW) if r.name == "emails")


@pytest.mark.parametrize("mounted", [False, True])
def test_an_unhandled_error_is_a_500_with_the_same_headers(
    dsn: str, seeded: dict[str, Any], monkeypatch: pytest.MonkeyPatch, mounted: bool
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug in the queue page's query")

    dashboard = create_app(dsn, allow_owner=True)
    app: Any = dashboard
    if mounted:
        app = Starlette(
            routes=[Mount("/ops", app=dashboard)],
            lifespan=lambda app: dashboard.router.lifespan_context(dashboard),
        )
    root = "/ops" if mounted else ""
    with TestClient(app, raise_server_exceptions=False) as web:
        expected = security(web.get(f"{root}/"))
        monkeypatch.setattr(queries, "peek_shown", broken)
        response = web.get(f"{root}/queue?name=emails")
    assert response.status_code == 500
    assert "a bug" not in response.text
    assert security(response) == expected
    assert expected["cache-control"] == "no-store"


def test_refusals_redirects_and_static_files_carry_the_same_headers(
    dsn: str, seeded: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_WEB_BASIC_AUTH", "alice:correct-horse")
    app = create_app(dsn, allow_owner=True, allowed_hosts=["testserver"])
    with TestClient(app, raise_server_exceptions=False) as web:
        expected = security(web.get("/", auth=("alice", "correct-horse")))
        answers = {
            401: web.get("/poison"),
            400: web.get("/", headers={"host": "evil.example"}),
            403: web.post(
                "/queue/pause",
                data={"name": "emails"},
                auth=("alice", "correct-horse"),
                headers={"origin": "https://evil.example"},
            ),
            200: web.get("/static/app.js"),
            404: web.get("/static/nope.js"),
        }
    monkeypatch.delenv("PGQUEUE_WEB_BASIC_AUTH")
    monkeypatch.setenv("PGQUEUE_WEB_TOKEN", "t" * 24)
    with TestClient(create_app(dsn, allow_owner=True)) as web:
        token_answers = {
            303: web.get("/barriers", follow_redirects=False),
            403: web.post("/login", data={"token": "wrong"}),
            405: web.request("DELETE", "/login"),
        }
    for status, response in [*answers.items(), *token_answers.items()]:
        assert response.status_code == status, (status, response.text[:200])
        assert security(response) == expected, status
