"""Topics through the pgmq facade (sql/pgmq/20_topics.sql): PGMQ 1.13's bind_topic, send_topic, ...

Each function on its own; the matching rules against a small model of PGMQ's
`*`/`#` (hypothesis); the same calls against real PGMQ give the same results
(a differential test); bindings go away with their queue, also when the drop
races the bind or the send; hostile patterns and keys are refused. Every error
PGMQ's suites check is raised as real PGMQ raises it: SQLSTATE P0001, PGMQ's
text, no hint, and the CONTEXT lines psql prints (differential tests, below).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from functools import cache
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import errors, sql
from psycopg.types.json import Jsonb

from pgqueue._pgmq import install


@pytest.fixture
def topics_dsn(facade_dsn: str) -> str:
    """A fresh database with the facade installed (20_topics.sql among its files)."""
    return facade_dsn


@pytest.fixture
def conn(topics_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the facade database."""
    with psycopg.connect(topics_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def real(real_pgmq_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to a database holding real PGMQ."""
    with psycopg.connect(real_pgmq_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def queue_q(conn: psycopg.Connection[Any], real: psycopg.Connection[Any]) -> None:
    """Queue `q` in both databases."""
    create_queue(conn, "q")
    create_queue(real, "q")


def create_queue(conn: psycopg.Connection[Any], name: str) -> None:
    """Create a queue as a PGMQ client would."""
    conn.execute("SELECT pgmq.create(%s)", (name,))


def bindings(conn: psycopg.Connection[Any], queue: str | None = None) -> list[tuple[str, str, str]]:
    """list_topic_bindings, in its order, without bound_at."""
    if queue is None:
        rows = conn.execute("SELECT * FROM pgmq.list_topic_bindings()").fetchall()
    else:
        rows = conn.execute("SELECT * FROM pgmq.list_topic_bindings(%s)", (queue,)).fetchall()
    return [(r[0], r[1], r[3]) for r in rows]


def routing(conn: psycopg.Connection[Any], key: str) -> list[tuple[str, str, str]]:
    """test_routing's rows."""
    return [tuple(r) for r in conn.execute("SELECT * FROM pgmq.test_routing(%s)", (key,))]


def facade_messages(conn: psycopg.Connection[Any]) -> list[tuple[str, int, Any, Any]]:
    """Every live message of every queue: (PGMQ's queue name, msg_id, message, headers), sorted."""
    rows = conn.execute(
        "SELECT pgmq._pgmq_name(q.queue_name), m.msg_id, m.message, m.headers"
        "  FROM pgqueue.message m JOIN pgqueue.queue q USING (queue_id)"
    ).fetchall()
    return sorted((str(r[0]), int(r[1]), r[2], r[3]) for r in rows)


def real_messages(
    conn: psycopg.Connection[Any], queues: list[str]
) -> list[tuple[str, int, Any, Any]]:
    """The same, from real PGMQ's queue tables."""
    out: list[tuple[str, int, Any, Any]] = []
    for q in queues:
        query = sql.SQL("SELECT msg_id, message, headers FROM pgmq.{}").format(
            sql.Identifier(f"q_{q.lower()}")
        )
        out.extend((q, r[0], r[1], r[2]) for r in conn.execute(query))
    return sorted(out)


Failure = tuple[str | None, str | None, str | None, str | None, str | None, list[str]]


def failure(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Failure | None:
    """What the statement raises, as psql shows it: (SQLSTATE, message, detail, hint,
    context, the notices before it); None when it succeeds. Rolled back either way."""
    said: list[str] = []

    def keep(d: psycopg.errors.Diagnostic) -> None:
        said.append(f"{d.severity_nonlocalized}: {d.message_primary}")

    conn.add_notice_handler(keep)
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(query, params)
    except psycopg.Error as exc:
        d = exc.diag
        return (d.sqlstate, d.message_primary, d.message_detail, d.message_hint, d.context, said)
    finally:
        conn.remove_notice_handler(keep)
    return None


# -- the matching rules ---------------------------------------------------------


def model_matches(pattern: str, key: str) -> bool:
    """PGMQ's rules: `*` is one or more characters but a dot, `#` any characters (none too)."""

    @cache
    def at(i: int, j: int) -> bool:
        if i == len(pattern):
            return j == len(key)
        c = pattern[i]
        if c == "#":
            return any(at(i + 1, k) for k in range(j, len(key) + 1))
        if c == "*":
            k = j
            while k < len(key) and key[k] != ".":
                k += 1
                if at(i + 1, k):
                    return True
            return False
        return j < len(key) and key[j] == c and at(i + 1, j + 1)

    return at(0, 0)


_KEY_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def model_valid(value: str, wildcards: bool) -> bool:
    """PGMQ's validation of a routing key (wildcards False) or a pattern."""
    allowed = _KEY_CHARS | ({"*", "#"} if wildcards else set())
    if not value or len(value) > 255 or not set(value) <= allowed:
        return False
    if value.startswith(".") or value.endswith(".") or ".." in value:
        return False
    return not any(bad in value for bad in ("**", "##", "*#", "#*"))


PATTERN_WORDS = ["a", "b", "ab", "x-y", "*", "#", "a*", "*b", "#b", "a#"]
KEY_WORDS = ["a", "b", "ab", "abb", "x-y", "z_1"]
patterns = st.lists(st.sampled_from(PATTERN_WORDS), min_size=1, max_size=4).map(".".join)
keys = st.lists(st.sampled_from(KEY_WORDS), min_size=1, max_size=5).map(".".join)


RULE_CASES = [
    ("logs.*", "logs.error", True),
    ("logs.*", "logs.api.error", False),
    ("logs.#", "logs.api.error", True),
    ("#", "anything.at.all", True),
    ("*.error", "db.error", True),
    ("#.error", "x.y.error", True),
    # PGMQ's `#` is a run of characters, not AMQP's run of words: these differ from AMQP
    ("logs.#", "logs", False),
    ("#.error", "error", False),
    ("a.#.b", "a.b", False),
    ("a.#.b", "a.x.y.b", True),
    ("a*", "abc", True),
    ("a#", "ab.c", True),
    ("logs.error", "logs.errors", False),
    ("logs.error", "Logs.error", False),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), RULE_CASES)
def test_model_states_pgmq_rules(pattern: str, key: str, expected: bool) -> None:
    assert model_matches(pattern, key) is expected


def test_rules_pinned_against_the_facade_and_real_pgmq(
    conn: psycopg.Connection[Any], real: psycopg.Connection[Any]
) -> None:
    cases = [(p, k) for p, k, _ in RULE_CASES]
    for c in (conn, real):
        create_queue(c, "q")
        for p in {p for p, _ in cases}:
            c.execute("SELECT pgmq.bind_topic(%s, 'q')", (p,))
    for pattern, key in cases:
        got = {r[0] for r in routing(conn, key)}
        assert (pattern in got) is model_matches(pattern, key), (pattern, key)
        assert routing(conn, key) == routing(real, key), key


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(pattern=patterns, probe=st.lists(keys, min_size=1, max_size=6))
def test_matching_agrees_with_the_model_and_real_pgmq(
    conn: psycopg.Connection[Any],
    real: psycopg.Connection[Any],
    queue_q: None,
    pattern: str,
    probe: list[str],
) -> None:
    assert model_valid(pattern, True)
    for c in (conn, real):
        with c.transaction(force_rollback=True):
            c.execute("SELECT pgmq.bind_topic(%s, 'q')", (pattern,))
            for key in probe:
                matched = bool(routing(c, key))
                assert matched is model_matches(pattern, key), (c is real, pattern, key)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    value=st.one_of(
        st.text(max_size=12),
        st.text(alphabet="ab.*#-_", max_size=10),
        st.text(alphabet="a.*#\\|()[]^$+?{}'\";% ", max_size=10),
    )
)
def test_validation_agrees_with_the_model_and_real_pgmq(
    conn: psycopg.Connection[Any], real: psycopg.Connection[Any], value: str
) -> None:
    if "\x00" in value:
        return  # text cannot hold NUL at all
    for func, wildcards in (("validate_routing_key", False), ("validate_topic_pattern", True)):
        query = f"SELECT pgmq.{func}(%s)"
        got = failure(conn, query, (value,))
        assert (got is not None) is (not model_valid(value, wildcards)), (func, value)
        assert got == failure(real, query, (value,)), (func, value)  # PGMQ's error exactly


# -- each function ----------------------------------------------------------------

VALID_KEYS = [
    "logs",
    "logs.error",
    "app.user-service.auth",
    "system_events.db.connection_failed",
    "A.9",
]
INVALID_KEYS = [
    "",
    ".logs",
    "logs.",
    "logs..error",
    "logs.error!",
    "logs error",
    "logs.*",
    "logs.#",
    "x" * 256,
    "lögs",
    "a\nb",
]
VALID_PATTERNS = ["logs.*", "logs.#", "*.error", "#.error", "app.*.#", "#", "*", "a-b_c.D9"]
INVALID_PATTERNS = [
    "",
    ".logs.*",
    "logs.*.",
    "logs..error",
    "logs.**",
    "logs.##",
    "logs.*#",
    "logs.#*",
    "logs.error!",
    "x" * 256,
]
HOSTILE = [
    "a|b",
    "(.*)",
    "a\\.b",
    "[a-z]",
    "^a",
    "a$",
    "a+",
    "a?",
    "a{2}",
    "'; DROP TABLE pgmq.topic_bindings; --",
    "a' OR '1'='1",
    "$$",
    "a%b",
    "é",
    " ",
]


def test_validate_routing_key_accepts_or_raises_pgmqs_p0001(conn: psycopg.Connection[Any]) -> None:
    for key in VALID_KEYS:
        assert conn.execute("SELECT pgmq.validate_routing_key(%s)", (key,)).fetchone() == (True,)
    for bad in [*INVALID_KEYS, *HOSTILE, None]:
        with pytest.raises(errors.RaiseException, match=r"^routing_key "):
            conn.execute("SELECT pgmq.validate_routing_key(%s)", (bad,))


def test_validate_topic_pattern_accepts_or_raises_pgmqs_p0001(
    conn: psycopg.Connection[Any],
) -> None:
    for pattern in VALID_PATTERNS:
        assert conn.execute("SELECT pgmq.validate_topic_pattern(%s)", (pattern,)).fetchone() == (
            True,
        )
    for bad in [*INVALID_PATTERNS, *HOSTILE, None]:
        with pytest.raises(errors.RaiseException, match=r"^pattern "):
            conn.execute("SELECT pgmq.validate_topic_pattern(%s)", (bad,))


def test_hostile_patterns_and_keys_change_nothing(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "q")
    conn.execute("SELECT pgmq.bind_topic('#', 'q')")
    for value in HOSTILE:
        with pytest.raises(errors.RaiseException, match=r"^pattern "):
            conn.execute("SELECT pgmq.bind_topic(%s, 'q')", (value,))
        for query in (
            "SELECT pgmq.send_topic(%s, '{}')",
            "SELECT * FROM pgmq.test_routing(%s)",
            "SELECT * FROM pgmq.send_batch_topic(%s, ARRAY['{}'::jsonb])",
        ):
            with pytest.raises(errors.RaiseException, match=r"^routing_key "):
                conn.execute(query, (value,))
        assert conn.execute("SELECT pgmq.unbind_topic(%s, 'q')", (value,)).fetchone() == (False,)
    assert bindings(conn) == [("#", "q", "^.*$")]
    assert facade_messages(conn) == []


def test_a_pattern_written_past_bind_topic_is_refused_by_the_table(
    conn: psycopg.Connection[Any],
) -> None:
    create_queue(conn, "q")
    for value in ["a|b", "(.*)", "logs..x", "**"]:
        with pytest.raises(errors.CheckViolation):
            conn.execute(
                "INSERT INTO pgmq.topic_bindings (pattern, queue_name) VALUES (%s, 'q')", (value,)
            )


def test_bind_topic_binds_once_and_shows_the_compiled_regex(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "orders")
    conn.execute("SELECT pgmq.bind_topic('orders.*.created', 'orders')")
    conn.execute("SELECT pgmq.bind_topic('orders.*.created', 'orders')")  # a no-op
    conn.execute("SELECT pgmq.bind_topic('orders.#', 'orders')")
    assert sorted(bindings(conn)) == [
        ("orders.#", "orders", "^orders\\..*$"),
        ("orders.*.created", "orders", "^orders\\.[^.]+\\.created$"),
    ]


def test_queue_names_are_lowercased_as_the_facade_does(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "mixed")
    conn.execute("SELECT pgmq.bind_topic('k', 'Mixed')")
    assert bindings(conn, "MIXED") == [("k", "mixed", "^k$")]
    assert conn.execute("SELECT pgmq.send_topic('k', '1')").fetchone() == (1,)
    assert conn.execute("SELECT pgmq.unbind_topic('k', 'MiXeD')").fetchone() == (True,)


def test_bind_topic_to_a_missing_queue_raises_pgmqs_error(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(errors.RaiseException, match=r'^Queue "nope" does not exist\.'):
        conn.execute("SELECT pgmq.bind_topic('a.*', 'nope')")
    for queue in (None, ""):
        with pytest.raises(
            errors.RaiseException, match=r"^queue_name cannot be NULL or empty(\n|$)"
        ):
            conn.execute("SELECT pgmq.bind_topic('a.*', %s)", (queue,))
    assert bindings(conn) == []


def test_unbind_topic_says_whether_it_removed_a_binding(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "q")
    conn.execute("SELECT pgmq.bind_topic('a.*', 'q')")
    assert conn.execute("SELECT pgmq.unbind_topic('a.*', 'q')").fetchone() == (True,)
    assert conn.execute("SELECT pgmq.unbind_topic('a.*', 'q')").fetchone() == (False,)
    assert conn.execute("SELECT pgmq.unbind_topic('a.*', 'other')").fetchone() == (False,)
    for args in (("", "q"), (None, "q"), ("a.*", ""), ("a.*", None)):
        with pytest.raises(errors.RaiseException, match="cannot be NULL or empty"):
            conn.execute("SELECT pgmq.unbind_topic(%s, %s)", args)


def test_list_topic_bindings_newest_first_and_per_queue(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "a")
    create_queue(conn, "b")
    for pattern, queue in [("x.*", "a"), ("x.#", "b"), ("#", "a")]:
        conn.execute("SELECT pgmq.bind_topic(%s, %s)", (pattern, queue))  # each its own transaction
    assert [b[:2] for b in bindings(conn)] == [("#", "a"), ("x.#", "b"), ("x.*", "a")]
    assert [b[:2] for b in bindings(conn, "a")] == [("#", "a"), ("x.*", "a")]
    assert bindings(conn, "nope") == []
    cols = conn.execute("SELECT * FROM pgmq.list_topic_bindings() LIMIT 0")
    assert [d.name for d in cols.description or []] == [
        "pattern",
        "queue_name",
        "bound_at",
        "compiled_regex",
    ]


def test_test_routing_lists_the_matching_bindings_by_pattern(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "a")
    create_queue(conn, "b")
    for pattern, queue in [
        ("logs.*", "a"),
        ("logs.#", "b"),
        ("#", "a"),
        ("*.error", "b"),
        ("other", "b"),
    ]:
        conn.execute("SELECT pgmq.bind_topic(%s, %s)", (pattern, queue))
    assert routing(conn, "logs.error") == [
        ("#", "a", "^.*$"),
        ("*.error", "b", "^[^.]+\\.error$"),
        ("logs.#", "b", "^logs\\..*$"),
        ("logs.*", "a", "^logs\\.[^.]+$"),
    ]
    assert routing(conn, "other") == [("#", "a", "^.*$"), ("other", "b", "^other$")]


def test_send_topic_sends_once_to_each_matching_queue(conn: psycopg.Connection[Any]) -> None:
    for q in ("a", "b", "c"):
        create_queue(conn, q)
    for pattern, queue in [("logs.*", "a"), ("logs.#", "a"), ("#.error", "b"), ("audit", "c")]:
        conn.execute("SELECT pgmq.bind_topic(%s, %s)", (pattern, queue))
    assert conn.execute(
        "SELECT pgmq.send_topic('logs.error', %s)", (Jsonb({"n": 1}),)
    ).fetchone() == (2,)
    assert conn.execute("SELECT pgmq.send_topic('nobody.listens', '{}')").fetchone() == (0,)
    assert conn.execute("SELECT pgmq.send_topic('audit', '2', 0)").fetchone() == (1,)
    assert conn.execute(
        "SELECT pgmq.send_topic('x.error', '3', %s, 0)", (Jsonb({"h": 1}),)
    ).fetchone() == (1,)
    assert facade_messages(conn) == [
        ("a", 1, {"n": 1}, None),
        ("b", 1, {"n": 1}, None),
        ("b", 2, 3, {"h": 1}),
        ("c", 1, 2, None),
    ]


def test_send_topic_delays_and_validates(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "a")
    conn.execute("SELECT pgmq.bind_topic('#', 'a')")
    conn.execute("SELECT pgmq.send_topic('k', '1', 30)")
    conn.execute("SELECT pgmq.send_topic('k', '2', NULL, 5)")
    delays = conn.execute(
        "SELECT extract(epoch FROM m.vt - m.enqueued_at)::int"
        "  FROM pgqueue.message m ORDER BY msg_id"
    ).fetchall()
    assert delays == [(30,), (5,)]
    with pytest.raises(errors.RaiseException, match=r"^delay cannot be negative, got: -1(\n|$)"):
        conn.execute("SELECT pgmq.send_topic('k', '1', -1)")
    with pytest.raises(errors.RaiseException, match=r"^msg cannot be NULL(\n|$)"):
        conn.execute("SELECT pgmq.send_topic('k', NULL)")
    # pgqueue's own refusals (none in PGMQ): a reserved header key, anywhere it is routed
    for key in ("k", "routed.nowhere"):
        with pytest.raises(errors.InvalidParameterValue, match='header "_pg_x" is reserved'):
            conn.execute("SELECT pgmq.send_topic(%s, '1', %s, 0)", (key, Jsonb({"_pg_x": 1})))
    assert len(facade_messages(conn)) == 2


def test_send_topic_is_all_or_nothing(conn: psycopg.Connection[Any]) -> None:
    for q in ("a", "b"):
        create_queue(conn, q)
        conn.execute("SELECT pgmq.bind_topic('#', %s)", (q,))
    # the send to b fails (its sequence is gone): a's send is rolled back with it
    seq = conn.execute("SELECT msg_seq::text FROM pgqueue.queue WHERE queue_name = 'b'").fetchone()
    assert seq is not None
    conn.execute(sql.SQL("ALTER SEQUENCE {} MAXVALUE 2").format(sql.SQL(seq[0])))
    conn.execute("SELECT pgmq.send_topic('k', '1')")
    conn.execute("SELECT pgmq.send_topic('k', '2')")
    with pytest.raises(psycopg.errors.SequenceGeneratorLimitExceeded):
        conn.execute("SELECT pgmq.send_topic('k', '3')")
    assert [(m[0], m[2]) for m in facade_messages(conn)] == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]


def test_send_topic_maps_the_group_header_and_notifies(
    conn: psycopg.Connection[Any], topics_dsn: str
) -> None:
    create_queue(conn, "a")
    conn.execute("SELECT pgmq.bind_topic('#', 'a')")
    conn.execute(
        "UPDATE pgqueue.queue SET notify_channel = 'topic_test_chan' WHERE queue_name = 'a'"
    )
    with psycopg.connect(topics_dsn, autocommit=True) as listener:
        listener.execute("LISTEN topic_test_chan")
        conn.execute("SELECT pgmq.send_topic('k', '1', %s, 0)", (Jsonb({"x-pgmq-group": "g1"}),))
        conn.execute(
            "SELECT * FROM pgmq.send_batch_topic('k', ARRAY['2', '3']::jsonb[], %s::jsonb[])",
            ([Jsonb({"x-pgmq-group": "g2"}), Jsonb({"other": 1})],),
        )
        heard = list(listener.notifies(timeout=60, stop_after=2))  # ends at the second
    assert [n.channel for n in heard] == ["topic_test_chan", "topic_test_chan"]
    groups = conn.execute(
        "SELECT msg_id, group_key FROM pgqueue.message ORDER BY msg_id"
    ).fetchall()
    assert groups == [(1, "g1"), (2, "g2"), (3, None)]


def test_send_batch_topic_every_overload(conn: psycopg.Connection[Any]) -> None:
    for q in ("b", "a"):
        create_queue(conn, q)
        conn.execute("SELECT pgmq.bind_topic('k.#', %s)", (q,))
    msgs = [Jsonb({"i": 1}), Jsonb({"i": 2})]
    heads = [Jsonb({"h": 1}), Jsonb({"h": 2})]
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("SELECT * FROM pgmq.send_batch_topic('k.x', %s::jsonb[])", (msgs,)),
        ("SELECT * FROM pgmq.send_batch_topic('k.x', %s::jsonb[], %s::jsonb[])", (msgs, heads)),
        ("SELECT * FROM pgmq.send_batch_topic('k.x', %s::jsonb[], 7)", (msgs,)),
        (
            "SELECT * FROM pgmq.send_batch_topic('k.x', %s::jsonb[], now() + interval '9 s')",
            (msgs,),
        ),
        ("SELECT * FROM pgmq.send_batch_topic('k.x', %s::jsonb[], %s::jsonb[], 7)", (msgs, heads)),
        (
            "SELECT * FROM pgmq.send_batch_topic('k.x', %s::jsonb[], %s::jsonb[],"
            " clock_timestamp() - interval '1 h')",
            (msgs, heads),
        ),
    ]
    for n, (query, params) in enumerate(calls):
        rows = conn.execute(query, params).fetchall()
        assert rows == [("a", 2 * n + 1), ("a", 2 * n + 2), ("b", 2 * n + 1), ("b", 2 * n + 2)], (
            query
        )
    delays = conn.execute(
        "SELECT m.msg_id, ceil(extract(epoch FROM m.vt - m.enqueued_at))::int, m.headers"
        "  FROM pgqueue.message m JOIN pgqueue.queue q USING (queue_id)"
        " WHERE q.queue_name = 'a' ORDER BY m.msg_id"
    ).fetchall()
    assert [d[1] for d in delays] == [0, 0, 0, 0, 7, 7, 9, 9, 7, 7, 0, 0]
    assert [d[2] for d in delays][2:4] == [{"h": 1}, {"h": 2}]


def test_send_batch_topic_refuses_what_pgmq_refuses(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "a")
    conn.execute("SELECT pgmq.bind_topic('k', 'a')")
    for query, params in [
        ("SELECT * FROM pgmq.send_batch_topic('k', ARRAY[]::jsonb[])", ()),
        ("SELECT * FROM pgmq.send_batch_topic('k', NULL::jsonb[])", ()),
        (
            "SELECT * FROM pgmq.send_batch_topic('k', ARRAY['1']::jsonb[],"
            " ARRAY['{}', '{}']::jsonb[])",
            (),
        ),
        ("SELECT * FROM pgmq.send_batch_topic('k.', ARRAY['1']::jsonb[])", ()),
    ]:
        with pytest.raises(errors.RaiseException):
            conn.execute(query, params)
    # pgqueue's own refusal (none in PGMQ): a reserved header key, also when routed nowhere
    for key in ("k", "none"):
        with pytest.raises(errors.InvalidParameterValue, match='header "_pg_x" is reserved'):
            conn.execute(
                "SELECT * FROM pgmq.send_batch_topic(%s, ARRAY['1']::jsonb[], %s::jsonb[], 0)",
                (key, [Jsonb({"_pg_x": 1})]),
            )
    assert (
        conn.execute("SELECT * FROM pgmq.send_batch_topic('none', ARRAY['1']::jsonb[])").fetchall()
        == []
    )
    assert facade_messages(conn) == []
    # as pgmq.send_batch: a negative delay is none, a NULL body JSON null
    rows = conn.execute(
        "SELECT * FROM pgmq.send_batch_topic('k', ARRAY['1', NULL]::jsonb[], -5)"
    ).fetchall()
    assert rows == [("a", 1), ("a", 2)]
    assert [(m[2], m[3]) for m in facade_messages(conn)] == [(1, None), (None, None)]
    visible = "SELECT count(*) FROM pgqueue.message WHERE vt <= clock_timestamp()"
    assert conn.execute(visible).fetchone() == (2,)


# -- bindings and the queue's life ---------------------------------------------------


def test_bindings_vanish_when_pgqueue_drops_the_queue(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "a")
    create_queue(conn, "b")
    conn.execute(
        "SELECT pgmq.bind_topic('x.*', 'a'), pgmq.bind_topic('#', 'a'), pgmq.bind_topic('#', 'b')"
    )
    assert conn.execute("SELECT pgqueue.drop_queue('a')").fetchone() == (True,)
    assert bindings(conn) == [("#", "b", "^.*$")]
    create_queue(conn, "a")  # a new queue of that name starts with no bindings
    assert bindings(conn, "a") == []
    assert conn.execute("SELECT pgmq.send_topic('x.y', '1')").fetchone() == (1,)


def test_bindings_vanish_when_pgmq_drops_the_queue(conn: psycopg.Connection[Any]) -> None:
    if conn.execute("SELECT to_regprocedure('pgmq.drop_queue(text)')").fetchone() == (None,):
        pytest.skip("the facade's pgmq.drop_queue has not landed")
    create_queue(conn, "a")
    conn.execute("SELECT pgmq.bind_topic('x.*', 'a')")
    conn.execute("SELECT pgmq.drop_queue('a')")
    assert bindings(conn) == []


def _in_thread(target: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(target())
        except BaseException as exc:  # handed to the test thread
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _wait_for_lock_wait(conn: psycopg.Connection[Any], pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.02)
    raise AssertionError("the other connection never waited for the lock")


def test_a_drop_racing_a_bind_leaves_no_binding(
    conn: psycopg.Connection[Any], topics_dsn: str
) -> None:
    create_queue(conn, "a")
    with (
        psycopg.connect(topics_dsn) as binder,
        psycopg.connect(topics_dsn, autocommit=True) as dropper,
    ):
        binder.execute("SELECT pgmq.bind_topic('x.*', 'a')")  # not committed yet
        pid = dropper.info.backend_pid
        t, out = _in_thread(lambda: dropper.execute("SELECT pgqueue.drop_queue('a')").fetchone())
        _wait_for_lock_wait(conn, pid)  # the drop waits for the bind's KEY SHARE lock
        binder.commit()
        t.join(10)
    assert out == [(True,)]
    assert bindings(conn) == []


def test_a_bind_after_a_drop_committed_finds_no_queue(
    conn: psycopg.Connection[Any], topics_dsn: str
) -> None:
    create_queue(conn, "a")
    with (
        psycopg.connect(topics_dsn) as dropper,
        psycopg.connect(topics_dsn, autocommit=True) as binder,
    ):
        dropper.execute("SELECT pgqueue.drop_queue('a')")  # holds the row FOR UPDATE
        t, out = _in_thread(lambda: binder.execute("SELECT pgmq.bind_topic('x.*', 'a')"))
        _wait_for_lock_wait(conn, binder.info.backend_pid)
        dropper.commit()
        t.join(10)
    assert isinstance(out[0], errors.RaiseException)
    assert out[0].diag.message_primary == (
        'Queue "a" does not exist. Create the queue first using pgmq.create()'
    )
    assert bindings(conn) == []


def test_a_send_topic_racing_a_drop_skips_the_dropped_queue(
    conn: psycopg.Connection[Any], topics_dsn: str
) -> None:
    for q in ("a", "b"):
        create_queue(conn, q)
        conn.execute("SELECT pgmq.bind_topic('#', %s)", (q,))
    with (
        psycopg.connect(topics_dsn) as dropper,
        psycopg.connect(topics_dsn, autocommit=True) as sender,
    ):
        dropper.execute("SELECT pgqueue.drop_queue('b')")
        t, out = _in_thread(lambda: sender.execute("SELECT pgmq.send_topic('k', '1')").fetchone())
        _wait_for_lock_wait(conn, sender.info.backend_pid)
        dropper.commit()
        t.join(10)
    assert out == [(1,)]  # sent to a only, no error
    assert [m[0] for m in facade_messages(conn)] == ["a"]


def test_a_drop_waits_for_a_send_topic_in_flight(
    conn: psycopg.Connection[Any], topics_dsn: str
) -> None:
    create_queue(conn, "a")
    conn.execute("SELECT pgmq.bind_topic('#', 'a')")
    with (
        psycopg.connect(topics_dsn) as sender,
        psycopg.connect(topics_dsn, autocommit=True) as dropper,
    ):
        assert sender.execute("SELECT pgmq.send_topic('k', '1')").fetchone() == (1,)
        t, out = _in_thread(lambda: dropper.execute("SELECT pgqueue.drop_queue('a')").fetchone())
        _wait_for_lock_wait(conn, dropper.info.backend_pid)
        sender.commit()
        t.join(10)
    assert out == [(True,)]
    assert facade_messages(conn) == []  # the drop took the message it waited for


# -- rights ------------------------------------------------------------------------


def test_rights_follow_the_pgqueue_roles(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "a")
    conn.execute("SELECT pgmq.bind_topic('#', 'a')")

    def may(role: str, fn: str) -> bool:
        row = conn.execute(
            "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, fn)
        ).fetchone()
        return bool(row and row[0])

    send = "pgmq.send_topic(text,jsonb,jsonb,integer)"
    bind = "pgmq.bind_topic(text,text)"
    assert (
        may("pgqueue_producer", send)
        and may("pgqueue_consumer", send)
        and may("pgqueue_operator", send)
    )
    assert may("pgqueue_operator", bind) and not may("pgqueue_producer", bind)
    assert not may("pgqueue_consumer", bind)
    assert not may("public", send) and not may("public", bind)
    assert not may("public", "pgmq.validate_routing_key(text)")

    conn.execute("SET ROLE pgqueue_producer")
    try:
        assert conn.execute("SELECT pgmq.send_topic('k', '1')").fetchone() == (1,)
        assert conn.execute(
            "SELECT count(*) FROM pgmq.send_batch_topic('k', ARRAY['1']::jsonb[], 3)"
        ).fetchone() == (1,)
        for query in (  # every overload, the timestamp ones too
            "SELECT count(*) FROM pgmq.send_batch_topic('k', ARRAY['1']::jsonb[])",
            "SELECT count(*) FROM pgmq.send_batch_topic('k', ARRAY['1']::jsonb[], now())",
            "SELECT count(*) FROM pgmq.send_batch_topic('k', ARRAY['1']::jsonb[], NULL, now())",
            "SELECT count(*) FROM pgmq.send_batch_topic('k', ARRAY['1']::jsonb[], NULL::jsonb[])",
            "SELECT count(*) FROM pgmq.send_batch_topic('k', ARRAY['1']::jsonb[], NULL, 0)",
            "SELECT pgmq.send_topic('k', '1', 0)",
            "SELECT pgmq.send_topic('k', '1', NULL, 0)",
            "SELECT count(*) FROM pgmq.test_routing('k')",
            "SELECT count(*) FROM pgmq.list_topic_bindings()",
            "SELECT count(*) FROM pgmq.list_topic_bindings('a')",
            "SELECT pgmq.validate_routing_key('k') AND pgmq.validate_topic_pattern('k.#')",
        ):
            assert conn.execute(query).fetchone() == (1,) or query.startswith("SELECT pgmq.v"), (
                query
            )
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("SELECT pgmq.bind_topic('x', 'a')")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM pgmq.topic_bindings")
    finally:
        conn.execute("RESET ROLE")
    conn.execute("SET ROLE pgqueue_operator")
    try:
        conn.execute("SELECT pgmq.bind_topic('x', 'a')")
        assert conn.execute("SELECT pgmq.unbind_topic('x', 'a')").fetchone() == (True,)
    finally:
        conn.execute("RESET ROLE")


def test_installing_again_keeps_the_bindings(conn: psycopg.Connection[Any]) -> None:
    create_queue(conn, "a")
    conn.execute("SELECT pgmq.bind_topic('x.*', 'a')")
    install(conn)  # an upgrade: schema pgmq dropped and made again, the bindings carried over
    assert bindings(conn) == [("x.*", "a", "^x\\.[^.]+$")]
    conn.execute("SELECT pgqueue.drop_queue('a')")  # the trigger is there once, and works
    assert bindings(conn) == []


# -- the same calls against real PGMQ ---------------------------------------------------

# PGMQ's names: "Eu" (mixed case) and "dotted.q" (not a pgqueue name) are queues the
# facade names after them, and shows by PGMQ's names.
DIFF_QUEUES = ["audit", "errors", "Eu", "orders", "dotted.q"]
DIFF_BINDINGS = [
    ("orders.*", "orders"),
    ("orders.#", "audit"),
    ("#", "audit"),
    ("*.eu.*", "Eu"),
    ("#.dotted", "dotted.q"),
    ("#.error", "errors"),
    ("logs.*.error", "errors"),
    ("a*", "orders"),
    ("orders.*", "Eu"),
]
DIFF_KEYS = [
    "orders.created",
    "orders.eu.created",
    "x.eu.y",
    "logs.api.error",
    "error",
    "abc",
    "zzz",
    "orders",
    "a.dotted",
]


def _diff_calls(key: str) -> list[tuple[str, tuple[Any, ...]]]:
    msgs = [Jsonb({"k": key, "i": 1}), Jsonb({"k": key, "i": 2})]
    heads = [Jsonb({"x-pgmq-group": "g"}), Jsonb({"h": key})]
    return [
        ("SELECT pgmq.send_topic(%s, %s)", (key, Jsonb({"k": key}))),
        ("SELECT pgmq.send_topic(%s, %s, 0)", (key, Jsonb([key]))),
        ("SELECT pgmq.send_topic(%s, %s, %s, 0)", (key, Jsonb(key), Jsonb({"h": 1}))),
        ("SELECT * FROM pgmq.send_batch_topic(%s, %s::jsonb[])", (key, msgs)),
        ("SELECT * FROM pgmq.send_batch_topic(%s, %s::jsonb[], %s::jsonb[])", (key, msgs, heads)),
        ("SELECT * FROM pgmq.send_batch_topic(%s, %s::jsonb[], 0)", (key, msgs)),
        ("SELECT * FROM pgmq.send_batch_topic(%s, %s::jsonb[], -5)", (key, msgs)),
        ("SELECT * FROM pgmq.send_batch_topic(%s, %s::jsonb[], now())", (key, msgs)),
        (
            "SELECT * FROM pgmq.send_batch_topic(%s, %s::jsonb[], %s::jsonb[], 0)",
            (key, msgs, heads),
        ),
        (
            "SELECT * FROM pgmq.send_batch_topic(%s, %s::jsonb[], %s::jsonb[], now())",
            (key, msgs, heads),
        ),
    ]


def test_the_same_calls_give_the_same_results_as_real_pgmq(
    conn: psycopg.Connection[Any], real: psycopg.Connection[Any]
) -> None:
    for c in (conn, real):
        for q in DIFF_QUEUES:
            create_queue(c, q)
        for pattern, queue in DIFF_BINDINGS:
            c.execute("SELECT pgmq.bind_topic(%s, %s)", (pattern, queue))
        c.execute("SELECT pgmq.bind_topic('#', 'audit')")  # twice: a no-op in both
    assert bindings(conn) == bindings(real)
    for q in DIFF_QUEUES:
        assert bindings(conn, q) == bindings(real, q), q
    for key in DIFF_KEYS:
        # by pattern in both; PGMQ leaves the order of one pattern's queues open
        assert sorted(routing(conn, key)) == sorted(routing(real, key)), key
        assert [r[0] for r in routing(conn, key)] == [r[0] for r in routing(real, key)], key
        for query, params in _diff_calls(key):
            assert (
                conn.execute(query, params).fetchall() == real.execute(query, params).fetchall()
            ), (query, key)
    assert facade_messages(conn) == real_messages(real, DIFF_QUEUES)
    for pattern, queue in [
        ("#", "audit"),
        ("#", "audit"),
        ("nope", "Eu"),
        ("*.eu.*", "errors"),
        ("*.eu.*", "Eu"),
    ]:
        query = "SELECT pgmq.unbind_topic(%s, %s)"
        assert (
            conn.execute(query, (pattern, queue)).fetchall()
            == real.execute(query, (pattern, queue)).fetchall()
        )
    assert bindings(conn) == bindings(real)


# -- PGMQ's errors, exactly, against real PGMQ ----------------------------------------

# Each rule of validate_routing_key, with what real PGMQ says for it (so each is
# reached): a value that breaks two rules gets the first's error, in PGMQ's order.
KEY_RULES: list[tuple[str | None, str]] = [
    ("", "routing_key cannot be NULL or empty"),
    (None, "routing_key cannot be NULL or empty"),
    ("x" * 256, "routing_key length cannot exceed 255 characters, got 256 characters"),
    ("." * 256, "routing_key length cannot exceed 255 characters"),
    ("logs error", "routing_key contains invalid characters."),
    ("logs.*", "routing_key contains invalid characters."),
    ("logs.#", "routing_key contains invalid characters."),
    ("logs.(foo|bar)", "routing_key contains invalid characters."),
    ("lögs", "routing_key contains invalid characters."),
    ("a\nb", "routing_key contains invalid characters."),
    (".a b", "routing_key contains invalid characters."),
    (".logs", "routing_key cannot start with a dot. Got: .logs"),
    (".", "routing_key cannot start with a dot."),
    ("..a.", "routing_key cannot start with a dot."),
    ("logs.", "routing_key cannot end with a dot. Got: logs."),
    ("a..b.", "routing_key cannot end with a dot."),
    ("logs..error", "routing_key cannot contain consecutive dots. Got: logs..error"),
]

# Each rule of validate_topic_pattern likewise.
PATTERN_RULES: list[tuple[str | None, str]] = [
    ("", "pattern cannot be NULL or empty"),
    (None, "pattern cannot be NULL or empty"),
    ("#" * 256, "pattern length cannot exceed 255 characters, got 256 characters"),
    ("logs.(foo|bar)", "pattern contains invalid characters."),
    ("logs.[error]", "pattern contains invalid characters."),
    ("logs.error$", "pattern contains invalid characters."),
    ("a b", "pattern contains invalid characters."),
    ("a.**!", "pattern contains invalid characters."),
    (".logs.*", "pattern cannot start with a dot. Got: .logs.*"),
    (".**", "pattern cannot start with a dot."),
    ("logs.*.", "pattern cannot end with a dot. Got: logs.*."),
    ("a..b", "pattern cannot contain consecutive dots. Got: a..b"),
    ("logs..**", "pattern cannot contain consecutive dots."),
    ("logs.**", "pattern cannot contain consecutive stars (**). Use # for multi-segment"),
    ("**.##", "pattern cannot contain consecutive stars (**)."),
    ("logs.##", "pattern cannot contain consecutive hashes (##). A single # already"),
    ("##*", "pattern cannot contain consecutive hashes (##)."),
    ("logs.*#", "pattern cannot contain adjacent wildcards (*# or #*). Separate"),
    ("logs.#*", "pattern cannot contain adjacent wildcards (*# or #*)."),
]

# Every form that takes a routing key, with %s for it.
KEY_TAKERS = [
    "SELECT pgmq.validate_routing_key(%s)",
    "SELECT * FROM pgmq.test_routing(%s)",
    "SELECT pgmq.send_topic(%s, '1')",
    "SELECT pgmq.send_topic(%s, '1', 0)",
    "SELECT pgmq.send_topic(%s, '1', NULL, 0)",
    "SELECT * FROM pgmq.send_batch_topic(%s, ARRAY['1']::jsonb[])",
    "SELECT * FROM pgmq.send_batch_topic(%s, ARRAY['1']::jsonb[], ARRAY['{}']::jsonb[])",
    "SELECT * FROM pgmq.send_batch_topic(%s, ARRAY['1']::jsonb[], 0)",
    "SELECT * FROM pgmq.send_batch_topic(%s, ARRAY['1']::jsonb[], now())",
    "SELECT * FROM pgmq.send_batch_topic(%s, ARRAY['1']::jsonb[], NULL, 0)",
    "SELECT pgmq.send_batch_topic(%s, ARRAY['1']::jsonb[], NULL, now())",
]

# The other checks of the topic functions (each a statement, and what PGMQ says),
# several in every form of the function, and a statement breaking two checks
# getting the first's error. A reserved header key (pgqueue's refusal) comes
# after PGMQ's checks: PGMQ's error wins.
ARGUMENT_CHECKS: list[tuple[str, str]] = [
    ("SELECT pgmq.bind_topic('a.*', '')", "queue_name cannot be NULL or empty"),
    ("SELECT pgmq.bind_topic('a.*', NULL)", "queue_name cannot be NULL or empty"),
    ("SELECT pgmq.bind_topic('a..b', '')", "pattern cannot contain consecutive dots."),
    (
        "SELECT pgmq.bind_topic('a.*', 'nope')",
        'Queue "nope" does not exist. Create the queue first using pgmq.create()',
    ),
    ("SELECT pgmq.bind_topic('#', 'no;pe')", 'Queue "no;pe" does not exist.'),
    ("SELECT pgmq.unbind_topic('', 'q')", "pattern cannot be NULL or empty"),
    ("SELECT pgmq.unbind_topic(NULL, 'q')", "pattern cannot be NULL or empty"),
    ("SELECT pgmq.unbind_topic('', NULL)", "pattern cannot be NULL or empty"),
    ("SELECT pgmq.unbind_topic('a.*', '')", "queue_name cannot be NULL or empty"),
    ("SELECT pgmq.unbind_topic('a.*', NULL)", "queue_name cannot be NULL or empty"),
    ("SELECT pgmq.send_topic('k', NULL)", "msg cannot be NULL"),
    ("SELECT pgmq.send_topic('k', NULL, 0)", "msg cannot be NULL"),
    ("SELECT pgmq.send_topic('k', NULL, NULL, 0)", "msg cannot be NULL"),
    ("SELECT pgmq.send_topic('k', NULL, -1)", "msg cannot be NULL"),
    ("SELECT pgmq.send_topic('k', NULL, '{\"_pg_x\": 1}', 0)", "msg cannot be NULL"),
    ("SELECT pgmq.send_topic('', NULL)", "routing_key cannot be NULL or empty"),
    ("SELECT pgmq.send_topic('k', '1', -1)", "delay cannot be negative, got: -1"),
    ("SELECT pgmq.send_topic('k', '1', NULL, -5)", "delay cannot be negative, got: -5"),
    ("SELECT pgmq.send_topic('k', '1', '{\"_pg_x\": 1}', -1)", "delay cannot be negative"),
    ("SELECT pgmq.send_batch_topic('k', NULL)", "msgs cannot be NULL or empty"),
    ("SELECT * FROM pgmq.send_batch_topic('k', NULL)", "msgs cannot be NULL or empty"),
    ("SELECT * FROM pgmq.send_batch_topic('k', ARRAY[]::jsonb[])", "msgs cannot be NULL or empty"),
    (
        "SELECT * FROM pgmq.send_batch_topic('k', ARRAY[]::jsonb[], ARRAY[]::jsonb[])",
        "msgs cannot be NULL or empty",
    ),
    ("SELECT * FROM pgmq.send_batch_topic('k', NULL, 5)", "msgs cannot be NULL or empty"),
    ("SELECT * FROM pgmq.send_batch_topic('k', NULL, now())", "msgs cannot be NULL or empty"),
    (
        "SELECT * FROM pgmq.send_batch_topic('k', NULL, ARRAY['{}']::jsonb[], 5)",
        "msgs cannot be NULL or empty",
    ),
    (
        "SELECT * FROM pgmq.send_batch_topic('k', ARRAY[]::jsonb[], NULL, now())",
        "msgs cannot be NULL or empty",
    ),
    ("SELECT pgmq.send_batch_topic('', ARRAY[]::jsonb[])", "routing_key cannot be NULL or empty"),
    (
        "SELECT * FROM pgmq.send_batch_topic('k', ARRAY['1']::jsonb[], ARRAY['{}', '{}']::jsonb[])",
        "headers array length (2) must match msgs array length (1)",
    ),
    (
        "SELECT * FROM pgmq.send_batch_topic('k', ARRAY['1', '2']::jsonb[], ARRAY['{}']::jsonb[])",
        "headers array length (1) must match msgs array length (2)",
    ),
    (
        "SELECT * FROM pgmq.send_batch_topic('k', ARRAY['1']::jsonb[], ARRAY[]::jsonb[])",
        "headers array length (0) must match msgs array length (1)",
    ),
    (
        "SELECT * FROM pgmq.send_batch_topic('k', ARRAY['1']::jsonb[], ARRAY[]::jsonb[], 3)",
        "headers array length (0) must match msgs array length (1)",
    ),
    (
        "SELECT * FROM pgmq.send_batch_topic('k', ARRAY['1', '2']::jsonb[],"
        " ARRAY['{\"_pg_x\": 1}']::jsonb[], now())",
        "headers array length (1) must match msgs array length (2)",
    ),
]


@pytest.fixture
def both(conn: psycopg.Connection[Any], real: psycopg.Connection[Any]) -> list[Any]:
    """The facade's connection and real PGMQ's, each with queue q bound to every key ('#'):
    a check that came after the routing would send something."""
    for c in (conn, real):
        create_queue(c, "q")
        c.execute("SELECT pgmq.bind_topic('#', 'q')")
    return [conn, real]


# The one frame of a topic function's CONTEXT that is not 20_topics.sql's: PGMQ's batch
# check is 10_facade.sql's (shared with pgmq.send_batch), and the line of its RAISE is
# that file's to keep; every other line of the CONTEXT is compared as psql prints it.
BATCH_CHECK_LINE = re.compile(r"(?<=pgmq\._validate_batch_params\(jsonb\[\],jsonb\[\]\)) line \d+")


def same_failures(
    conn: psycopg.Connection[Any], real: psycopg.Connection[Any], calls: list[tuple[str, Any]]
) -> list[str]:
    """The calls that fail otherwise on the facade than on real PGMQ, each with both failures."""

    def shown(f: Failure | None) -> Failure | None:
        if f is None or f[4] is None:
            return f
        return (*f[:4], BATCH_CHECK_LINE.sub(" line ?", f[4]), f[5])

    out = []
    for query, params in calls:
        mine, pgmqs = shown(failure(conn, query, params)), shown(failure(real, query, params))
        if mine != pgmqs:
            out.append(f"{query} {params!r}:\n  facade: {mine}\n  PGMQ:   {pgmqs}")
    return out


def test_each_routing_key_rule_raises_pgmqs_error_in_every_function_taking_a_key(
    both: list[Any],
) -> None:
    conn, real = both
    for value, says in KEY_RULES:
        got = failure(real, "SELECT pgmq.validate_routing_key(%s)", (value,))
        assert got is not None and got[0] == "P0001" and str(got[1]).startswith(says), got
        assert got[2:4] == (None, None) and got[5] == [], got  # no detail, no hint, no notice
    calls = [(q, (v,)) for v, _ in KEY_RULES for q in KEY_TAKERS]
    assert same_failures(conn, real, calls) == []
    assert facade_messages(conn) == []


def test_each_pattern_rule_raises_pgmqs_error_in_validate_and_bind(both: list[Any]) -> None:
    conn, real = both
    for value, says in PATTERN_RULES:
        got = failure(real, "SELECT pgmq.validate_topic_pattern(%s)", (value,))
        assert got is not None and got[0] == "P0001" and str(got[1]).startswith(says), got
    calls = [
        (q, (v,))
        for v, _ in PATTERN_RULES
        for q in (
            "SELECT pgmq.validate_topic_pattern(%s)",
            "SELECT pgmq.bind_topic(%s, 'q')",
            "SELECT pgmq.bind_topic(%s, '')",
        )
    ]
    assert same_failures(conn, real, calls) == []
    assert bindings(conn) == bindings(real) == [("#", "q", "^.*$")]


def test_each_argument_check_raises_pgmqs_error(both: list[Any]) -> None:
    conn, real = both
    for query, says in ARGUMENT_CHECKS:
        got = failure(real, query)
        assert got is not None and got[0] == "P0001" and str(got[1]).startswith(says), got
    assert same_failures(conn, real, [(q, None) for q, _ in ARGUMENT_CHECKS]) == []
    assert facade_messages(conn) == []
    assert bindings(conn) == bindings(real) == [("#", "q", "^.*$")]


def test_a_null_delay_sends_nothing_unrouted_and_is_refused_routed(
    conn: psycopg.Connection[Any], real: psycopg.Connection[Any]
) -> None:
    """As in PGMQ, a NULL delay is no error until a message is stored; then the facade's
    send refuses it (22004, pgqueue's), where PGMQ's insert fails on its vt column (23502)."""
    forms = [
        "SELECT pgmq.send_topic(%s, '1', NULL, NULL)",
        "SELECT count(*) FROM pgmq.send_batch_topic(%s, ARRAY['1']::jsonb[], NULL::integer)",
        "SELECT count(*) FROM pgmq.send_batch_topic(%s, ARRAY['1']::jsonb[], NULL::timestamptz)",
        "SELECT count(*) FROM pgmq.send_batch_topic(%s, ARRAY['1']::jsonb[], NULL, NULL::int)",
    ]
    for c in (conn, real):
        create_queue(c, "q")
        c.execute("SELECT pgmq.bind_topic('k', 'q')")
    for query in forms:
        assert (
            conn.execute(query, ("none",)).fetchone()
            == (0,)
            == real.execute(query, ("none",)).fetchone()
        )
        with pytest.raises(errors.NullValueNotAllowed):
            conn.execute(query, ("k",))
        with pytest.raises(errors.NotNullViolation):
            real.execute(query, ("k",))
    assert facade_messages(conn) == []
