"""Reproducible benchmarks for pgqueue; see benchmarks/README.md."""
