"""Ensemble mode of the benchmark: upstream's ``ensemble`` workflow, run for real.

``python -m earth2studio_compile.tools.bench --ensemble N --batch-size B[,B...]`` runs
Earth2Studio's ``earth2studio.run.ensemble`` (N members, a seeded ``Gaussian``
perturbation, a seeded ``Random`` initial state) once per row, each row in a fresh
process, and writes the JSON after every row. Rows, per model, IO backend and batch
size:

``eager``
    Upstream as shipped, TF32 off everywhere (the fp32 reference).
``eager-tf32``
    Upstream with PyTorch's TF32 switches on (``torch.backends.cuda.matmul`` and
    ``cudnn``), restored afterwards: the one line a user can add by hand. CUDA only.
``compiled``
    Ours: upstream's ``ensemble`` inside a :class:`~earth2studio_compile.CompileSession`
    with ``precision`` fp32, tf32 or bf16, which is what
    ``earth2studio_compile.run.ensemble(..., compile=True)`` does with
    ``EARTH2STUDIO_COMPILE_PRECISION`` set. With a warm start (the default), a short
    "prime" process (one batch, two steps) compiles cold and saves the portable
    bundles, then the measured row starts warm from them in a fresh process with an
    empty local Inductor cache, as the rollout benchmark's warm rows do.

Each row reports members x steps per second from the call of ``ensemble`` until the
store is written (first step included) and with the first step apart, the first
step's seconds, peak GPU memory per member, relative L2 at lead step 1 against the
eager fp32 row of the same batch size (the perturbation's draws depend on the batch
shape), and a per-step breakdown from a second, instrumented run of one batch,
synchronized around each phase with :mod:`..e2e`'s machinery plus timers on the core
network and the perturbation. A row that runs out of GPU memory is recorded as such
and larger batches of its kind are skipped.

Modules: :mod:`.upstream` (the kinds of row and one run of upstream's workflow),
:mod:`.measure` (one row, in the child process), :mod:`.breakdown` (the per-step
breakdown), :mod:`.tables` (the summary and the tables), :mod:`.rows` (the CLI's plan
and loop). Every name is imported from here.
"""

from __future__ import annotations

from earth2studio_compile.tools.bench.ensemble.breakdown import (
    BREAKDOWN_STEPS,
    STEP,
    breakdown,
    core_timer,
)
from earth2studio_compile.tools.bench.ensemble.measure import (
    first_step_timer,
    measure_ensemble,
)
from earth2studio_compile.tools.bench.ensemble.rows import plan_rows, run_rows
from earth2studio_compile.tools.bench.ensemble.tables import (
    ROW_HEADER,
    label,
    measured,
    row_line,
    summarize,
    tables,
)
from earth2studio_compile.tools.bench.ensemble.upstream import (
    COMPILED,
    EAGER,
    EAGER_TF32,
    FEW,
    IO_CHOICES,
    NOISE,
    OUTPUTS,
    make_ensemble_io,
    output_coords,
    read_step,
    run_ensemble,
    store_bytes,
    tf32,
)

__all__ = [
    "BREAKDOWN_STEPS",
    "COMPILED",
    "EAGER",
    "EAGER_TF32",
    "FEW",
    "IO_CHOICES",
    "NOISE",
    "OUTPUTS",
    "ROW_HEADER",
    "STEP",
    "breakdown",
    "core_timer",
    "first_step_timer",
    "label",
    "make_ensemble_io",
    "measure_ensemble",
    "measured",
    "output_coords",
    "plan_rows",
    "read_step",
    "row_line",
    "run_ensemble",
    "run_rows",
    "store_bytes",
    "summarize",
    "tables",
    "tf32",
]
