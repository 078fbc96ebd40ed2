"""The docs' figure blocks (:mod:`.figures` renders them): each block's name, the
one document that holds it, its JSON files under ``docs/bench/`` and its renderer.
A new run adds its JSON and a :class:`~.figure_block.Figure` here (docs/models.md's
in :mod:`.figure_catalog_models`), and a block to its document.
"""

from __future__ import annotations

from earth2studio_compile.tools.bench.figure_block import Figure
from earth2studio_compile.tools.bench.figure_catalog_models import MODEL_FIGURES
from earth2studio_compile.tools.bench.tables import (
    cluster,
    e2e_profile,
    e2e_writers,
    kernels,
    overlap,
    rollouts,
    second_call,
    warm_phases,
)
from earth2studio_compile.tools.bench.workflow_figures import (
    workflow,
    workflow_first_steps,
    workflow_floors,
    workflow_phases,
    workflow_threads,
)

_H23 = "2026-11-23-h100/"
PERF = "docs/performance.md"
# Runs each rendered three ways (the whole calls, the threads, the phases).
_RUNS_6BDB8A0 = tuple(
    "2026-11-26-h100-fourth/" + f
    for f in ("dlwp-ens-6bdb8a0.json", "ens-disk-6bdb8a0.json", "fcn-ens-6bdb8a0.json")
)
_RUN_CB00D62 = ("2026-11-26-h100-fourth/fcn-ens-cb00d62.json",)
_RUNS_FIFTH = tuple(
    "2026-11-26-h100-fifth/" + f
    for f in ("fcn-ens-ab6ec89.json", "fcn-ens-704d25a.json", "dlwp-ens-704d25a.json")
)
_SIXTH = "2026-11-26-h100-sixth/"
_RUNS_SIXTH = tuple(
    _SIXTH + f
    for f in ("fcn-ens-c78a1ea.json", "dlwp-ens-c78a1ea.json", "fcn-ens-dd6e0e2.json")
)
_FIRST_SIXTH = tuple(
    _SIXTH + f
    for f in (
        "fcn-ens-first-b2e4024.json",
        "dlwp-ens-first-b2e4024.json",
        "fcn-ens-dd6e0e2.json",
    )
)
_SEVENTH = "2026-11-26-h100-seventh/"
_RUNS_SEVENTH = tuple(
    _SEVENTH + f
    for f in (
        "fcn-ens-prefetched-9a6e592.json",
        "fcn-ens-pinned-9192b86.json",
        "fcn-ens-pinned-async-9192b86.json",
    )
)
_TWELFTH = "2026-11-27-h100-twelfth/"
_RUNS_TWELFTH = tuple(
    _TWELFTH + f
    for f in (
        "dlwp-ens-9d4316c.json",
        "dlwp-ens-4fbca1c.json",
        "dlwp-ens-all-9d4316c.json",
        "dlwp-ens-all-chunks-1ade37b.json",
        "fcn-ens-9d4316c.json",
    )
)
_THIRTEENTH = "2026-11-27-h100-thirteenth/"
_RUNS_THIRTEENTH = tuple(
    _THIRTEENTH + f
    for f in (
        "fcn-ens-6df4b35.json",
        "fcn-ens-async-spy-6df4b35.json",
        "dlwp-ens-gil-6df4b35.json",
    )
)
_FOURTEENTH = "2026-11-27-h100-fourteenth/"
_RUNS_FOURTEENTH = tuple(
    _FOURTEENTH + f
    for f in ("fcn-ens-overlapped-47d9ebc.json", "fcn-ens-async-zarr-47d9ebc.json")
)
_FIFTEENTH = "2026-11-27-h100-fifteenth/"
_RUNS_FIFTEENTH = tuple(
    _FIFTEENTH + f
    for f in (
        "fcn-ens-overlapped-ced0eee.json",
        "fcn-ens-async-zarr-dd5f796.json",
        "fcn-ens-ov-spy-dd5f796.json",
    )
)
_SIXTEENTH = "2026-11-27-h100-sixteenth/"
_RUNS_SIXTEENTH = tuple(
    _SIXTEENTH + f
    for f in (
        "fcn-ens-side-cba9c9e.json",
        "fcn-ens-side2-cba9c9e.json",
        "dlwp-ens-cba9c9e.json",
    )
)
_SEVENTEENTH = "2026-11-28-h100-seventeenth/"
_RUNS_SEVENTEENTH = (_SEVENTEENTH + "dlwp-ens-all-b56e9b4.json",)
_EIGHTEENTH = "2026-11-28-h100-eighteenth/"
_RUNS_EIGHTEENTH = tuple(
    _EIGHTEENTH + f
    for f in (
        "dlwp-ens-all-f39ef9f.json",
        "fcn-ens-plain-f39ef9f.json",
        "dlwp-ens-plain-f39ef9f.json",
    )
)
_NINETEENTH = "2026-11-28-h100-nineteenth/"
_RUNS_NINETEENTH = tuple(
    _NINETEENTH + f
    for f in ("dlwp-ens-all-da38751.json", "fcn-ens-overlapped-da38751.json")
)
_TWENTIETH = "2026-11-28-h200-twentieth/"
_RUNS_TWENTIETH = tuple(
    _TWENTIETH + f
    for f in (
        "dlwp-ens-all-9a6d36a.json",
        "fcn-ens-9a6d36a.json",
        "fcn-ens-fix-c3b1b8a.json",
    )
)
_TWENTYFIRST = "2026-11-28-h200-twentyfirst/"
_RUNS_TWENTYFIRST = tuple(
    _TWENTYFIRST + f
    for f in (
        "dlwp-ens-6a80cc1.json",
        "dlwp-ens-all-35434cb.json",
        "fcn-ens-35434cb.json",
    )
)
_TWENTYSECOND = "2026-11-28-h200-twentysecond/"
_RUNS_TWENTYSECOND = tuple(
    _TWENTYSECOND + f
    for f in (
        "dlwp-ens-memory-648d77c.json",
        "dlwp-ens-all-648d77c.json",
        "fcn-ens-648d77c.json",
    )
)
_TWENTYTHIRD = "2026-11-28-h200-twentythird/"
_RUNS_TWENTYTHIRD = tuple(
    _TWENTYTHIRD + f
    for f in (
        "dlwp-ens-memory-58ee37a.json",
        "dlwp-ens-all-58ee37a.json",
        "fcn-ens-58ee37a.json",
    )
)
_TWENTYFOURTH = "2026-11-29-h200-twentyfourth/"
_RUNS_TWENTYFOURTH = tuple(
    _TWENTYFOURTH + f
    for f in (
        "dlwp-ens-memory-a3ecc5f.json",
        "dlwp-ens-all-a3ecc5f.json",
    )
)
_TWENTYFIFTH = "2026-11-29-h200-twentyfifth/"
_RUNS_TWENTYFIFTH = (_TWENTYFIFTH + "fcn-ens-cddd604.json",)
_TWENTYSIXTH = "2026-11-29-h200-twentysixth/"
_RUNS_TWENTYSIXTH = (_TWENTYSIXTH + "fcn-ens-5562bf9.json",)
_THIRTYFIFTH = "2026-11-30-h200-thirtyfifth/"
_RUNS_THIRTYFIFTH = (_THIRTYFIFTH + "fcn-ens-c7a5b5a.json",)
_THIRTYSEVENTH = "2026-11-30-h200-thirtyseventh/"
_RUNS_THIRTYSEVENTH = (_THIRTYSEVENTH + "fcn-ens-async-93137e7.json",)
_THIRTYEIGHTH = "2026-11-30-h200-thirtyeighth/"
_RUNS_THIRTYEIGHTH = (
    _THIRTYEIGHTH + "fcn-det-async-f91cbb4.json",
    _THIRTYEIGHTH + "fcn-ens-async-f91cbb4.json",
)
_THIRTYNINTH = "2026-11-30-h200-thirtyninth/"
_RUNS_THIRTYNINTH = (_THIRTYNINTH + "fcn-ens-floors-fb58d92.json",)
FIGURES: tuple[Figure, ...] = (
    Figure(
        "workflow",
        "README.md",
        (
            "2026-11-26-h100/fcn-cold-08814d9.json",
            "2026-11-26-h100/fcn-cold-warm-a07654a.json",
            "2026-11-26-h100/fcn-second-a07654a.json",
            "2026-11-26-h100/fcn-async-a07654a.json",
        ),
        workflow,
    ),
    Figure(
        "ensembles",
        PERF,
        tuple(
            "2026-11-26-h200/" + f
            for f in (
                "dlwp-ens-c7b81db.json",
                "dlwp-ens-all-c7b81db.json",
                "fcn-ens-c7b81db.json",
            )
        ),
        workflow,
    ),
    Figure(
        "ensembles-ahead",
        PERF,
        ("2026-11-26-h200/dlwp-ens-2a9383c.json",),
        workflow,
    ),
    Figure(
        "ensembles-h100",
        PERF,
        ("2026-11-26-h100/dlwp-ens-08c4435.json",),
        workflow,
    ),
    Figure(
        "ensembles-h100-writers",
        PERF,
        ("2026-11-26-h100/dlwp-ens-94e3839.json",),
        workflow,
    ),
    Figure(
        "ensembles-h100-6bdb8a0",
        PERF,
        ("2026-11-26-h100-fourth/dlwp-ens-6bdb8a0.json",),
        workflow,
    ),
    Figure(
        "ensembles-h100-disk-6bdb8a0",
        PERF,
        (
            "2026-11-26-h100-fourth/ens-disk-6bdb8a0.json",
            "2026-11-26-h100-fourth/fcn-ens-6bdb8a0.json",
        ),
        workflow,
    ),
    Figure(
        "ensembles-h100-6bdb8a0-threads",
        PERF,
        _RUNS_6BDB8A0,
        workflow_threads,
    ),
    Figure(
        "ensembles-h100-6bdb8a0-phases",
        PERF,
        _RUNS_6BDB8A0,
        workflow_phases,
    ),
    Figure(
        "ensembles-h100-cb00d62",
        PERF,
        _RUN_CB00D62,
        workflow,
    ),
    Figure(
        "ensembles-h100-cb00d62-threads",
        PERF,
        _RUN_CB00D62,
        workflow_threads,
    ),
    Figure(
        "ensembles-h100-cb00d62-phases",
        PERF,
        _RUN_CB00D62,
        workflow_phases,
    ),
    Figure(
        "ensembles-h100-fifth",
        PERF,
        _RUNS_FIFTH,
        workflow,
    ),
    Figure("ensembles-h100-seventh", PERF, _RUNS_SEVENTH, workflow),
    Figure("ensembles-h100-seventh-first", PERF, _RUNS_SEVENTH, workflow_first_steps),
    Figure("ensembles-h100-seventh-threads", PERF, _RUNS_SEVENTH, workflow_threads),
    Figure("ensembles-h100-sixth", PERF, _RUNS_SIXTH, workflow),
    Figure("ensembles-h100-sixth-first", PERF, _FIRST_SIXTH, workflow_first_steps),
    Figure("ensembles-h100-sixth-phases", PERF, _RUNS_SIXTH, workflow_phases),
    Figure(
        "ensembles-h100-fifth-threads",
        PERF,
        _RUNS_FIFTH,
        workflow_threads,
    ),
    Figure(
        "ensembles-h100-fifth-phases",
        PERF,
        _RUNS_FIFTH,
        workflow_phases,
    ),
    Figure(
        "ensembles-ahead-phases",
        PERF,
        ("2026-11-26-h200/dlwp-ens-2a9383c.json",),
        workflow_phases,
    ),
    Figure(
        "workflow-phases",
        PERF,
        (
            "2026-11-25-h100-night/workflow-fcn-async.json",
            "2026-11-25-h100-night/workflow-fcn-overlapped.json",
        ),
        workflow_phases,
    ),
    Figure(
        "second-call", "README.md", ("2026-11-25-h100/second_call.json",), second_call
    ),
    Figure(
        "rollouts",
        "docs/user-guide.md",
        tuple(
            _H23 + f
            for f in (
                "bench-fcn-max-autotune.json",
                "bench-dlwp-40.json",
                "bench-sfno-final.json",
                "bench-sfno-final-fp32.json",
                "bench-persistence.json",
            )
        ),
        rollouts(),
    ),
    Figure(
        "aot",
        PERF,
        ("2026-11-24-h100/bench-fcn-aot.json", "2026-11-24-h100/bench-dlwp-aot.json"),
        rollouts(forecast=40),
    ),
    Figure(
        "cpu-aot", PERF, ("2026-11-24-cpu-aot/bench-fcn-small-aot.json",), rollouts()
    ),
    Figure("cpu-small", PERF, ("2026-11-23-cpu-small.json",), rollouts()),
    Figure(
        "cpu-cluster",
        PERF,
        ("2026-11-24-cpu-cluster/wall.json", "2026-11-24-cpu-cluster/wall-4.json"),
        cluster,
    ),
    Figure("cpu-overlap", PERF, ("2026-11-24-cpu-overlap/result.json",), overlap),
    Figure(
        "runs-1-3",
        PERF,
        (_H23 + "bench-fcn-dlwp.json", _H23 + "bench-dlwp-sfno.json"),
        rollouts(),
    ),
    Figure("run-6", PERF, (_H23 + "bench-dlwp-warmfix.json",), rollouts()),
    Figure("run-7-fp32", PERF, (_H23 + "bench-fp32.json",), rollouts()),
    Figure(
        "kernels", PERF, (_H23 + "kernels.json", _H23 + "kernels-sfno.json"), kernels
    ),
    Figure("run-11-sfno-opaque", PERF, (_H23 + "bench-sfno-opaque.json",), rollouts()),
    Figure(
        "run-13-sfno-fp32-options",
        PERF,
        (_H23 + "bench-sfno-fp32-default-options.json",),
        rollouts(),
    ),
    Figure("warm-phases", PERF, (_H23 + "bench-warm-phases.json",), warm_phases),
    Figure("e2e", PERF, (_H23 + "bench-e2e.json",), e2e_profile),
    Figure("e2e-writers", PERF, (_H23 + "bench-e2e-writers.json",), e2e_writers),
    Figure(
        "precision",
        PERF,
        tuple(
            _H23 + f"bench-precision-{m}.json" for m in ("fcn-tf32", "fcn-bf16", "dlwp")
        ),
        rollouts(),
    ),
    Figure("ensembles-h100-twelfth", PERF, _RUNS_TWELFTH, workflow),
    Figure("ensembles-h100-twelfth-floors", PERF, _RUNS_TWELFTH, workflow_floors),
    Figure("ensembles-h100-twelfth-first", PERF, _RUNS_TWELFTH, workflow_first_steps),
    Figure("ensembles-h100-thirteenth", PERF, _RUNS_THIRTEENTH, workflow),
    Figure(
        "ensembles-h100-thirteenth-first", PERF, _RUNS_THIRTEENTH, workflow_first_steps
    ),
    Figure("ensembles-h100-fourteenth", PERF, _RUNS_FOURTEENTH, workflow),
    Figure(
        "ensembles-h100-fourteenth-first", PERF, _RUNS_FOURTEENTH, workflow_first_steps
    ),
    Figure("ensembles-h100-fifteenth", PERF, _RUNS_FIFTEENTH, workflow),
    Figure(
        "ensembles-h100-fifteenth-first", PERF, _RUNS_FIFTEENTH, workflow_first_steps
    ),
    Figure("ensembles-h100-sixteenth", PERF, _RUNS_SIXTEENTH, workflow),
    Figure("ensembles-h100-sixteenth-floors", PERF, _RUNS_SIXTEENTH, workflow_floors),
    Figure(
        "ensembles-h100-sixteenth-first", PERF, _RUNS_SIXTEENTH, workflow_first_steps
    ),
    Figure("ensembles-h100-seventeenth", PERF, _RUNS_SEVENTEENTH, workflow),
    Figure(
        "ensembles-h100-seventeenth-floors", PERF, _RUNS_SEVENTEENTH, workflow_floors
    ),
    Figure(
        "ensembles-h100-seventeenth-first",
        PERF,
        _RUNS_SEVENTEENTH,
        workflow_first_steps,
    ),
    Figure("ensembles-h100-eighteenth", PERF, _RUNS_EIGHTEENTH, workflow),
    Figure(
        "ensembles-h100-eighteenth-first", PERF, _RUNS_EIGHTEENTH, workflow_first_steps
    ),
    Figure("ensembles-h100-nineteenth", PERF, _RUNS_NINETEENTH, workflow),
    Figure(
        "ensembles-h100-nineteenth-threads", PERF, _RUNS_NINETEENTH, workflow_threads
    ),
    Figure(
        "ensembles-h100-nineteenth-first", PERF, _RUNS_NINETEENTH, workflow_first_steps
    ),
    Figure("ensembles-h200-twentieth", PERF, _RUNS_TWENTIETH, workflow),
    Figure(
        "ensembles-h200-twentieth-first", PERF, _RUNS_TWENTIETH, workflow_first_steps
    ),
    Figure("ensembles-h200-twentyfirst", PERF, _RUNS_TWENTYFIRST, workflow),
    Figure(
        "ensembles-h200-twentyfirst-first",
        PERF,
        _RUNS_TWENTYFIRST,
        workflow_first_steps,
    ),
    Figure("ensembles-h200-twentysecond", PERF, _RUNS_TWENTYSECOND, workflow),
    Figure(
        "ensembles-h200-twentysecond-first",
        PERF,
        _RUNS_TWENTYSECOND,
        workflow_first_steps,
    ),
    Figure("ensembles-h200-twentythird", PERF, _RUNS_TWENTYTHIRD, workflow),
    Figure(
        "ensembles-h200-twentythird-first",
        PERF,
        _RUNS_TWENTYTHIRD,
        workflow_first_steps,
    ),
    Figure("ensembles-h200-twentyfourth", PERF, _RUNS_TWENTYFOURTH, workflow),
    Figure(
        "ensembles-h200-twentyfourth-first",
        PERF,
        _RUNS_TWENTYFOURTH,
        workflow_first_steps,
    ),
    Figure("ensembles-h200-twentyfifth", PERF, _RUNS_TWENTYFIFTH, workflow),
    Figure(
        "ensembles-h200-twentyfifth-first",
        PERF,
        _RUNS_TWENTYFIFTH,
        workflow_first_steps,
    ),
    Figure("ensembles-h200-twentysixth", PERF, _RUNS_TWENTYSIXTH, workflow),
    Figure(
        "ensembles-h200-twentysixth-first",
        PERF,
        _RUNS_TWENTYSIXTH,
        workflow_first_steps,
    ),
    Figure("ensembles-h200-thirtyfifth", PERF, _RUNS_THIRTYFIFTH, workflow),
    Figure(
        "ensembles-h200-thirtyfifth-floors", PERF, _RUNS_THIRTYFIFTH, workflow_floors
    ),
    Figure(
        "ensembles-h200-thirtyfifth-first",
        PERF,
        _RUNS_THIRTYFIFTH,
        workflow_first_steps,
    ),
    Figure("ensembles-h200-thirtyseventh", PERF, _RUNS_THIRTYSEVENTH, workflow),
    Figure(
        "ensembles-h200-thirtyseventh-first",
        PERF,
        _RUNS_THIRTYSEVENTH,
        workflow_first_steps,
    ),
    Figure("async-h200-thirtyeighth", PERF, _RUNS_THIRTYEIGHTH, workflow),
    Figure("floors-h200-thirtyninth", PERF, _RUNS_THIRTYNINTH, workflow),
    Figure(
        "floors-h200-thirtyninth-first", PERF, _RUNS_THIRTYNINTH, workflow_first_steps
    ),
    *MODEL_FIGURES,
)
