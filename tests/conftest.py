"""The tests' fixtures come from plugins in tests/support/; no test module imports another.

Layers: sql/ (the SQL API and the schema), client/ (the Python clients),
worker/ (the consumer runtime), ops/ (the command line, compose, PgBouncer,
the README and the benchmarks), models/ (hypothesis state machines), soak/
(the chaos soak and its checker). Where the server comes from, and how each
test gets a database of its own: tests/support/db.py.
"""

# A Django project the integration tests run (its test_runner.py is Django's,
# not a pytest module).
collect_ignore = ["django_project"]

pytest_plugins = ["support.db", "support.processes", "support.pgmq", "support.roles"]


def pytest_xdist_auto_num_workers(config: object) -> int:
    """`-n auto`: two workers per CPU, at most two more than the CPUs.

    The suite waits more than it computes (servers starting, workers
    stopping, leases running out): on 2 CPUs, four workers ran it in 8.5
    to 9.5 minutes where two took 11 to 12.
    """
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    return max(2, min(2 * cpus, cpus + 2))
