"""``python -m earth2studio_compile.tools.bench.kernels``: a step's time, by kernel.

Profiles a few steady-state rollout steps (after compilation, CUDA-graph recording and
the session's speed probe) with :mod:`torch.profiler`, eager and compiled, and splits
the device time by kernel family: GEMM, FFT, convolution, Inductor's fused Triton
kernels, copies, other. ``host ms`` is wall time minus device busy time: a step that
is mostly host time is bound by Python, numpy or synchronizations, which compiling
the core cannot shorten. ``--precision`` runs the cores as a session would in it
(eager: :func:`.measure.eager_precision`); ``--runs eager`` profiles eager steps only:
their GEMM, attention and convolution time is what compiling in the default modes
cannot shorten (Inductor calls the same cuBLAS, cuDNN and attention kernels).

Examples
--------
::

    python -m earth2studio_compile.tools.bench.kernels --models fcn,dlwp \\
        --json kernels.json
    python -m earth2studio_compile.tools.bench.kernels --models aurora \\
        --precision tf32 --runs eager
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from earth2studio_compile.metrics import synchronize
from earth2studio_compile.tools.bench.attention import (
    HELP,
    attention_choice,
    parse_attention,
)
from earth2studio_compile.tools.bench.runs import initial_state
from earth2studio_compile.tools.bench.text import format_table

# First match wins; names are CUDA kernel names as the profiler reports them.
FAMILIES = (
    # Before GEMM: fused attention kernels carry CUTLASS in their names.
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("fft", re.compile(r"fft|regular_fft|vector_fft", re.I)),
    (
        "gemm",
        # nvjet: cuBLASLt's Hopper GEMMs, whose names say neither gemm nor cublas.
        re.compile(
            r"gemm|sm90_xmma|cutlass|cublas|ampere_sgemm|sgemm|matmul|^nvjet", re.I
        ),
    ),
    ("conv", re.compile(r"conv|cudnn|implicit_convolve|winograd|xmma_fprop", re.I)),
    ("triton", re.compile(r"^triton_|triton", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy", re.I)),
)
WARM_STEPS = 16  # past compilation, CUDA-graph recording and probe calls 3-8
SWITCH_STEPS = 4  # after background builds: the switch, its verification, the capture
TOP = 12


def _family(name: str) -> str:
    found = (family for family, pattern in FAMILIES if pattern.search(name))
    return next(found, "other")


def profile_steps(
    model: Any,
    device: torch.device,
    steps: int,
    compiled: bool,
    precision: str | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Milliseconds per step: wall, device busy, host, and device time per family.

    ``precision`` (``fp32``, ``tf32``, ``bf16`` or None: PyTorch's settings) is the
    cores', compiled or eager alike; ``options`` are Inductor's (compiled only).
    Compiled, a region whose artifact is building in the background runs eagerly
    meanwhile: the profile waits for the builds and for the switch to them, and
    ``statuses`` says what the regions ran as, ``modes`` what they were compiled
    with (their policies' labels: the table's options and SDPA backends, e.g.
    ``inductor/reduce-overhead+attention=math``). ``top`` lists the :data:`TOP`
    kernels that took the most device time, ms per step.
    """
    from torch.profiler import ProfilerActivity, profile

    from earth2studio_compile import CompileSession, wait_for_builds
    from earth2studio_compile.tools.bench.measure import eager_precision

    x, coords = initial_state(model, device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    session = (
        CompileSession(model, precision=precision, options=options)
        if compiled
        else None
    )
    with session or eager_precision(model, precision):
        iterator = model.create_iterator(x, coords)
        for _ in range(1 + WARM_STEPS):
            next(iterator)
        if compiled and any(j.poll() == "built" for j in wait_for_builds()):
            for _ in range(SWITCH_STEPS):
                next(iterator)
        synchronize(device)
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                next(iterator)
            synchronize(device)
            wall = time.perf_counter() - start
        iterator.close()
    totals = {family: 0.0 for family, _ in FAMILIES} | {"other": 0.0}
    kernels: Counter[str] = Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            ms = event.device_time_total / 1e3  # us -> ms
            totals[_family(event.name)] += ms
            kernels[event.name] += ms
    busy = sum(totals.values())
    out: dict[str, Any] = {"wall_ms": 1e3 * wall / steps, "device_ms": busy / steps}
    out["host_ms"] = out["wall_ms"] - out["device_ms"]
    out |= {f"{family}_ms": value / steps for family, value in totals.items()}
    out["top"] = [[name, ms / steps] for name, ms in kernels.most_common(TOP)]
    if session is not None:
        out["statuses"] = sorted({r.status for r in session.report.regions})
        out["modes"] = sorted({r.mode for r in session.report.regions if r.mode})
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """Plain-text table of :func:`profile_steps` results."""
    families = [f"{f}_ms" for f, _ in FAMILIES]
    keys = ["wall_ms", "device_ms", "host_ms", *families, "other_ms"]
    header = ["model", "run", *(k.replace("_ms", " ms") for k in keys)]
    cells = [[r["model"], r["run"], *(f"{r[k]:.2f}" for k in keys)] for r in rows]
    return format_table(header, cells)


def main(argv: list[str] | None = None) -> int:
    """Entry point: profile each model eager then compiled, in this process."""
    from loguru import logger

    from earth2studio_compile.precision import PRECISIONS
    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench.env import environment
    from earth2studio_compile.tools.build import inductor_options

    p = argparse.ArgumentParser(
        prog="python -m earth2studio_compile.tools.bench.kernels",
        description=__doc__.split("\n")[0],
    )
    p.add_argument(
        "--models",
        default="fcn,dlwp",
        help="comma-separated zoo models (default fcn,dlwp)",
    )
    p.add_argument(
        "--small", action="store_true", help="small grids and networks (CPU)"
    )
    p.add_argument("--steps", type=int, default=6, help="profiled steps (default 6)")
    p.add_argument(
        "--device", default=None, help="cuda or cpu (default: cuda if available)"
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="the cores' precision, eager and compiled (default: PyTorch's settings)",
    )
    p.add_argument(
        "--options",
        type=inductor_options,
        default=None,
        help="Inductor options of the compiled runs, a JSON object",
    )
    p.add_argument(
        "--attention",
        type=parse_attention,
        default=None,
        help=f"the {HELP}",
    )
    p.add_argument(
        "--runs",
        default="eager,compiled",
        help="comma-separated: eager, compiled (default both)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    runs = [r for r in args.runs.split(",") if r]
    if not runs or not set(runs) <= {"eager", "compiled"}:
        p.error(f"--runs takes eager, compiled or both, not {args.runs!r}")
    cuda = torch.cuda.is_available()
    device = torch.device(args.device or ("cuda" if cuda else "cpu"))
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    env = environment(device.type)  # the docs' figures name GPU, torch and date
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        model = zoo.build(name, size="small" if args.small else "full").to(device)
        for run in runs:
            row = {"model": name, "run": run, "precision": args.precision}
            row["options"] = args.options if run == "compiled" else None
            chosen = args.attention if run == "compiled" else None
            row["attention"] = list(chosen) if chosen is not None else None
            with attention_choice(model, chosen):
                profiled = profile_steps(
                    model,
                    device,
                    args.steps,
                    run == "compiled",
                    args.precision,
                    args.options,
                )
            rows.append(row | profiled)
            if args.json:  # after every row: a call cut short keeps the rest
                payload: dict[str, Any] = {"argv": sys.argv, "device": str(device)}
                payload |= {"environment": env, "rows": rows}
                args.json.write_text(json.dumps(payload, indent=2))
    print(table(rows))
    for row in rows:
        ran = ", ".join(row.get("statuses", []) + row.get("modes", []))
        print(f"\n{row['model']} {row['run']}: {ran}")
        for name, ms in row["top"]:
            print(f"  {ms:9.2f} ms  {_family(name):9s} {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
