"""A huge payload costs a page nothing: no page reads (detoasts) a payload stored large.

The cost is counted, not timed: EXPLAIN (ANALYZE, BUFFERS) of each page's own
query says how many buffers it touched, which no load on the machine changes.
The payloads are random hex, which Postgres cannot compress, so each is
stored out of line in its full size.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from support.extras import needs_extra

needs_extra("web")

from starlette.testclient import TestClient

from pgqueue import Client
from pgqueue._calls import Call
from pgqueue._web import queries
from pgqueue.web import create_app

BIG = 4 << 20  # bytes of each huge payload
PAGE_QTY = 51  # what the pages ask for: a page and one more


def _send_random(sql: Any, queue: str, nbytes: int) -> int:
    """A message of about nbytes of random hex (incompressible); its msg_id."""
    row = sql.execute(
        "SELECT pgqueue.send(%s, jsonb_build_object('blob',"
        " (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, %s))))",
        (queue, nbytes // 32),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _toast_pages(sql: Any, table: str) -> int:
    """The pages of a table's TOAST relation: what reading every payload stored there costs."""
    row = sql.execute(
        "SELECT pg_relation_size(reltoastrelid) / current_setting('block_size')::int"
        " FROM pg_class WHERE oid = %s::regclass",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _buffers(sql: Any, call: Call[Any]) -> int:
    """The shared, local and temporary buffers one run of a page's query touches."""
    sql.execute(call.sql, call.params).fetchall()  # once first: plans and catalog cached
    [[plan]] = sql.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + call.sql, call.params)
    top = plan[0]["Plan"]
    kinds = ("Shared Hit", "Shared Read", "Local Hit", "Local Read", "Temp Read")
    return sum(int(top[f"{kind} Blocks"]) for kind in kinds)


@pytest.fixture
def huge(client: Client, sql: Any) -> dict[str, Any]:
    """Queue `huge`: two live 4 MB payloads and a small one; two 4 MB ones poisoned."""
    client.create_queue("huge")
    big = [_send_random(sql, "huge", BIG) for _ in range(4)]
    small = client.send("huge", {"small": "payload"})
    for msg_id in big[2:]:
        client.poison("huge", msg_id, "too big to handle")
    sizes = sql.execute(
        "SELECT pg_column_size(message), pg_column_compression(message) FROM pgqueue.message"
        " UNION ALL SELECT pg_column_size(message), pg_column_compression(message)"
        " FROM pgqueue.poison"
    ).fetchall()
    # the premise: stored uncompressed, in their whole size (so out of line)
    assert sum(1 for size, method in sizes if size > BIG and method is None) == 4
    return {"live": big[:2], "poisoned": big[2:], "small": small}


def test_the_preview_bound_is_the_one_poison_page_uses(sql: Any) -> None:
    [[body]] = sql.execute(
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'pgqueue' AND p.proname = 'poison_page'"
    ).fetchall()
    [bound] = re.findall(r"c_preview_bytes\s+constant\s+integer\s*:=\s*(\d+)", body)
    assert int(bound) == queries.PREVIEW_BYTES


@pytest.mark.parametrize("page", ["queue", "poison", "poison, all queues", "poison message"])
def test_a_page_of_huge_payloads_reads_none_of_them(
    huge: dict[str, Any], sql: Any, page: str
) -> None:
    call: Call[Any]
    if page == "queue":
        call, table = queries.peek_shown("huge", PAGE_QTY, 0), "pgqueue.message"
    elif page == "poison message":
        call = queries.poison_shown("huge", huge["poisoned"][0], 65_536)
        table = "pgqueue.poison"
    else:
        queue = "huge" if page == "poison" else None
        call = queries.poison_page(queue, PAGE_QTY, None, None, None, None, 30_000)
        table = "pgqueue.poison"
    pages = _toast_pages(sql, table)
    assert pages > 900  # at least two 4 MB payloads: reading them touches as many pages
    assert _buffers(sql, call) < pages // 20


def test_the_poison_message_page_reads_and_indents_its_payload_once(
    client: Client, sql: Any
) -> None:
    client.create_queue("mid")
    msg_id = _send_random(sql, "mid", 900_000)  # shown in full: under PRETTY_BYTES
    client.poison("mid", msg_id, "too big to handle")
    call = queries.poison_shown("mid", msg_id, 65_536)
    [[stored]] = sql.execute("SELECT pg_column_size(message) FROM pgqueue.poison").fetchall()
    assert 800_000 < stored <= queries.PRETTY_BYTES
    pages = _toast_pages(sql, "pgqueue.poison")
    # one read costs its pages and a few index pages; each further read as much again
    assert pages <= _buffers(sql, call) < pages * 1.5
    shown = client.run(call)
    assert shown is not None and shown.payload is not None
    assert shown.payload.startswith('{\n    "blob": "') and shown.payload_chars > stored


@pytest.fixture
def web(dsn: str, huge: dict[str, Any]) -> Iterator[TestClient]:
    """The app on the database holding `huge`."""
    with TestClient(create_app(dsn, allow_owner=True, secret="s" * 32)) as tc:
        yield tc


def test_pages_give_a_huge_payloads_size_and_the_command_that_prints_it(
    web: TestClient, huge: dict[str, Any], sql: Any
) -> None:
    [[blob_start]] = sql.execute(
        "SELECT left(message->>'blob', 40) FROM pgqueue.message WHERE msg_id = %s",
        (huge["live"][0],),
    ).fetchall()
    first, _ = huge["live"]
    queue = web.get("/queue?name=huge")
    assert queue.status_code == 200
    assert queue.text.count("stored in 4.0 MB: too large to preview here") == 2
    assert f"pgqueue peek huge --after {first - 1} --limit 1 --json" in queue.text
    assert "{&#34;small&#34;: &#34;payload&#34;}" in queue.text  # a small one still previewed
    assert blob_start not in queue.text

    poison = web.get("/poison?queue=huge")
    assert poison.status_code == 200
    assert poison.text.count("stored in 4.0 MB: too large to preview here") == 2
    for msg_id in huge["poisoned"]:
        assert f"pgqueue poison show huge {msg_id}" in poison.text

    one = huge["poisoned"][0]
    page = web.get(f"/poison/message?queue=huge&id={one}")
    assert page.status_code == 200
    assert "Stored in 4.0 MB: too large to show here" in page.text
    assert "documents stored in up to 1.0 MB" in page.text
    assert f"pgqueue poison show huge {one}" in page.text
    assert '"blob"' not in page.text and "&#34;blob&#34;" not in page.text
