"""The methods of Client and AsyncClient, one module per area of the SQL API.

Each module holds the blocking mixin and its asyncio twin side by side, so a
method added to one is seen missing from the other (tests/client/
test_async_parity.py checks that the two stay alike).
"""
