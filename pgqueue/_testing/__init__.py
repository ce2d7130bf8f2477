"""The parts of pgqueue.testing beside its pytest plugin: drain() and the enqueued assertions.

Private: users import them from pgqueue.testing, which re-exports them.
"""
