"""docs/models.md's figure blocks: the models people run in 2026 (issue 33), each
block's name, its JSON files under ``docs/bench/`` and its renderer. A new run adds
its JSON and a :class:`~.figure_block.Figure` here, and a block to docs/models.md.
"""

from __future__ import annotations

from earth2studio_compile.tools.bench.attention import attention_calls
from earth2studio_compile.tools.bench.figure_block import Figure
from earth2studio_compile.tools.bench.model_runs import model_runs
from earth2studio_compile.tools.bench.tables import (
    kernels,
    loop_calls,
    region_probes,
    rollouts,
)
from earth2studio_compile.tools.bench.workflow_figures import (
    workflow,
    workflow_first_steps,
)

__all__ = ["MODEL_FIGURES"]

_TWENTYFOURTH = "2026-11-29-h200-twentyfourth/"
_TWENTYSIXTH = "2026-11-29-h200-twentysixth/"
_THIRTYFIFTH = "2026-11-30-h200-thirtyfifth/"
_NINTH = "2026-11-27-h100-ninth/"
_TENTH = "2026-11-27-h100-tenth/"
_ELEVENTH = "2026-11-27-h100-eleventh/"
_TWENTYSEVENTH = "2026-11-29-h200-twentyseventh/"
_RUNS_TWENTYSEVENTH = (
    _TWENTYSEVENTH + "stormcast-calls-70e27ba.json",
    _TWENTYSEVENTH + "ace2-calls-ee629a8.json",
)
_TWENTYEIGHTH = "2026-11-29-h200-twentyeighth/"
_RUNS_TWENTYEIGHTH = (_TWENTYEIGHTH + "ace2-calls-951fbda.json",)
_DLESYM_TWENTYEIGHTH = (
    _TWENTYEIGHTH + "dlesym-calls-951fbda.json",
    _TWENTYEIGHTH + "dlesym-built-951fbda.json",
    _TWENTYEIGHTH + "dlesym-built-f9b0996.json",
)
_TWENTYNINTH = "2026-11-29-h200-twentyninth/"
_RUNS_TWENTYNINTH = (
    _TWENTYNINTH + "ace2-calls-740bdf0.json",
    _TWENTYNINTH + "ace2-built-calls-c73fbe3.json",
)
_THIRTYTHIRD = "2026-11-30-h200-thirtythird/"
_THIRTYSEVENTH = "2026-11-30-h200-thirtyseventh/"
_THIRTYEIGHTH = "2026-11-30-h200-thirtyeighth/"
_THIRTYNINTH = "2026-11-30-h200-thirtyninth/"
_FORTIETH = "2026-11-30-h200-fortieth/"
_FORTYFIRST = "2026-11-30-h200-fortyfirst/"
_FORTYSECOND = "2026-12-01-h200-fortysecond/"
_FORTYTHIRD = "2026-12-01-h200-fortythird/"
_FORTYFOURTH = "2026-12-01-h200-fortyfourth/"
# The rollouts at c7a5b5a ran with the Dynamo first-call check (3ce0d02): the
# thirty-fourth's bf16 rollout at 2183afa, without it, is kept in its README.
_AURORA_BF16 = (_THIRTYFIFTH + "aurora-bf16-c7a5b5a.json",)
_AURORA_TF32 = (_THIRTYFIFTH + "aurora-tf32-c7a5b5a.json",)
# The first TF32 rollout with the table's SDPA math path in the compiled regions.
_AURORA_TF32_MATH = (_FORTYFIRST + "aurora-tf32-1b652ea.json",)
_AURORA_THIRTYTHIRD = (
    _THIRTYTHIRD + "aurora-cold-0efea4c.json",
    _THIRTYTHIRD + "aurora-calls-0efea4c.json",
)
MODELS = "docs/models.md"
MODEL_FIGURES: tuple[Figure, ...] = (
    Figure(
        "models-published",
        MODELS,
        (_NINTH + "aurora-rollout-b3a8d58.json", _NINTH + "stormcast-aot-b3a8d58.json"),
        rollouts(forecast=20),
    ),
    Figure(
        "models-kernels",
        MODELS,
        tuple(
            _NINTH + f"kernels-{m}-tf32-b3a8d58.json"
            for m in ("aurora-eager", "stormcast-eager", "stormcast-compiled")
        ),
        kernels,
    ),
    Figure(
        "models-aurora-calls",
        MODELS,
        (_NINTH + "aurora-second-b3a8d58.json",),
        workflow,
    ),
    Figure(
        "models-stormcast-layout",
        MODELS,
        tuple(
            _TENTH + f"kernels-stormcast-compiled-tf32{tail}-12b5754.json"
            for tail in ("", "-layout-off")
        ),
        kernels,
    ),
    Figure(
        "models-aurora-built",
        MODELS,
        (_ELEVENTH + "aurora-built-174aaeb.json",),
        workflow,
    ),
    Figure(
        "models-runs",
        MODELS,
        # Aurora's rollouts before the thirty-fourth's (the ninth's, the
        # twenty-ninth's) ran before the Swin patch, the ninth's with an identity
        # backbone.
        (
            *_AURORA_THIRTYTHIRD,
            *_AURORA_BF16,
            *_AURORA_TF32_MATH,
            _NINTH + "stormcast-aot-b3a8d58.json",
            _TWENTYSIXTH + "fcn-ens-5562bf9.json",
            _TWENTYFOURTH + "dlwp-ens-all-a3ecc5f.json",
        ),
        model_runs(),
    ),
    Figure("models-calls-h200-twentyseventh", MODELS, _RUNS_TWENTYSEVENTH, workflow),
    Figure(
        "models-calls-h200-twentyseventh-first",
        MODELS,
        _RUNS_TWENTYSEVENTH,
        workflow_first_steps,
    ),
    Figure("models-calls-h200-twentyeighth", MODELS, _RUNS_TWENTYEIGHTH, workflow),
    Figure("models-dlesym-h200-twentyeighth", MODELS, _DLESYM_TWENTYEIGHTH, loop_calls),
    Figure("models-calls-h200-twentyninth", MODELS, _RUNS_TWENTYNINTH, workflow),
    Figure("models-aurora-calls-h200", MODELS, _AURORA_THIRTYTHIRD, workflow),
    Figure(
        "models-aurora-calls-h200-first",
        MODELS,
        _AURORA_THIRTYTHIRD,
        workflow_first_steps,
    ),
    Figure("models-aurora-bf16", MODELS, _AURORA_BF16, rollouts(forecast=20)),
    Figure("models-aurora-bf16-stages", MODELS, _AURORA_BF16, region_probes),
    Figure("models-aurora-tf32", MODELS, _AURORA_TF32, rollouts(forecast=20)),
    Figure("models-aurora-tf32-stages", MODELS, _AURORA_TF32, region_probes),
    Figure(
        "models-aurora-bf16-kernels",
        MODELS,
        (_TWENTYNINTH + "kernels-aurora-eager-bf16-c73fbe3.json",),
        kernels,
    ),
    Figure(
        "models-aurora-tf32-kernels",
        MODELS,
        (_THIRTYSEVENTH + "kernels-aurora-tf32-93137e7.json",),
        kernels,
    ),
    Figure(
        "models-sfno-calls-h200",
        MODELS,
        (_THIRTYSEVENTH + "sfno-calls-93137e7.json",),
        workflow,
    ),
    Figure(
        "models-sfno-calls-h200-thirtyeighth",
        MODELS,
        (_THIRTYEIGHTH + "sfno-calls-f91cbb4.json",),
        workflow,
    ),
    Figure(
        "models-aifs2ens-calls-h200",
        MODELS,
        (_THIRTYEIGHTH + "aifs2ens-calls-f91cbb4.json",),
        workflow,
    ),
    Figure(
        "models-aifs2ens-calls-h200-thirtyninth",
        MODELS,
        (_THIRTYNINTH + "aifs2ens-calls-9592db1.json",),
        workflow,
    ),
    Figure(
        "models-aurora-sdpa-default-h200",
        MODELS,
        (_FORTIETH + "kernels-aurora-tf32-eager-c765023.json",),
        kernels,
    ),
    Figure(
        "models-aurora-sdpa-math-h200",
        MODELS,
        tuple(
            _FORTIETH + f"kernels-aurora-tf32-{run}-math-c765023.json"
            for run in ("eager", "compiled")
        ),
        kernels,
    ),
    Figure(
        "models-aifs2ens-flash-calls-h200",
        MODELS,
        tuple(
            _FORTIETH + f"aifs2ens-flash-{name}-e215f86.json"
            for name in ("calls", "second")
        ),
        workflow,
    ),
    Figure(
        "models-aurora-sdpa-table-h200",
        MODELS,
        tuple(
            _FORTYFIRST + f"kernels-aurora-tf32-{run}-table-1b652ea.json"
            for run in ("eager", "compiled")
        ),
        kernels,
    ),
    Figure("models-aurora-tf32-math", MODELS, _AURORA_TF32_MATH, rollouts(forecast=20)),
    Figure("models-aurora-tf32-math-stages", MODELS, _AURORA_TF32_MATH, region_probes),
    Figure(
        "models-aurora-tf32-flex-stages",
        MODELS,
        (_FORTYTHIRD + "aurora-tf32-flex-0ef878b.json",),
        region_probes,
    ),
    Figure(
        "models-aifs2ens-flash-built-h200",
        MODELS,
        (_FORTYFIRST + "aifs2ens-flash-calls-1b652ea.json",),
        workflow,
    ),
    Figure(
        "models-fcn3-calls-h200",
        MODELS,
        (_FORTYFIRST + "fcn3-calls-1b652ea.json",),
        workflow,
    ),
    Figure(
        "models-fcn3-warm-second-h200",
        MODELS,
        (_FORTYSECOND + "fcn3-calls-d275766.json",),
        workflow,
    ),
    Figure(
        "models-aurora-swin-attention-h200",
        MODELS,
        (_FORTYSECOND + "swin-attention-d275766.json",),
        attention_calls,
    ),
    Figure(
        "models-aurora-flex-h200",
        MODELS,
        (
            _FORTYFIRST + "kernels-aurora-tf32-eager-table-1b652ea.json",
            _FORTYFIRST + "kernels-aurora-tf32-compiled-table-1b652ea.json",
            _FORTYSECOND + "kernels-aurora-tf32-compiled-decompose-d275766.json",
            _FORTYSECOND + "kernels-aurora-tf32-compiled-flex-5c89ec5.json",
        ),
        kernels,
    ),
    Figure(
        "models-fcn3-calls-h200-fortyfourth",
        MODELS,
        (_FORTYFOURTH + "fcn3-calls-1298e76.json",),
        workflow,
    ),
    Figure(
        "models-aurora-flex-calls-h200",
        MODELS,
        (_FORTYFOURTH + "aurora-flex-calls-1298e76.json",),
        workflow,
    ),
)
