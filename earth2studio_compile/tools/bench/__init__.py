"""Benchmark: how much faster is a compiled rollout, and what does it cost?

``python -m earth2studio_compile.tools.bench`` (or ``earth2studio-compile-bench``)
measures each model and mode in a fresh process; :mod:`.measure` is one such
measurement, :mod:`.e2e` the end-to-end profile, :mod:`.runs` what they share,
:mod:`.plot` draws the figure. ``... bench workflow`` (:mod:`.workflow`, its children
in :mod:`.calls`) times whole workflow calls; :mod:`.env` records where a run ran.
"""
