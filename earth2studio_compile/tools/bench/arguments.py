"""The bench CLI's arguments: the rollout and end-to-end modes', and ``--ensemble``'s.

:func:`parse` reads and checks them (an error names the fix) and adds the parsed
lists the runners use (``model_list``, ``mode_list``, ``io_list``, ...); with
``--ensemble`` it hands over to :func:`parse_ensemble`. The ``workflow`` mode has its
own (:func:`earth2studio_compile.tools.bench.workflow.parse`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from earth2studio_compile.tools.bench.attention import HELP, parse_attention
from earth2studio_compile.tools.bench.e2e import IO_BACKENDS
from earth2studio_compile.tools.bench.measure import AUTO

DEFAULT_MODELS = "fcn,dlwp,sfno,persistence"


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The CLI's arguments, checked, with the parsed lists its runners use."""
    p = argparse.ArgumentParser(
        prog="earth2studio-compile-bench",
        description="Time eager vs torch.compile'd rollouts of Earth2Studio models "
        "(random weights), each model and mode in a fresh process.",
    )
    p.add_argument(
        "--models",
        default=DEFAULT_MODELS,
        help=f"comma-separated: fcn, dlwp, sfno, persistence, toy or module:callable "
        f"(default {DEFAULT_MODELS})",
    )
    p.add_argument(
        "--small", action="store_true", help="small grids and networks (CPU)"
    )
    p.add_argument(
        "--modes",
        default=AUTO,
        help="comma-separated compiled modes: auto (the flag's default: "
        "reduce-overhead on CUDA, default on CPU), default, reduce-overhead, "
        "max-autotune, max-autotune-no-cudagraphs (default auto)",
    )
    p.add_argument("--steps", type=int, default=20, help="forecast steps (>= 11)")
    p.add_argument(
        "--e2e-steps",
        type=int,
        default=10,
        help="steps of the end-to-end deterministic workflow with a Zarr store; "
        "0 skips",
    )
    p.add_argument(
        "--io",
        default="",
        help="comma-separated IO backends for the end-to-end profile and overlapped "
        f"writing: {', '.join(IO_BACKENDS)} (default: none); one more fresh process "
        "per model, --e2e-steps steps (20 if 0)",
    )
    p.add_argument(
        "--writers",
        default="auto",
        help="comma-separated parallel-writing rows of the end-to-end profile: auto "
        "(OverlappedIO's default for the backend) or worker counts >= 2, each run "
        "compiled on backends that take parallel writes (default auto); the "
        "one-writer OverlappedIO row is always measured",
    )
    p.add_argument(
        "--skip-rollouts",
        action="store_true",
        help="measure only the end-to-end profile (needs --io)",
    )
    p.add_argument(
        "--fp32",
        action="store_true",
        help="turn TF32 off for cuDNN and matmul (default: PyTorch's defaults, which "
        "let cuDNN convolutions use TF32 on CUDA)",
    )
    p.add_argument(
        "--precision",
        default="",
        help="comma-separated precisions inside the compiled cores: fp32, tf32, bf16 "
        "(default: none, PyTorch's settings). Adds eager and compiled rows per "
        "precision, timed and compared (rel. L2 after steps 1, 10 and N) against "
        "one fp32 eager run with TF32 off",
    )
    p.add_argument(
        "--no-precision-eager",
        dest="precision_eager",
        action="store_false",
        help="with --precision, skip the eager rows of tf32 and bf16 (each row is a "
        "fresh process; the fp32 eager reference always runs)",
    )
    p.add_argument(
        "--aot",
        action="store_true",
        help="add an ahead-of-time row per compiled setup: a fresh process builds the "
        "artifact (python -m earth2studio_compile.tools.build), then a fresh process "
        "with an empty local Inductor cache runs the rollout, which finds it",
    )
    p.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        help="skip the warm-start run (a second fresh process with an empty local "
        "Inductor cache and the first run's portable cache bundles)",
    )
    p.add_argument(
        "--device", default=None, help="cuda or cpu (default: cuda if available)"
    )
    p.add_argument(
        "--ensemble",
        type=int,
        default=0,
        metavar="N",
        help="run upstream's ensemble workflow with N members instead (ensemble/)",
    )
    p.add_argument(
        "--batch-size",
        default="",
        help="with --ensemble: comma-separated members per batch (default N)",
    )
    p.add_argument(
        "--all-variables",
        action="store_true",
        help="with --ensemble: also write every variable at the largest batch size",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="with --ensemble: seconds from the start after which no row starts, nor "
        "one that an earlier row of its kind says cannot finish in the time left "
        "(marked skipped; the JSON holds every row that finished)",
    )
    p.add_argument(
        "--attention", type=parse_attention, default=None, help=f"the {HELP}"
    )
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG figure here")
    p.add_argument("--timeout", type=int, default=900, help="seconds per measurement")
    p.add_argument(
        "--render",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="measure nothing: merge these --json files into one table (and --plot)",
    )
    args = p.parse_args(argv)
    if args.ensemble:
        return parse_ensemble(p, args)
    if args.deadline is not None:
        p.error("--deadline works with --ensemble (and the workflow mode)")
    if args.steps < 11:
        p.error("--steps must be >= 11 (the median of >= 10 steady-state steps)")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cuda", "cpu"):
        p.error(f"--device must be cuda or cpu, not {args.device!r}")
    modes = [m for m in args.modes.split(",") if m]
    from earth2studio_compile.options import inductor_modes

    for mode in modes:
        if mode != AUTO and mode not in inductor_modes():
            p.error(f"unknown mode {mode!r}; use auto or one of {inductor_modes()}")
    args.mode_list = modes
    args.precision_list = [x for x in args.precision.split(",") if x]
    from earth2studio_compile.precision import PRECISIONS

    for chosen in args.precision_list:
        if chosen not in PRECISIONS:
            p.error(f"unknown precision {chosen!r}; use {', '.join(PRECISIONS)}")
    if args.precision_list and args.fp32:
        p.error("--precision sets TF32 per row; drop --fp32")
    args.io_list = [b for b in args.io.split(",") if b]
    if args.skip_rollouts and not args.io_list:
        p.error("--skip-rollouts leaves nothing to measure without --io")
    for backend in args.io_list:
        if backend not in IO_BACKENDS:
            p.error(f"unknown IO backend {backend!r}; use {', '.join(IO_BACKENDS)}")
    args.writer_list = []
    for chosen in (w.strip() for w in args.writers.split(",") if w.strip()):
        if chosen != "auto" and not (chosen.isdigit() and int(chosen) >= 2):
            p.error(f"--writers takes auto or worker counts >= 2, not {chosen!r}")
        args.writer_list.append(chosen if chosen == "auto" else int(chosen))
    args.model_list = [m for m in args.models.split(",") if m]
    return args


def parse_ensemble(
    p: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.Namespace:
    """The arguments of ``--ensemble`` (see :mod:`.ensemble`)."""
    from earth2studio_compile.precision import PRECISIONS
    from earth2studio_compile.tools.bench.ensemble import IO_CHOICES

    if args.ensemble < 1 or args.steps < 1:
        p.error("--ensemble and --steps must be >= 1")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = [b.strip() for b in args.batch_size.split(",") if b.strip()]
    if not all(b.isdigit() and int(b) >= 1 for b in sizes):
        p.error(f"--batch-size takes positive integers, not {args.batch_size!r}")
    args.batch_list = sorted({min(int(b), args.ensemble) for b in sizes}) or [
        args.ensemble
    ]
    args.precision_list = [x for x in args.precision.split(",") if x]
    for chosen in args.precision_list:
        if chosen not in PRECISIONS:
            p.error(f"unknown precision {chosen!r}; use {', '.join(PRECISIONS)}")
    args.io_list = [b for b in args.io.split(",") if b]
    for backend in args.io_list:
        if backend not in IO_CHOICES:
            p.error(f"--ensemble writes to {', '.join(IO_CHOICES)}, not {backend!r}")
    args.model_list = [m for m in args.models.split(",") if m]
    return args
