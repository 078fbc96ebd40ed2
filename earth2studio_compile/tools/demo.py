"""``python -m earth2studio_compile.tools.demo``: a rollout eager, then compiled.

The default model is Earth2Studio's FCN (FourCastNet) around a physicsnemo AFNO with
random weights: a 64x128 grid on CPU, the operational 720x1440 grid on CUDA. Eager
and compiled rollouts alternate, several times, from the same random state. Prints
the time per step with its spread over the rollouts, the speedup (or that there is
none to measure), first-step (compile) cost, the relative error of the compiled
rollout, each region's status, then the one-line workflow usage. On CUDA it runs
fp32 and a reduced precision side by side, each measured against fp32 eager with
TF32 off.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# Nothing heavy at module level: importing PyTorch and Earth2Studio takes a minute
# on a small machine, and the banner must come first so the demo does not look hung.
if TYPE_CHECKING:
    import torch

_TF32_NOTE = """\
  (cuDNN convolutions run in TF32, PyTorch's default on CUDA, and eager and
   compiled pick different algorithms: a larger gap than fp32 rounding alone;
   --fp32 turns TF32 off)"""


@dataclass
class Row:
    """One way of running the model, timed over several rollouts.

    Attributes
    ----------
    compiled : bool
        Compiled (a :class:`CompileSession`) or eager
    precision : str | None
        The session's precision (eager rows: the same scope, uncompiled)
    steady_ms : list[float]
        Median ms per step of each rollout (steps after the first model call)
    first_seconds : float
        First step of the first rollout (for a compiled row: the compile)
    errors : tuple[float, float] | None
        Relative L2 against the reference after step 1 and after the last step
    max_abs : tuple[float, float] | None
        Largest absolute difference against the reference, and the reference's
        largest absolute value
    report : dict | None
        The first compiled rollout's session report
    call_seconds : list[float]
        Each rollout's seconds, all its steps (the first one's compile included):
        what a workflow call of that many steps waits for in the model
    """

    compiled: bool
    precision: str | None
    steady_ms: list[float] = field(default_factory=list)
    first_seconds: float = 0.0
    errors: tuple[float, float] | None = None
    max_abs: tuple[float, float] | None = None
    report: dict | None = None
    call_seconds: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        kind = "compiled" if self.compiled else "eager"
        return f"{kind} {self.precision}" if self.precision else kind

    @property
    def ran_compiled(self) -> bool:
        """Whether any region ran compiled code to the end of the first rollout."""
        regions = (self.report or {}).get("regions", [])
        return any(r["status"] == "compiled" for r in regions)


def speedup_text(eager_ms: list[float], compiled_ms: list[float]) -> str:
    """The speedup of paired rollouts, or that the spread hides it.

    Parameters
    ----------
    eager_ms, compiled_ms : list[float]
        Median ms per step of each rollout, eager and compiled, in the order they
        ran (rollout ``i`` of each ran back to back)

    Returns
    -------
    str
        ``"1.31x (1.22-1.40 over 3 rollouts)"``; ``"no measurable difference ..."``
        when the rollouts' ratios lie on both sides of 1; a single rollout has no
        spread and says so
    """
    ratios = [e / c for e, c in zip(eager_ms, compiled_ms)]
    mid = statistics.median(ratios)
    if len(ratios) == 1:
        return f"{mid:.2f}x (one rollout: no spread to judge it by; --repeats 3)"
    low, high = min(ratios), max(ratios)
    spread = f"{low:.2f}-{high:.2f}x over {len(ratios)} rollouts"
    if low <= 1.0 <= high:
        return f"no measurable difference (eager/compiled {spread})"
    return f"{mid:.2f}x ({spread})"


def whole_call_lines(rows: list[Row], steps: int) -> list[str]:
    """Whole rollouts in seconds, the first (compiling) one apart, per row.

    A per-step speedup hides the compile a first call pays: 20 compiled steps can
    take 23 s against 0.08 s eagerly while the per-step table says 1.34x. These
    lines put both figures on screen, and what the first call costs over eager.

    Parameters
    ----------
    rows : list[Row]
        Eager and compiled rows, in pairs, as :func:`_measure` returns them
    steps : int
        Steps per rollout

    Returns
    -------
    list[str]
        A heading, one line per row, and per pair the first call's extra seconds,
        what each later call saves and after how many later calls the compiled
        row is even
    """
    lines = [
        f"  Whole rollout of {steps} steps (a workflow call's model time), seconds: "
        "first rollout / later ones (median)"
    ]
    for row in rows:
        first = row.call_seconds[0]
        later = row.call_seconds[1:]
        rest = f"{statistics.median(later):8.2f} s" if later else "       - "
        note = "  (compiles)" if row.compiled and row.ran_compiled else ""
        lines.append(f"  {row.name:<15} {first:8.2f} s / {rest}{note}")
    for eager, compiled in zip(rows[::2], rows[1::2]):
        extra = compiled.call_seconds[0] - eager.call_seconds[0]
        text = f"  {compiled.name}: the first call takes {extra:+.2f} s against eager"
        if len(eager.call_seconds) > 1 and len(compiled.call_seconds) > 1:
            saved = statistics.median(eager.call_seconds[1:]) - statistics.median(
                compiled.call_seconds[1:]
            )
            text += f", later calls {-saved:+.2f} s each"
            if extra > 0 and saved > 0:
                text += f" (even after {math.ceil(extra / saved)} later calls)"
        lines.append(text)
    return lines


def _ms_text(values: list[float]) -> str:
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:9.2f} ms/step             "
    return f"{mid:9.2f} ms/step ({min(values):.2f}-{max(values):.2f})"


def _eager_reasons(report: dict | None) -> list[str]:
    """``"Model.region: why"`` for each region that did not run compiled."""
    out = []
    for r in (report or {}).get("regions", []):
        if r["status"] == "compiled":
            continue
        label = f"{r['model']}.{r['region']}".rstrip(".")
        why = {
            "eager": "fell back to eager",
            "skipped": "not compiled",
            "pending": "never called",
        }.get(r["status"], r["status"])
        out.append(f"{label} {why}" + (f": {r['reason']}" if r["reason"] else ""))
    return out


def _regions_text(report: dict | None) -> str:
    regions = (report or {}).get("regions", [])
    return ", ".join(
        f"{r['model']}.{r['region']}: {r['status']}".replace(".:", ":") for r in regions
    )


def show_logs(level: str) -> int:
    """Print loguru records from ``level`` above tqdm's bars; the handler's id.

    Colours only on a terminal, so a saved log holds no escape codes.
    """
    from loguru import logger
    from tqdm import tqdm

    return logger.add(
        lambda m: tqdm.write(m, end=""), level=level, colorize=sys.stdout.isatty()
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``earth2studio-compile-demo``."""
    p = argparse.ArgumentParser(
        prog="earth2studio-compile-demo",
        # Plain text: --help shows it as is, so no RST markup from the docstring.
        description="Eager and compiled rollouts of an Earth2Studio model with "
        "random weights, alternating: time per step, the speedup or that there is "
        "none to measure, compile cost and the compiled rollout's error.",
    )
    p.add_argument(
        "--model",
        default="fcn",
        help="fcn, dlwp, sfno, persistence or toy (default fcn)",
    )
    p.add_argument(
        "--size",
        default="auto",
        choices=["auto", "small", "medium", "full"],
        help="model size; auto: full on CUDA, on CPU medium for fcn, else small",
    )
    p.add_argument(
        "--steps", type=int, default=20, help="forecast steps (>= 3, default 20)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="eager and compiled rollouts each, alternating (>= 1, default 3)",
    )
    p.add_argument(
        "--device", default=None, help="cuda or cpu (default: cuda if available)"
    )
    p.add_argument(
        "--precision",
        default="auto",
        help=(
            "comma-separated precisions of the compiled cores (fp32, tf32, bf16), "
            "each also run eagerly and measured against fp32 eager with TF32 off; "
            "'none': PyTorch's settings; auto: fp32,tf32 on CUDA, none on CPU"
        ),
    )
    p.add_argument(
        "--fp32", action="store_true", help="turn TF32 off (cuDNN and matmul)"
    )
    args = p.parse_args(argv)
    if args.steps < 3:
        p.error("--steps must be >= 3")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    # First line before the heavy imports: ~10 s on 2 cores, longer when busy.
    print(
        f"earth2studio-compile demo: {args.model}, {args.steps} steps, "
        f"{args.repeats} eager and {args.repeats} compiled rollout(s)"
    )
    print(
        "loading PyTorch and Earth2Studio (first import takes ~10 s on 2 cores)...",
        flush=True,
    )

    import torch
    from loguru import logger

    cuda = torch.cuda.is_available()
    device = torch.device(args.device or ("cuda" if cuda else "cpu"))
    precisions = _precisions(p, args.precision, device)
    if args.fp32 or precisions:
        # The reference is fp32 with TF32 off; a precision row sets TF32 inside the
        # compiled cores only (CompileSession(precision=...)).
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    if args.size != "auto":
        size = args.size
    elif device.type == "cuda":
        size = "full"
    else:
        size = "medium" if args.model == "fcn" else "small"

    from earth2studio_compile.tools import zoo

    # After the imports: Earth2Studio installs its own loguru handler on import.
    logger.remove()
    show_logs("INFO")

    model = zoo.build(args.model, size=size).to(device)
    print(
        f"{type(model).__name__} ({args.model}, {size}) on {device}, "
        f"torch {torch.__version__}"
    )
    rows = _measure(model, device, args.steps, args.repeats, precisions)
    _print(rows, args.steps, device)
    print()
    print("In a workflow:  from earth2studio_compile.run import deterministic")
    print("                deterministic(time, nsteps, model, data, io, compile=True)")
    return 0


def _precisions(
    parser: argparse.ArgumentParser, text: str, device: torch.device
) -> list[str]:
    from earth2studio_compile.precision import PRECISIONS

    if text == "auto":
        return ["fp32", "tf32"] if device.type == "cuda" else []
    if text == "none":
        return []
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in chosen if t not in PRECISIONS]
    if bad:
        parser.error(
            f"--precision {','.join(bad)} is unknown; use a comma-separated list of "
            f"{', '.join(PRECISIONS)}, or none"
        )
    # fp32 first: the others are measured against its eager rollout.
    return ["fp32", *[t for t in dict.fromkeys(chosen) if t != "fp32"]]


def _measure(
    model: Any,
    device: torch.device,
    steps: int,
    repeats: int,
    precisions: list[str],
) -> list[Row]:
    """Alternate eager and compiled rollouts; the first eager one is the reference."""
    from loguru import logger

    from earth2studio_compile.metrics import rel_l2
    from earth2studio_compile.tools.bench.measure import eager_precision, time_rollout
    from earth2studio_compile.tools.bench.runs import initial_state

    x, coords = initial_state(model, device)
    chosen: list[str | None] = [*precisions] if precisions else [None]
    rows = [Row(compiled, p) for p in chosen for compiled in (False, True)]
    # Untimed: the first eager calls pay one-time costs (kernel selection, lazy
    # initialisation) that would otherwise count against the first eager rollout.
    time_rollout(model, x, coords, 2)
    reference: list[torch.Tensor] = []  # every step of the first eager rollout
    for repeat in range(repeats):
        if repeat == 1:
            # The sessions' INFO lines were shown once; later rollouts only time.
            logger.remove()
            show_logs("WARNING")
        for row in rows:
            kwargs: dict[str, Any] | None = None
            if row.compiled:
                # No speed probe: its per-call figure is timed at other moments than
                # these rollouts and could contradict the table on a loaded machine.
                # Every speed figure printed comes from the rollouts below.
                kwargs = {"probe": False, "precision": row.precision}
            with eager_precision(model, None if row.compiled else row.precision):
                rollout = time_rollout(model, x, coords, steps, kwargs)
            row.steady_ms.append(rollout.steady_ms)
            row.call_seconds.append(sum(rollout.step_seconds))
            if repeat:
                continue
            row.first_seconds = rollout.first_seconds
            row.report = rollout.report
            if not reference:
                reference = rollout.outputs
                continue
            out = rollout.outputs
            row.errors = (rel_l2(out[0], reference[0]), rel_l2(out[-1], reference[-1]))
            diff = max((a - b).abs().max().item() for a, b in zip(out, reference))
            row.max_abs = (diff, max(r.abs().max().item() for r in reference))
    return rows


def _print(rows: list[Row], steps: int, device: torch.device) -> None:
    import torch

    reference = rows[0]
    print()
    print(
        f"  Time per whole forecast step (core network and coordinate code): median "
        f"of steps 2..{steps} in each rollout;\n  shown as the median (min-max) over "
        f"{len(reference.steady_ms)} rollout(s)"
    )
    for row in rows:
        first = f"first step {row.first_seconds:7.2f} s"
        if row.compiled:
            first += " (compile)" if row.ran_compiled else " (eager)"
        print(f"  {row.name:<15} {_ms_text(row.steady_ms)}   {first}")
    for eager, compiled in zip(rows[::2], rows[1::2]):
        label = f"speedup {compiled.precision}" if compiled.precision else "speedup"
        eager_why = _eager_reasons(compiled.report)
        if not compiled.ran_compiled:
            why = "; ".join(eager_why) or "no region ran compiled"
            print(f"  {label:<15} none: nothing ran compiled ({why})")
            continue
        print(f"  {label:<15} {speedup_text(eager.steady_ms, compiled.steady_ms)}")
        for text in eager_why:
            print(f"  {'':<15} (ran eager: {text})")
    print(
        "  The speedup is the whole step's, from these rollouts: what a forecast "
        "waits for.\n  Only the core network is compiled; its coordinate code runs "
        "eagerly in both rows."
    )
    print()
    print("\n".join(whole_call_lines(rows, steps)))
    print()
    ref = "eager fp32 (TF32 off)" if reference.precision else "eager"
    print(f"  Error against {ref}, relative L2 after step 1 / step {steps}:")
    for row in rows[1:]:
        if row.errors is None or row.max_abs is None:
            continue
        after_first, after_last = row.errors
        diff, scale = row.max_abs
        print(
            f"  {row.name:<15} {after_first:.1e} / {after_last:.1e}   "
            f"(max |difference| {diff:.2e} where |output| reaches {scale:.2e})"
        )
    if device.type == "cuda" and torch.backends.cudnn.allow_tf32:
        print(_TF32_NOTE)
    print()
    for row in rows[1::2]:
        print(f"  {row.name} regions: {_regions_text(row.report) or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
