"""One measurement: a model, a mode, a fresh process.

Run as ``python -m earth2studio_compile.tools.bench.measure SPEC_JSON OUT_JSON``; the
CLI does that once per (model, mode) so compile caches and CUDA state of one run never
flatter another. Also importable: :func:`time_rollout` serves the demo.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from earth2studio_compile.metrics import rel_l2, synchronize, worst_rel_l2
from earth2studio_compile.tools.bench.attention import attention_choice
from earth2studio_compile.tools.bench.e2e import measure_e2e
from earth2studio_compile.tools.bench.runs import initial_state, timed_deterministic

EAGER = "eager"
AUTO = "auto"  # the flag's default: reduce-overhead on CUDA, Inductor default on CPU


@dataclass
class Rollout:
    """Timings and outputs of one rollout.

    Attributes
    ----------
    step_seconds : list[float]
        Wall time of each forecast step (step 1 includes compilation), synchronized
    outputs : list[torch.Tensor]
        Each step's output, copied to the CPU outside the timed region
    peak_bytes : int | None
        Peak GPU memory allocated during the rollout (CUDA only)
    report : dict | None
        The compile session's report, for compiled rollouts
    """

    step_seconds: list[float]
    outputs: list[torch.Tensor]
    peak_bytes: int | None = None
    report: dict | None = field(default=None)

    @property
    def first_seconds(self) -> float:
        return self.step_seconds[0]

    period: int = 1

    @property
    def steady_ms(self) -> float:
        """Steady-state ms per step: median over whole model-call periods.

        A model whose call yields ``period`` steps (DLWP: two 6-hour steps per
        call) alternates between expensive and free steps; a per-step median would
        pick one or the other. Windows of ``period`` steps, after the first period
        (which includes compilation), are averaged, then the median is taken.
        """
        steps = np.asarray(self.step_seconds[self.period :])
        whole = len(steps) // self.period * self.period
        windows = steps[:whole].reshape(-1, self.period).mean(axis=1)
        return float(np.median(windows) * 1e3)


def time_rollout(
    model: Any,
    x: torch.Tensor,
    coords: OrderedDict,
    nsteps: int,
    compile_kwargs: dict[str, Any] | None = None,
) -> Rollout:
    """Roll ``model`` out ``nsteps`` steps, timing each step.

    Parameters
    ----------
    model : Any
        Prognostic model, already on ``x``'s device
    x, coords : torch.Tensor, OrderedDict
        Initial state
    nsteps : int
        Forecast steps (the initial condition is not counted)
    compile_kwargs : dict | None, optional
        None for eager, else keyword arguments of :class:`CompileSession`

    Returns
    -------
    Rollout
        Per-step times, outputs and peak memory
    """
    from contextlib import nullcontext

    device = x.device
    session = _session(model, compile_kwargs)
    times: list[float] = []
    outputs: list[torch.Tensor] = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    calls, uncount = _count_forward_calls(model)
    try:
        with session if session is not None else nullcontext():
            iterator = model.create_iterator(x, coords)
            next(iterator)  # the initial condition: no model call
            for _ in range(nsteps):
                synchronize(device)
                start = time.perf_counter()
                y, _ = next(iterator)
                synchronize(device)
                times.append(time.perf_counter() - start)
                outputs.append(y.detach().to("cpu", copy=True))
            iterator.close()
    finally:
        uncount()
    period = max(1, round(nsteps / calls[0])) if calls[0] else 1
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    report = session.report.to_dict() if session else None
    return Rollout(times, outputs, peak, report, period=period)


def _count_forward_calls(model: Any) -> tuple[list[int], Callable[[], None]]:
    """Count calls of the model's ``_forward`` (Earth2Studio's one-call step).

    DLWP yields two 6-hour steps per call; counting calls gives the period over
    which per-step times are averaged. The instance attribute is removed after the
    rollout; models without ``_forward`` count as one step per call.
    """
    calls = [0]
    forward = getattr(model, "_forward", None)
    if callable(forward) and "_forward" not in model.__dict__:

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            return forward(*args, **kwargs)

        model.__dict__["_forward"] = counted
        return calls, lambda: model.__dict__.pop("_forward", None)
    return calls, lambda: None


def end_to_end(
    model: Any, device: torch.device, nsteps: int, compile_kwargs: dict | None
) -> float:
    """Wall seconds of ``earth2studio.run.deterministic`` writing a Zarr store on disk.

    Parameters
    ----------
    model : Any
        Prognostic model, on ``device``
    device : torch.device
        Where the workflow runs
    nsteps : int
        Forecast steps
    compile_kwargs : dict | None
        None for eager, else keyword arguments of :class:`CompileSession`; the time
        includes the compile

    Returns
    -------
    float
        Seconds until the store is written
    """
    from earth2studio.io import ZarrBackend

    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "out.zarr")
        io = ZarrBackend(store, backend_kwargs={"overwrite": True})
        session = _session(model, compile_kwargs)
        return timed_deterministic(model, io, nsteps, device, session)


@contextlib.contextmanager
def eager_precision(model: Any, precision: str | None) -> Iterator[None]:
    """Run ``model``'s cores eagerly in ``precision``, scoped as a session would.

    The eager rows of ``--precision`` need what a session does to its regions
    (TF32 flags and autocast inside the core's call only, the table's fp32 modules,
    outputs in the input's dtype) without compiling; applied to the whole step
    instead, bf16 autocast reaches DLWP's sparse regridding, which has no bf16 kernel.
    """
    from earth2studio_compile import precision as prec
    from earth2studio_compile.opaque import find_opaque
    from earth2studio_compile.planning import plan

    if precision is None:
        yield
        return
    p = plan(model)
    saved: list[tuple[torch.nn.Module, bool, Any]] = []
    wrappers: list[Any] = []
    for _, module in p.targets:
        if precision == "bf16":
            for _, sub in find_opaque(module, p.spec.fp32_modules):
                wrappers.append(prec.KeepFp32(sub))
                wrappers[-1].install()
        forward = module.forward

        def scoped(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            device = next(
                (a.device for a in args if isinstance(a, torch.Tensor)),
                torch.device("cpu"),
            )
            return prec.call(precision, device, _forward, args, kwargs)

        saved.append(
            (module, "forward" in module.__dict__, module.__dict__.get("forward"))
        )
        module.__dict__["forward"] = scoped
    try:
        yield
    finally:
        for module, had, value in reversed(saved):
            if had:
                module.__dict__["forward"] = value
            else:
                module.__dict__.pop("forward", None)
        for wrapper in reversed(wrappers):
            wrapper.restore()


def _session(model: Any, compile_kwargs: dict[str, Any] | None) -> Any:
    """A :class:`CompileSession` with ``compile_kwargs``; None (eager) for None."""
    from earth2studio_compile import CompileSession

    return None if compile_kwargs is None else CompileSession(model, **compile_kwargs)


def compile_kwargs_for(mode: str) -> dict[str, Any] | None:
    """Session arguments for a benchmark mode name (None: eager)."""
    if mode == EAGER:
        return None
    return {} if mode == AUTO else {"mode": mode}


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement described by ``spec`` (see the CLI) and return figures."""
    from loguru import logger

    from earth2studio_compile.tools import zoo

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    device = torch.device(spec["device"])
    if spec.get("fp32"):
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    model: Any = zoo.build(spec["model"], size=spec["size"]).to(device)
    if spec.get("io"):
        precisions = spec.get("precisions") or []
        e2e = measure_e2e(
            model,
            device,
            spec["steps"],
            spec["io"],
            writers=spec.get("writers") or ["auto"],
            precisions=precisions,
            # Under --precision the eager rows are the fp32 reference, TF32 off.
            eager_context=(lambda: eager_precision(model, "fp32"))
            if precisions
            else None,
        )
        return {**spec, "e2e": e2e}
    x, coords = initial_state(model, device, seed=0)
    kwargs = compile_kwargs_for(spec["mode"])
    chosen = spec.get("precision")
    if kwargs is not None and chosen:
        kwargs["precision"] = chosen
    attention = spec.get("attention") if kwargs is not None else None
    with (
        eager_precision(model, chosen if kwargs is None else None),
        attention_choice(model, attention or None),
    ):
        rollout = time_rollout(model, x, coords, spec["steps"], kwargs)
    result: dict[str, Any] = {
        **spec,
        "model_class": type(model).__name__,
        "first_step_s": rollout.first_seconds,
        "steady_ms": rollout.steady_ms,
        "steps_per_call": rollout.period,
        "step_s": rollout.step_seconds,
        "peak_gpu_bytes": rollout.peak_bytes,
        "report": rollout.report,
    }
    ref = Path(spec["reference"])
    # Step 1, step 10 and step N: errors grow along a chaotic random-weight rollout,
    # so step 1 is the figure to compare (docs/performance.md).
    kept = {
        "first": rollout.outputs[0],
        "tenth": rollout.outputs[min(9, len(rollout.outputs) - 1)],
        "last": rollout.outputs[-1],
    }
    # The CLI says which run is the reference; a bare eager spec is one.
    if spec.get("save_reference", spec["mode"] == EAGER):
        torch.save(kept, ref)
    elif ref.exists():
        saved = torch.load(ref)
        result["rel_l2_first"] = rel_l2(kept["first"], saved["first"])
        # The whole state's figure is the largest fields': the worst variable's
        # beside it shows an error in a small one.
        dims = model.output_coords(coords)
        if "variable" in dims and len(dims) == kept["first"].ndim:
            axis = list(dims).index("variable")
            at, worst = worst_rel_l2(kept["first"], saved["first"], axis)
            result["rel_l2_first_worst"] = [str(dims["variable"][at]), worst]
        result["rel_l2_10"] = rel_l2(kept["tenth"], saved["tenth"])
        result["rel_l2_last"] = rel_l2(kept["last"], saved["last"])
    if spec.get("e2e_steps"):
        result["e2e_s"] = end_to_end(model, device, spec["e2e_steps"], kwargs)
    return result


def main() -> None:
    spec = json.loads(sys.argv[1])
    out = Path(sys.argv[2])
    out.write_text(json.dumps(measure(spec)))


if __name__ == "__main__":
    main()
