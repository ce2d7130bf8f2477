"""The tests' fixtures come from plugins in tests/support/; no test module imports another.

Layers: sql/ (the SQL API and the schema), client/ (the Python clients),
worker/ (the consumer runtime), ops/ (the command line, compose, PgBouncer,
the README and the benchmarks), models/ (hypothesis state machines), soak/
(the chaos soak and its checker). Where the server comes from, and how each
test gets a database of its own: tests/support/db.py.
"""

pytest_plugins = ["support.db", "support.processes", "support.pgmq"]
