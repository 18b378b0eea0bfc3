"""Benchmarks and load tests for rlsandbox (run with `python -m rlsandbox.loadtest.<name>`)."""
