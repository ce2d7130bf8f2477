"""The door's check for documents no reader can decode, where it could be walked around.

The check walks only a document of more than 2 kB (one nested 256 deep takes
more), or one that is stored compressed: a value read from a table of the
caller's own can be compressed far below its size, and must not pass.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgqueue import Client


def deep(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


def test_a_deep_document_compressed_in_a_table_of_the_callers_is_still_refused(
    client: Client, sql: Any
) -> None:
    client.create_queue("q")
    sql.execute("CREATE TABLE public.docs (doc jsonb)")
    sql.execute("INSERT INTO public.docs VALUES (%s::jsonb)", (deep(300),))
    size, compressed = sql.execute(
        "SELECT pg_column_size(doc), pg_column_compression(doc) FROM public.docs"
    ).fetchone()
    assert compressed is not None and size < 2048  # what a size-only gate would have let by
    for statement in (
        "SELECT pgqueue.send('q', d.doc) FROM public.docs d",
        "SELECT pgqueue.send('q', '{}', jsonb_build_object('h', d.doc)) FROM public.docs d",
        "SELECT pgqueue.send_batch('q', ARRAY[d.doc]) FROM public.docs d",
        "SELECT pgqueue.fan_out('q', ARRAY[d.doc], 'q', '{}') FROM public.docs d",
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="255 levels"):
            sql.execute(statement)
    assert client.metrics("q").queue_length == 0


def test_the_boundary_is_255_levels(client: Client, sql: Any) -> None:
    client.create_queue("q")
    sql.execute("SELECT pgqueue.send('q', %s::jsonb)", (deep(255),))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="message is nested more than"):
        sql.execute("SELECT pgqueue.send('q', %s::jsonb)", (deep(256),))
    [msg] = client.read("q", vt=30, qty=5)
    depth, value = 0, msg.message
    while isinstance(value, list):
        depth, value = depth + 1, value[0]
    assert (depth, value) == (255, 1)


def test_an_integer_longer_than_pythons_digit_limit_is_read_exactly(
    client: Client, sql: Any
) -> None:
    """Not refused at the door (no decoder's limit but Python's default): read exactly."""
    client.create_queue("q")
    big = "9" * 5000
    sql.execute(
        "SELECT pgqueue.send('q', %s::jsonb, %s::jsonb)", (f'{{"n": {big}}}', f'{{"h": -{big}}}')
    )
    [peeked] = client.peek("q")
    [msg] = client.read("q", vt=30, qty=5)
    for got in (peeked, msg):
        assert got.message == {"n": 10**5000 - 1}
        assert got.headers == {"h": -(10**5000 - 1)}
    assert client.poison_list("q") == []


def test_a_batch_names_the_element_that_is_too_deep_and_sends_none(
    client: Client, sql: Any
) -> None:
    client.create_queue("q")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"messages\[2\] is nested"):
        sql.execute(
            "SELECT pgqueue.send_batch('q', ARRAY['1'::jsonb, %s::jsonb, '3'::jsonb])",
            (deep(300),),
        )
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"messages\[1\] is nested"):
        sql.execute("SELECT pgqueue.fan_out('q', ARRAY[%s::jsonb], 'q', '{}')", (deep(300),))
    assert client.metrics("q").queue_length == 0
