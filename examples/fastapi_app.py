"""A FastAPI app that enqueues in the request's own transaction, and the worker beside it.

POST /orders writes an order row and sends its `orders` message on the same
connection, in one transaction: both commit, or neither does (a failure after
the send, here `?fail_after_send=true`, rolls the message back with the row).
No outbox table, no second connection, no commit by pgqueue.

Run the two halves side by side, both on $PGQUEUE_DSN (migrated once with
`pgqueue migrate`):

    uvicorn examples.fastapi_app:app
    pgqueue worker examples.fastapi_app:worker_app

The worker's `ship` handler is transactional: it marks the order shipped in
the same transaction as the message's ack, so a redelivery changes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any

import psycopg
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

import pgqueue

QUEUE = "orders"
SCHEMA = """
CREATE TABLE IF NOT EXISTS example_orders (
    id bigserial PRIMARY KEY,
    item text NOT NULL,
    quantity integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    shipped_at timestamptz
)
"""


class Order(BaseModel):
    """What a client posts."""

    item: str = Field(min_length=1)
    quantity: int = Field(gt=0)


def lifespan(dsn: str | None = None) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """One AsyncClient (one pool) for the app's whole life, closed at shutdown."""

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[None]:
        async with await pgqueue.AsyncClient.from_dsn(dsn) as client:
            await client.create_queue(QUEUE)
            async with client.connection() as conn:
                await conn.execute(SCHEMA)
            app.state.pgqueue = client
            yield

    return run


def get_client(request: Request) -> pgqueue.AsyncClient:
    """The app's client, opened by its lifespan."""
    client: pgqueue.AsyncClient = request.app.state.pgqueue
    return client


PgQueue = Annotated[pgqueue.AsyncClient, Depends(get_client)]


async def transaction(client: PgQueue) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The request's transaction: committed if the endpoint returns, rolled back if it raises."""
    async with client.connection() as conn, conn.transaction():
        yield conn


# scope="function": the transaction ends when the endpoint returns, before the
# response is sent. With the default scope ("request") the commit would come
# after the client had its 201, and a commit that failed would go unreported.
Transaction = Annotated[psycopg.AsyncConnection[Any], Depends(transaction, scope="function")]


router = APIRouter()


@router.post("/orders", status_code=201)
async def place_order(
    order: Order, conn: Transaction, client: PgQueue, fail_after_send: bool = False
) -> dict[str, int]:
    """Record the order and enqueue its shipping, atomically."""
    cur = await conn.execute(
        "INSERT INTO example_orders (item, quantity) VALUES (%s, %s) RETURNING id",
        (order.item, order.quantity),
    )
    row = await cur.fetchone()
    assert row is not None
    msg_id = await client.send(QUEUE, {"order_id": row[0]}, conn=conn)
    if fail_after_send:
        # Whatever fails after the send (a payment, a check) undoes both.
        raise HTTPException(status_code=503, detail="failed after the send; nothing was kept")
    return {"order_id": row[0], "msg_id": msg_id}


def create_app(dsn: str | None = None) -> FastAPI:
    """The web app on dsn (else $PGQUEUE_DSN / $DATABASE_URL)."""
    app = FastAPI(title="pgqueue orders example", lifespan=lifespan(dsn))
    app.include_router(router)
    return app


app = create_app()

worker_app = pgqueue.App()


@worker_app.handler(QUEUE, transactional=True)
def ship(msg: pgqueue.Message, conn: psycopg.Connection[Any]) -> None:
    """Mark the order shipped, in the same transaction as the message's ack."""
    conn.execute(
        "UPDATE example_orders SET shipped_at = now() WHERE id = %s AND shipped_at IS NULL",
        (msg.message["order_id"],),
    )
