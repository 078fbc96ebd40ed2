"""Where an ensemble run's time goes: a per-step breakdown of one batch, and floors.

A second, instrumented run of upstream's ``ensemble`` (:func:`breakdown`), one batch
of the row's size, synchronized around each phase with the end-to-end profile's
machinery (:mod:`earth2studio_compile.tools.bench.e2e`) plus timers on the core
networks (:func:`core_timer`) and the perturbation; beside it, measured in the same
process, the floors (:func:`floors`): the compiled model step alone, and the store's
bytes written with ``numpy.save`` from parallel writers as the workflow mode's
storage floor writes them (:func:`..floors.storage_floor`).
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from earth2studio_compile.metrics import synchronize
from earth2studio_compile.tools.bench.e2e import _instrumented, _TimedIO
from earth2studio_compile.tools.bench.ensemble.upstream import (
    NOISE,
    make_ensemble_io,
    run_ensemble,
    store_bytes,
)
from earth2studio_compile.tools.bench.floors import FLOOR_WRITERS, storage_floor

#: Per-step phases of the breakdown, ms per batched forecast step: the core
#: network's calls; the rest of the model's step (its coordinate code: normalizing,
#: zenith angles, regridding); the workflow's ``map_coords``/``split_coords``; the
#: perturbation (once per batch, spread over its steps); device-to-host copies; the
#: backend's ``write``; the progress bar; the rest of the loop.
STEP = (
    "core",
    "model_rest",
    "map_coords",
    "split_coords",
    "perturb",
    "d2h",
    "write",
    "progress",
    "loop",
)
#: Steps of the instrumented breakdown run (one batch).
BREAKDOWN_STEPS = 6


def timed(
    fn: Callable[..., Any], device: torch.device, totals: dict[str, float], key: str
) -> Callable[..., Any]:
    """``fn``, adding its synchronized seconds to ``totals[key]`` at every call."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        synchronize(device)
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        synchronize(device)
        totals[key] += time.perf_counter() - start
        return out

    return wrapper


@contextlib.contextmanager
def core_timer(
    model: Any, device: torch.device, totals: dict[str, float]
) -> Iterator[None]:
    """Time the calls of the model's core networks (the model table's targets).

    Inside a session a compiled core is called through the slot the region occupies
    in the module's ``__dict__``; an eager core through ``forward``. The timer wraps
    whichever is there and puts it back before the session restores the model.
    """
    from earth2studio_compile._torch import MODULE_SLOT
    from earth2studio_compile.planning import plan

    touched: list[tuple[torch.nn.Module, str, Any]] = []
    for _, module in plan(model).targets:
        slot = MODULE_SLOT if MODULE_SLOT in module.__dict__ else "forward"
        had = module.__dict__.get(slot)
        fn = had if had is not None else module.forward
        module.__dict__[slot] = timed(fn, device, totals, "core")
        touched.append((module, slot, had))
    try:
        yield
    finally:
        for module, slot, had in reversed(touched):
            if had is None:
                module.__dict__.pop(slot, None)
            else:
                module.__dict__[slot] = had


def breakdown(
    model: Any,
    io_name: str,
    batch_size: int,
    nsteps: int,
    device: torch.device,
    tmp: Path,
    selection: OrderedDict,
) -> dict[str, float]:
    """Where one batch's instrumented ``ensemble`` run spends its time.

    One batch of ``batch_size`` members, :data:`BREAKDOWN_STEPS` steps at most, a
    device synchronization around each phase so its time is its own.

    Returns
    -------
    dict[str, float]
        ``{phase}_ms`` per batched forecast step for each of :data:`STEP`;
        ``setup_s`` (data, IO arrays, the first ``map_coords`` and the
        perturbation), ``tail_s`` (closing the IO), ``wall_s``, ``steps``. They add
        up: setup + steps x (all phases but perturb) + tail = wall
    """
    from earth2studio.perturbation import Gaussian

    steps = min(nsteps, BREAKDOWN_STEPS)
    names = ("model", "map_coords", "split_coords", "d2h", "write", "progress")
    totals = dict.fromkeys(("data", "add_array", *names, *STEP), 0.0)
    marks: dict[str, float] = {}
    io = _TimedIO(
        make_ensemble_io(io_name, tmp, model, steps, batch_size), device, totals
    )
    noise = Gaussian(noise_amplitude=NOISE, seed=0)
    perturb = timed(noise, device, totals, "perturb")
    with _instrumented(model, device, totals, marks), core_timer(model, device, totals):
        wall = run_ensemble(
            model, io, batch_size, steps, batch_size, device, selection, marks, perturb
        )
    loop_s = marks["returned"] - marks["loop"]
    totals["model_rest"] = totals["model"] - totals["core"]
    inside = ("model", "map_coords", "split_coords", "d2h", "write", "progress")
    totals["loop"] = loop_s - sum(totals[p] for p in inside)
    out = {f"{p}_ms": 1e3 * totals[p] / steps for p in STEP}
    out["setup_s"] = marks["loop"] - marks["start"]
    out["tail_s"] = marks["end"] - marks["returned"]
    out["wall_s"] = wall
    out["steps"] = steps
    return out


def floors(
    model: Any,
    nensemble: int,
    nsteps: int,
    batch_size: int,
    device: torch.device,
    tmp: Path,
    outputs: str,
    writers: int = FLOOR_WRITERS,
) -> dict[str, Any]:
    """The floors of a row, per batched step and for the whole run.

    Called inside the row's session, after its run, so the model step timed is the
    compiled one the run used (nothing compiles again).

    Parameters
    ----------
    model : Any
        Prognostic model, on ``device`` (compiled: inside its session)
    nensemble, nsteps, batch_size : int
        Members, forecast steps, members per batch
    device : torch.device
        Where the model runs
    tmp : Path
        Where the storage floor's files go (removed after)
    outputs : str
        ``few`` or ``all``: the variables the row writes
    writers : int, optional
        Writer threads of the storage floor, by default :data:`FLOOR_WRITERS`

    Returns
    -------
    dict[str, Any]
        ``compute_ms`` (the median model step of ``batch_size`` members),
        ``storage_ms`` (the storage floor over the model steps), ``floor_ms``
        (their sum), ``model_steps`` (steps x batches), ``compute_floor_s``,
        ``floor_s`` and the storage floor's figures (``io_floor_s``, ...)
    """
    import numpy as np

    from earth2studio_compile.tools.bench.ensemble.upstream import output_coords
    from earth2studio_compile.tools.bench.measure import time_rollout
    from earth2studio_compile.tools.bench.runs import initial_state

    x, coords = initial_state(model, device)
    x = x.unsqueeze(0).repeat(batch_size, *([1] * x.dim()))
    coords = OrderedDict([("ensemble", np.arange(batch_size)), *coords.items()])
    # Enough steps for medians over whole model calls (DLWP: two steps per call).
    step = time_rollout(model, x, coords, max(nsteps, 8))
    batches = -(-nensemble // batch_size)
    total = store_bytes(model, nensemble, nsteps, outputs)
    chosen = output_coords(model, outputs).get("variable")
    variables = len(model.input_coords()["variable"] if chosen is None else chosen)
    out: dict[str, Any] = {"compute_ms": step.steady_ms, "store_bytes": total}
    out.update(
        storage_floor(
            tmp,
            total,
            (nsteps + 1) * batches,
            variables,
            device,
            writers,
            members=batch_size,
        )
    )
    out["model_steps"] = nsteps * batches
    out["storage_ms"] = 1e3 * out["io_floor_s"] / out["model_steps"]
    out["floor_ms"] = out["compute_ms"] + out["storage_ms"]
    out["compute_floor_s"] = out["model_steps"] * out["compute_ms"] / 1e3
    out["floor_s"] = out["compute_floor_s"] + out["io_floor_s"]
    return out
