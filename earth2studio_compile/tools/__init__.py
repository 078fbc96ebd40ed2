"""Tooling built on the library: the model zoo, the demo and the benchmark.

The library (:mod:`earth2studio_compile` and its modules outside this package) never
imports it.
"""
