"""What the benchmark's measurements share: a rollout's initial state, a timed workflow.

:mod:`.measure` (rollouts, the end-to-end figure) and :mod:`.e2e` (the end-to-end
profile) both import this module and not each other, and so do the demo and
:mod:`.kernels`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch

from earth2studio_compile.metrics import synchronize
from earth2studio_compile.session import example_input

TIME = np.datetime64("2024-01-01")


def initial_state(
    model: Any, device: torch.device, seed: int = 0
) -> tuple[torch.Tensor, OrderedDict]:
    """A seeded random initial state on ``model``'s input coordinates (one time).

    The library's :func:`~earth2studio_compile.session.example_input` with two
    differences: it leads with a ``time`` dimension even where ``input_coords()``
    lists none (Earth2Studio's workflows always pass one), and it holds normal random
    values instead of zeros.

    Parameters
    ----------
    model : Any
        Prognostic model
    device : torch.device
        Where the state lives
    seed : int, optional
        Seed, by default 0

    Returns
    -------
    tuple[torch.Tensor, OrderedDict]
        Tensor and coordinate system, ready for ``model.create_iterator``
    """
    x, coords = example_input(model, time=TIME, device="cpu")
    if "time" not in coords:
        coords = OrderedDict([("time", np.array([TIME])), *coords.items()])
        x = x.unsqueeze(0)
    # Drawn on the CPU, so every device starts from the same values.
    x.normal_(generator=torch.Generator().manual_seed(seed))
    return x.to(device), coords


def timed_deterministic(
    model: Any,
    io: Any,
    nsteps: int,
    device: torch.device,
    session: AbstractContextManager[Any] | None = None,
    marks: dict[str, float] | None = None,
) -> float:
    """Wall seconds of upstream's ``deterministic`` on seeded random data.

    The clock stops once everything is written: after closing ``io`` where it has a
    ``close`` (``AsyncZarrBackend``, ``OverlappedIO`` and ``NetCDF4Backend`` write
    until then) and after the device's queued work.

    Parameters
    ----------
    model : Any
        Prognostic model, on ``device``
    io : Any
        Earth2Studio IO backend
    nsteps : int
        Forecast steps
    device : torch.device
        Where the workflow runs
    session : AbstractContextManager | None, optional
        A :class:`~earth2studio_compile.CompileSession` to open around the workflow
        (its set-up and restore are timed); None runs as the caller left the model,
        by default None
    marks : dict[str, float] | None, optional
        Filled with ``perf_counter`` readings: ``start``, ``returned`` (the workflow
        returned) and ``end`` (all written), by default None

    Returns
    -------
    float
        Seconds from the call of the workflow until all is written
    """
    import earth2studio.run as upstream

    from earth2studio_compile.tools import zoo

    np.random.seed(0)  # the Random data source draws from numpy's global generator
    torch.manual_seed(0)
    data = zoo.random_source(model)
    marks = {} if marks is None else marks
    start = marks["start"] = time.perf_counter()
    with session if session is not None else nullcontext():
        upstream.deterministic(
            [str(TIME)], nsteps, model, data, io, device=device, verbose=False
        )
    return finish(io, device, marks, start)


def finish(
    io: Any, device: torch.device, marks: dict[str, float], start: float
) -> float:
    """Mark the workflow's return, close ``io`` (its pending writes count), sync;
    the seconds since ``start``."""
    marks["returned"] = time.perf_counter()
    if callable(getattr(io, "close", None)):
        io.close()
    synchronize(device)
    marks["end"] = time.perf_counter()
    return marks["end"] - start
