"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright.

Skipped with the reason when Playwright or the browser is missing, unless
PGQUEUE_REQUIRE_BROWSER=1 (CI sets it once it installed Chromium): then a
missing browser fails. Screenshots of every page, wide and narrow, go to
$PGQUEUE_ARTIFACTS/screenshots (default: the test's temporary directory).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.extras import needs_extra

needs_extra("web")

from support.dashboard_data import seed
from support.processes import prepare

from pgqueue import Client

REQUIRED = os.environ.get("PGQUEUE_REQUIRE_BROWSER") == "1"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"PGQUEUE_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def _chromium() -> str:
    for candidate in (os.environ.get("PGQUEUE_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (path := shutil.which(candidate)):
            return path
    _unavailable("no chromium on this machine (apt-get install chromium)")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for this module's tests."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright)")
    executable = _chromium()
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        except Error as exc:
            _unavailable(f"chromium did not start: {str(exc).splitlines()[0]}")
        yield b
        b.close()


class Served:
    """The dashboard served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    """serve(**create_app kwargs): the dashboard on a port of its own, stopped at the end."""
    from pgqueue.web import create_app

    served: list[Served] = []

    def start(dsn: str, **kw: Any) -> Served:
        s = Served(create_app(dsn, allow_owner=True, **kw))
        served.append(s)
        return s

    yield start
    for s in served:
        s.stop()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """Where screenshots go."""
    root = Path(os.environ.get("PGQUEUE_ARTIFACTS") or tmp_path)
    out = root / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def data(client: Client, dsn: str, spawn: Any) -> dict[str, Any]:
    """The sample data, and a real worker process registered and running."""
    seeded = seed(client)
    prepare(dsn).close()
    worker = spawn(dsn, "--concurrency", "2")
    deadline = time.monotonic() + 30
    while not client.list_workers():
        assert worker.p.poll() is None, worker.log.read_text()[-2000:]
        assert time.monotonic() < deadline, "the worker never registered"
        time.sleep(0.2)
    return seeded


class Guarded:
    """A page that fails the test on any dialog, uncaught error or console error."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.problems: list[str] = []
        page.on("dialog", lambda d: (self.problems.append(f"dialog: {d.message}"), d.dismiss()))
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on(
            "console",
            lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"),
        )

    def check(self) -> None:
        assert self.problems == []
        assert self.page.evaluate("typeof window.__pwned") == "undefined"


PAGES = [
    ("overview", "/", "emails"),
    ("queue", "/queue?name=emails", "user3@example.com"),
    ("queue-paused", "/queue?name=reports", "paused"),
    ("poison", "/poison", "TimeoutError: warehouse API"),
    ("poison-message", "/poison/message?queue=orders&id={hostile}", "window.__pwned=1"),
    ("barriers", "/barriers", "invoice-2026-11"),
    ("barrier-open", "/barrier?id=invoice-2026-11", "card declined"),
    ("barrier-fired", "/barrier?id=digest-42", "as message"),
    ("workflows", "/workflows", "nightly-etl"),
    ("workflow", "/workflow?id=nightly-etl", "transform"),
    ("workers", "/workers", "alive"),
]


def test_every_page_renders_cleanly_wide_and_narrow(
    browser: Any, serve: Any, dsn: str, data: dict[str, Any], artifacts: Path
) -> None:
    app = serve(dsn)
    for size_name, size in (("1280", WIDE), ("390", NARROW)):
        context = browser.new_context(viewport=size)
        page = Guarded(context.new_page())
        for name, path, text in PAGES:
            page.page.goto(app.url + path.format(hostile=data["poisoned"][0]))
            assert page.page.get_by_text(text, exact=False).first.is_visible(), (name, text)
            overflow = page.page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 1, f"{name} at {size_name}px scrolls sideways by {overflow}px"
            page.page.screenshot(path=str(artifacts / f"{name}-{size_name}.png"), full_page=True)
        page.check()
        context.close()


def test_requeue_by_clicking_and_confirming(
    browser: Any, serve: Any, dsn: str, client: Client, data: dict[str, Any]
) -> None:
    app = serve(dsn)
    page = Guarded(browser.new_page(viewport=WIDE))
    target = data["poisoned"][2]
    page.page.goto(app.url + "/poison?queue=orders")
    page.page.get_by_label(f"select orders {target}").check()
    page.page.get_by_role("button", name="Requeue selected").click()
    assert page.page.locator("#confirm-question").inner_text() == "Requeue 1 message?"
    assert client.poison_get("orders", target) is not None
    page.page.locator("#confirm").click()
    page.page.wait_for_url("**/poison?done=*")
    assert "Requeued 1 message." in page.page.inner_text("main")
    assert client.poison_get("orders", target) is None
    page.check()


def test_pause_by_clicking(browser: Any, serve: Any, dsn: str, client: Client, data: Any) -> None:
    app = serve(dsn)
    page = Guarded(browser.new_page(viewport=WIDE))
    page.page.goto(app.url + "/queue?name=emails")
    page.page.get_by_role("button", name="Pause").click()
    page.page.wait_for_url("**done=paused")
    assert page.page.get_by_role("button", name="Resume").is_visible()
    assert client.read("emails", vt=5, qty=1) == []
    page.check()


def test_a_hostile_payload_shows_as_text_and_never_runs(
    browser: Any, serve: Any, dsn: str, data: dict[str, Any]
) -> None:
    app = serve(dsn)
    page = Guarded(browser.new_page(viewport=WIDE))
    for path in ("/poison", f"/poison/message?queue=orders&id={data['poisoned'][0]}"):
        page.page.goto(app.url + path)
        assert "<script>window.__pwned=1</script>" in page.page.inner_text("main")
        assert page.page.locator("main script, main img").count() == 0
    page.check()


def test_posts_without_a_token_or_from_another_origin_are_refused(
    browser: Any, serve: Any, dsn: str, client: Client, data: Any
) -> None:
    app = serve(dsn)
    page = Guarded(browser.new_page(viewport=WIDE))
    page.page.goto(app.url + "/queue?name=emails")
    token = page.page.locator("input[name=csrf]").first.get_attribute("value")
    bare = page.page.request.post(app.url + "/queue/pause", form={"name": "emails"})
    foreign = page.page.request.post(
        app.url + "/queue/pause",
        form={"name": "emails", "csrf": token},
        headers={"Origin": "https://evil.example"},
    )
    assert (bare.status, foreign.status) == (403, 403)
    assert client.read("emails", vt=1, qty=1) != []  # not paused


def test_read_only_offers_no_action(browser: Any, serve: Any, dsn: str, data: Any) -> None:
    app = serve(dsn, read_only=True)
    page = Guarded(browser.new_page(viewport=WIDE))
    for name, path, text in PAGES:
        page.page.goto(app.url + path.format(hostile=data["poisoned"][0]))
        assert page.page.get_by_text(text, exact=False).first.is_visible(), name
        assert page.page.locator("form[method=post]").count() == 0, name
        assert page.page.locator("input[type=checkbox]").count() == 0, name
    assert "read-only" in page.page.inner_text("header")
    page.check()


def test_the_overview_refreshes_itself(
    browser: Any, serve: Any, dsn: str, client: Client, data: Any
) -> None:
    app = serve(dsn)
    page = Guarded(browser.new_page(viewport=WIDE))
    page.page.goto(app.url + "/?q=emails")
    cell = page.page.locator("td[data-label=Visible]").first
    before = int(cell.inner_text())
    client.send_batch("emails", [{"n": i} for i in range(5)])
    deadline = time.monotonic() + 20
    while int(cell.inner_text()) < before + 5:  # no reload: the page's script swaps the figures
        assert time.monotonic() < deadline, "the overview never refreshed"
        page.page.wait_for_timeout(250)
    page.check()
