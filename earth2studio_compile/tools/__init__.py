"""Tooling built on the library: the model zoo, the demo and the benchmark.

The library (:mod:`earth2studio_compile` and its modules outside this package) never
imports it: what a user's process compiles does not depend on whether these modules
were imported. Importing a tool changes no library state either (the model table
included), so a test or a benchmark sees what a user sees.

:mod:`.zoo`
    Real Earth2Studio models with random weights, built without downloads
:mod:`.demo`
    ``python -m earth2studio_compile.tools.demo``: the README's eager vs compiled run
:mod:`.bench`
    ``python -m earth2studio_compile.tools.bench``: the benchmark CLI
"""
