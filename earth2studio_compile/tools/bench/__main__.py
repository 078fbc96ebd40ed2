"""``python -m earth2studio_compile.tools.bench``: eager vs compiled, fresh processes.

Examples
--------
CPU, small models (CI-sized)::

    python -m earth2studio_compile.tools.bench --small --models fcn,persistence \\
        --steps 10

GPU, operational sizes, with the JSON and the figure::

    python -m earth2studio_compile.tools.bench --models fcn,dlwp,sfno,persistence \\
        --json bench.json --plot bench.png

End to end only, Zarr on local disk, eager vs compiled with one and with parallel
writers, and compiled in TF32::

    python -m earth2studio_compile.tools.bench --models fcn --skip-rollouts \\
        --io zarr-disk --e2e-steps 20 --writers auto --precision tf32

Whole workflow calls as a user makes them, fresh processes and second calls (see
:mod:`.workflow` and ``python -m earth2studio_compile.tools.bench workflow --help``)::

    python -m earth2studio_compile.tools.bench workflow --json workflow.json
"""

from __future__ import annotations

import os
import sys

from earth2studio_compile.tools.bench.arguments import (
    DEFAULT_MODELS,
    parse,
    parse_ensemble,
)
from earth2studio_compile.tools.bench.env import environment
from earth2studio_compile.tools.bench.processes import (
    MEASURE,
    build_one,
    run_one,
    say_which_path,
)
from earth2studio_compile.tools.bench.results import (
    ENSEMBLE,
    FORECAST_STEPS,
    HEADER,
    against_eager,
    derive,
    forecast_totals,
    render,
    table,
    warm_lines,
)
from earth2studio_compile.tools.bench.rollouts import run_rollouts

# The names this module has always had (tests patch ``_run_one`` here: the modes get
# the runner from this module).
_parse, _parse_ensemble = parse, parse_ensemble
_run_one, _build_one, _say_which_path = run_one, build_one, say_which_path
_against_eager = against_eager

__all__ = [
    "DEFAULT_MODELS",
    "ENSEMBLE",
    "FORECAST_STEPS",
    "HEADER",
    "MEASURE",
    "derive",
    "forecast_totals",
    "main",
    "render",
    "table",
    "warm_lines",
]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``earth2studio-compile-bench``: hands over to the mode's runner.

    ``workflow`` (:mod:`.workflow`), ``--render`` (:func:`.results.render`),
    ``--ensemble`` (:func:`.ensemble.run_rows`), otherwise the rollout mode
    (:func:`.rollouts.run_rollouts`), each given this module's fresh-process runners.
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["workflow"]:  # whole workflow calls: its own mode and options
        from earth2studio_compile.tools.bench.workflow import main as workflow

        return workflow(argv[1:])
    # The per-step modes time code compiled at the first call (Dynamo, or an
    # artifact from build()); with a background build they would time eager steps
    # as compiled ones. Their children inherit this; the workflow mode keeps the
    # user's default.
    os.environ.setdefault("EARTH2STUDIO_COMPILE_BACKGROUND", "off")
    args = _parse(argv)
    if args.render:
        return render(args.render, args.plot)
    if args.ensemble:
        from earth2studio_compile.tools.bench.ensemble import run_rows

        return run_rows(args, environment(args.device), _run_one)
    return run_rollouts(args, _run_one, _build_one)


if __name__ == "__main__":
    sys.exit(main())
