"""pgqueue.testing as a user meets it: the plugin (via pytester), drain() and the assertions.

The plugin's runs are pytest subprocesses in a directory of their own, given
this suite's server with --pgqueue-dsn; drain() and the assertions are called
directly on this suite's per-test database.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.db import refused_dsn

import pgqueue
from pgqueue.testing import (
    Drained,
    DrainLimitReached,
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued,
)

pytest_plugins = ["pytester"]

DOCS = Path(__file__).resolve().parents[2] / "docs"
HEADING = "## Testing mode"


def doc_files() -> dict[str, str]:
    """The section's python snippets by the file name on their first line (`# tasks.py`).

    The section lives in docs/integrations.md once merged there, else in
    docs/integrations/testing.md; it ends at the next `## ` heading.
    """
    merged = DOCS / "integrations.md"
    text = merged.read_text() if merged.exists() else ""
    if HEADING not in text:
        text = (DOCS / "integrations" / "testing.md").read_text()
    section = text[text.index(HEADING) :]
    end = section.find("\n## ", len(HEADING))
    section = section if end < 0 else section[:end]
    return dict(re.findall(r"```python\n# (\S+\.py)\n(.*?)```", section, re.S))


def run_suite(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


# -- the plugin, as a user's suite uses it -----------------------------------


def test_the_docs_example_suite_passes(pytester: pytest.Pytester, server_dsn: str) -> None:
    files = doc_files()
    assert sorted(files) == ["conftest.py", "tasks.py", "test_tasks.py"]
    for name, text in files.items():
        pytester.path.joinpath(name).write_text(text)
    result = run_suite(pytester, f"--pgqueue-dsn={server_dsn}")
    result.assert_outcomes(passed=5)


def test_a_failing_assertion_lists_what_is_enqueued(
    pytester: pytest.Pytester, server_dsn: str
) -> None:
    pytester.makepyfile(
        test_user="""
        from pgqueue.testing import assert_enqueued

        def test_wrong_recipient(pgqueue_client):
            pgqueue_client.create_queue("emails")
            pgqueue_client.send("emails", {"to": "ada@example.com", "template": "welcome"})
            assert_enqueued(pgqueue_client, "emails", {"to": "bob@example.com"}, count=1)
        """
    )
    result = run_suite(pytester, "-p", "pgqueue.testing", f"--pgqueue-dsn={server_dsn}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*expected 1 message(s) in 'emails' matching {'to': 'bob@example.com'}, found 0;"
            " 1 enqueued:",
            "*msg_id=1 read_ct=0 {'to': 'ada@example.com', 'template': 'welcome'}",
        ]
    )


ISOLATION = """
import pytest
from pgqueue.testing import assert_enqueued, assert_not_enqueued

@pytest.mark.parametrize("n", range(6))
def test_sees_only_its_own_messages(pgqueue_client, pgqueue_dsn, n):
    with pgqueue_client.connection() as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]
    with open("databases.txt", "a") as f:
        f.write(name + "\\n")
    pgqueue_client.create_queue("jobs")  # each test's database has no queue yet
    assert_not_enqueued(pgqueue_client, "jobs")
    pgqueue_client.send("jobs", {"n": n})
    assert_enqueued(pgqueue_client, "jobs", count=1)
    assert_enqueued(pgqueue_client, "jobs", {"n": n})
"""


@pytest.mark.parametrize("xdist", [False, True], ids=["serial-by-env", "xdist-by-flag"])
def test_each_test_gets_its_own_database_dropped_after_it(
    pytester: pytest.Pytester, server_dsn: str, xdist: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_isolation=ISOLATION)
    if xdist:  # the flag wins over a variable naming a server that does not answer
        monkeypatch.setenv("PGQUEUE_TEST_DSN", refused_dsn())
        args = ["-n", "2", f"--pgqueue-dsn={server_dsn}"]
    else:
        monkeypatch.setenv("PGQUEUE_TEST_DSN", server_dsn)
        args = []
    result = run_suite(pytester, "-p", "pgqueue.testing", *args)
    result.assert_outcomes(passed=6)
    names = pytester.path.joinpath("databases.txt").read_text().split()
    assert len(set(names)) == 6
    assert all(name.startswith("pgqueue_test_") for name in names)
    with psycopg.connect(server_dsn) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,)
        ).fetchall()
    assert left == []


def test_without_a_server_the_tests_skip_saying_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGQUEUE_TEST_DSN", raising=False)
    pytester.makepyfile(
        test_user="""
        def test_needs_a_database(pgqueue_client):
            pass

        def test_needs_nothing():
            pass
        """
    )
    result = run_suite(pytester, "-p", "pgqueue.testing", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs a Postgres server: set PGQUEUE_TEST_DSN or pass*"])


def test_loading_the_plugin_connects_to_nothing(pytester: pytest.Pytester) -> None:
    # A DSN nobody answers: tests that need no database run, and do not wait on it.
    pytester.makepyfile(test_user="def test_plain():\n    pass\n")
    result = run_suite(pytester, "-p", "pgqueue.testing", f"--pgqueue-dsn={refused_dsn()}")
    result.assert_outcomes(passed=1)


def test_a_server_that_does_not_answer_fails_the_tests_that_need_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_user="def test_db(pgqueue_dsn):\n    pass\n")
    result = run_suite(pytester, "-p", "pgqueue.testing", f"--pgqueue-dsn={refused_dsn()}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*the server of --pgqueue-dsn did not answer*"])


# -- drain --------------------------------------------------------------------


def test_drain_runs_sync_async_and_batch_handlers_and_empties_the_queues(
    client: pgqueue.Client,
) -> None:
    app = pgqueue.App()
    seen: list[tuple[str, Any]] = []

    @app.handler("plain")
    def plain(msg: pgqueue.Message) -> None:
        seen.append(("plain", msg.message["n"]))

    @app.handler("coro")
    async def coro(msg: pgqueue.Message) -> None:
        await asyncio.sleep(0)
        seen.append(("coro", msg.message["n"]))

    @app.handler("bulk", batch=True)
    def bulk(msgs: list[pgqueue.Message]) -> None:
        seen.append(("bulk", [m.message["n"] for m in msgs]))

    for q in ("plain", "coro", "bulk"):
        client.create_queue(q)
        client.send_batch(q, [{"n": n} for n in range(3)])

    drained = drain(client, app)

    assert drained.counts() == {"acked": 9, "retried": 0, "poisoned": 0, "failed": 0}
    assert len(drained) == 9
    assert [v for k, v in seen if k == "plain"] == [0, 1, 2]
    assert [v for k, v in seen if k == "coro"] == [0, 1, 2]
    assert [v for k, v in seen if k == "bulk"] == [[0, 1, 2]]
    for q in ("plain", "coro", "bulk"):
        assert_not_enqueued(client, q)
        assert client.metrics(q).queue_length == 0


def test_drain_of_one_queue_leaves_the_others(client: pgqueue.Client) -> None:
    app = pgqueue.App()
    app.handler("a")(lambda msg: None)
    app.handler("b")(lambda msg: None)
    for q in ("a", "b"):
        client.create_queue(q)
        client.send(q, {"q": q})
    drain(client, app, "a")
    assert_not_enqueued(client, "a")
    assert_enqueued(client, "b", {"q": "b"}, count=1)


def test_drain_reraises_a_handlers_error_and_nacks_its_message(client: pgqueue.Client) -> None:
    app = pgqueue.App()
    ran: list[int] = []

    @app.handler("jobs")
    def handle(msg: pgqueue.Message) -> None:
        ran.append(msg.message["n"])
        if msg.message["n"] == 1:
            raise KeyError("no such customer")

    client.create_queue("jobs", max_attempts=3)
    client.send_batch("jobs", [{"n": 0}, {"n": 1}, {"n": 2}])

    with pytest.raises(KeyError, match="no such customer") as info:
        drain(client, app, "jobs")

    assert ran == [0, 1]  # the first error stops the drain
    assert any("'jobs'" in note and "msg_id 2" in note for note in info.value.__notes__)
    [failed, rest] = enqueued(client, "jobs")
    assert (failed.message, failed.read_ct) == ({"n": 1}, 1)
    assert "KeyError" in (failed.last_error or "")
    assert (rest.message, rest.read_ct) == ({"n": 2}, 0)


def test_drain_without_raising_runs_a_failing_message_until_it_is_poisoned(
    client: pgqueue.Client,
) -> None:
    app = pgqueue.App()

    @app.handler("jobs")
    def handle(msg: pgqueue.Message) -> None:
        raise RuntimeError("always")

    client.create_queue("jobs", max_attempts=3)
    client.send("jobs", {"n": 1})

    drained = drain(client, app, raise_errors=False)

    assert [m.read_ct for m in drained.failed] == [1, 2]
    assert [m.read_ct for m in drained.poisoned] == [3]
    assert_not_enqueued(client, "jobs")
    [poisoned] = client.poison_list("jobs")
    assert "RuntimeError: always" in poisoned.reason


def test_poison_and_retry_are_the_handlers_decisions_not_raised(client: pgqueue.Client) -> None:
    app = pgqueue.App()

    @app.handler("jobs")
    def handle(msg: pgqueue.Message) -> None:
        if msg.message["do"] == "poison":
            raise pgqueue.Poison("bad payload")
        raise pgqueue.Retry("later", delay=3600)

    client.create_queue("jobs")
    client.send_batch("jobs", [{"do": "poison"}, {"do": "retry"}])

    drained = drain(client, app)

    assert [m.message for m in drained.poisoned] == [{"do": "poison"}]
    assert [m.message for m in drained.retried] == [{"do": "retry"}]
    assert client.poison_list("jobs")[0].reason == "bad payload"
    assert_enqueued(client, "jobs", {"do": "retry"}, count=1)  # delayed an hour, still there


def test_a_fan_outs_callback_runs_exactly_once_after_its_members(client: pgqueue.Client) -> None:
    app = pgqueue.App()
    order: list[str] = []
    callbacks: list[pgqueue.Message] = []

    @app.handler("resize")
    def resize(msg: pgqueue.Message) -> dict[str, int]:
        order.append("member")
        return {"px": msg.message["photo"] * 10}

    @app.handler("album_done")
    def done(msg: pgqueue.Message) -> None:
        order.append("callback")
        callbacks.append(msg)

    client.create_queue("resize")
    client.create_queue("album_done")
    barrier_id = client.fan_out(
        "resize",
        [{"photo": n} for n in range(4)],
        callback_queue="album_done",
        callback_message={"album": 7},
    )

    drained = drain(client, app)

    assert order == ["member"] * 4 + ["callback"]
    [callback] = callbacks
    assert callback.is_callback and callback.message == {"album": 7}
    assert callback.callback is not None and callback.callback.succeeded == 4
    assert client.barrier_status(barrier_id).state == "fired"
    assert sorted(r.result["px"] for r in client.barrier_results(barrier_id)) == [0, 10, 20, 30]
    assert len(drained.acked) == 5
    assert drain(client, app).counts()["acked"] == 0  # nothing left to run: no second callback


@pytest.fixture
def ledger(client: pgqueue.Client) -> str:
    with client.connection() as conn:
        conn.execute("CREATE TABLE ledger (n int)")
    return "ledger"


def ledger_rows(client: pgqueue.Client) -> list[int]:
    with client.connection() as conn:
        return [r[0] for r in conn.execute("SELECT n FROM ledger ORDER BY n").fetchall()]


def test_a_transactional_handler_commits_its_writes_with_the_ack(
    client: pgqueue.Client, ledger: str
) -> None:
    app = pgqueue.App()

    @app.handler("jobs", transactional=True)
    def handle(msg: pgqueue.Message, conn: Any) -> None:
        conn.execute("INSERT INTO ledger VALUES (%s)", (msg.message["n"],))

    client.create_queue("jobs")
    client.send_batch("jobs", [{"n": 1}, {"n": 2}])
    assert drain(client, app).counts()["acked"] == 2
    assert ledger_rows(client) == [1, 2]
    assert_not_enqueued(client, "jobs")


def test_a_failing_transactional_handler_rolls_its_writes_back(
    client: pgqueue.Client, ledger: str
) -> None:
    app = pgqueue.App()

    @app.handler("jobs", transactional=True)
    def handle(msg: pgqueue.Message, conn: Any) -> None:
        conn.execute("INSERT INTO ledger VALUES (%s)", (msg.message["n"],))
        raise ValueError("after the write")

    client.create_queue("jobs")
    client.send("jobs", {"n": 1})
    with pytest.raises(ValueError, match="after the write"):
        drain(client, app)
    assert ledger_rows(client) == []
    assert_enqueued(client, "jobs", {"n": 1}, count=1)


def test_a_transactional_batch_handler_gets_the_batch_and_the_connection(
    client: pgqueue.Client, ledger: str
) -> None:
    app = pgqueue.App()

    @app.handler("jobs", transactional=True, batch=True)
    def handle(msgs: list[pgqueue.Message], conn: Any) -> None:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO ledger VALUES (%s)", [(m.message["n"],) for m in msgs])

    client.create_queue("jobs")
    client.send_batch("jobs", [{"n": n} for n in range(5)])
    drained = drain(client, app, batch_size=2)
    assert len(drained.acked) == 5
    assert ledger_rows(client) == [0, 1, 2, 3, 4]


def test_a_handler_that_always_resends_hits_the_limit(client: pgqueue.Client) -> None:
    app = pgqueue.App()

    @app.handler("loop")
    def again(msg: pgqueue.Message) -> None:
        client.send("loop", {"n": msg.message["n"] + 1})

    client.create_queue("loop")
    client.send("loop", {"n": 0})
    with pytest.raises(DrainLimitReached, match="5 messages ran"):
        drain(client, app, max_messages=5)
    [left] = enqueued(client, "loop")
    assert left.message == {"n": 5}
    assert client.read("loop", vt=30)  # given back: visible, not leased by the stopped drain


def test_drain_from_an_async_test_runs_async_handlers(client: pgqueue.Client) -> None:
    app = pgqueue.App()
    seen: list[int] = []

    @app.handler("jobs")
    async def handle(msg: pgqueue.Message) -> None:
        await asyncio.sleep(0)
        seen.append(msg.message["n"])

    client.create_queue("jobs")
    client.send_batch("jobs", [{"n": 1}, {"n": 2}])

    async def a_test() -> Drained:
        return drain(client, app)  # a loop is running in this thread

    assert len(asyncio.run(a_test())) == 2
    assert seen == [1, 2]


# -- assertions ---------------------------------------------------------------


def test_assert_enqueued_matches_a_subset_of_the_payload_and_headers(
    client: pgqueue.Client,
) -> None:
    client.create_queue("emails")
    client.send("emails", {"to": "ada", "meta": {"lang": "en", "v": 2}}, headers={"trace": "t1"})
    client.send("emails", {"to": "bob", "urgent": True})

    [ada] = assert_enqueued(client, "emails", {"meta": {"lang": "en"}})
    assert ada.message["to"] == "ada"
    assert_enqueued(client, "emails", count=2)
    assert_enqueued(client, "emails", headers={"trace": "t1"}, count=1)
    assert_enqueued(client, "emails", {"to": "bob"}, headers=None)
    assert_not_enqueued(client, "emails", {"urgent": 1})  # JSON true is not 1
    assert_not_enqueued(client, "emails", {"to": "ada"}, headers={"trace": "t2"})
    assert_not_enqueued(client, "emails", {"to": "carol"})


def test_assert_enqueued_fails_listing_the_queue(client: pgqueue.Client) -> None:
    client.create_queue("emails")
    client.send_batch("emails", [{"to": "ada"}, {"to": "bob"}])
    with pytest.raises(AssertionError) as info:
        assert_enqueued(client, "emails", {"to": "ada"}, count=2)
    text = str(info.value)
    assert "expected 2 message(s) in 'emails' matching {'to': 'ada'}, found 1; 2 enqueued" in text
    assert "msg_id=1 read_ct=0 {'to': 'ada'}" in text and "msg_id=2 read_ct=0 {'to': 'bob'}" in text


def test_assert_not_enqueued_fails_listing_the_matches(client: pgqueue.Client) -> None:
    client.create_queue("emails")
    client.send_batch("emails", [{"to": "ada"}, {"to": "bob"}])
    with pytest.raises(AssertionError, match=r"expected no message in 'emails', found 2") as info:
        assert_not_enqueued(client, "emails")
    assert "{'to': 'bob'}" in str(info.value)


def test_enqueued_pages_through_a_long_queue_and_leases_nothing(client: pgqueue.Client) -> None:
    client.create_queue("big")
    client.send_batch("big", [{"n": n} for n in range(2500)])
    live = enqueued(client, "big")
    assert [m.message["n"] for m in live] == list(range(2500))
    assert all(m.read_ct == 0 for m in live)
    assert len(client.read("big", vt=30, qty=3000)) == 2500
