"""End to end: where a rollout's wall time goes, and what overlapped writing saves.

Two measurements of upstream's ``earth2studio.run.deterministic`` per IO backend, both
after a warm-up run (CUDA context, cuDNN/cuFFT plans, and for compiled runs the
compile itself, done once by :meth:`CompileSession.warmup` the way a service does it):

``breakdown``
    One instrumented run: each phase is bracketed by a device synchronization so its
    time is its own. Phases per step: model compute (the prognostic iterator's
    ``next``), coordinate mapping (``map_coords`` + ``split_coords``), device-to-host
    copy, and the backend's ``write`` on host tensors; "other" is the rest of the
    workflow's wall time (data fetch, array set-up, progress bar, checkpoint).
``wall``
    Plain runs, no synchronization added: eager, compiled, and compiled with
    :class:`~earth2studio_compile.overlap.OverlappedIO`.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from earth2studio_compile.metrics import synchronize
from earth2studio_compile.tools.bench.runs import TIME, timed_deterministic
from earth2studio_compile.tools.bench.text import format_table

IO_BACKENDS = ("zarr", "netcdf4", "async-zarr")
PHASES = ("model", "coords", "d2h", "write", "other")


def make_io(name: str, directory: Path, model: Any, nsteps: int) -> Any:
    """A fresh Earth2Studio IO backend by name.

    Parameters
    ----------
    name : str
        ``zarr`` (in-memory store), ``netcdf4`` (file) or ``async-zarr`` (file,
        non-blocking writes)
    directory : Path
        Where file-backed stores go
    model : Any
        The prognostic (its lead time step sizes the async store)
    nsteps : int
        Forecast steps

    Returns
    -------
    IOBackend
        The backend
    """
    from earth2studio import io as e2s_io

    stamp = f"{name}-{time.monotonic_ns()}"
    if name == "zarr":
        return e2s_io.ZarrBackend()
    if name == "netcdf4":
        return e2s_io.NetCDF4Backend(
            str(directory / f"{stamp}.nc"), backend_kwargs={"mode": "w"}
        )
    if name == "async-zarr":
        step = model.output_coords(model.input_coords())["lead_time"][-1]
        return e2s_io.AsyncZarrBackend(
            str(directory / f"{stamp}.zarr"),
            parallel_coords=OrderedDict(
                {
                    "time": np.array([TIME]),
                    "lead_time": np.asarray([step * i for i in range(nsteps + 1)]),
                }
            ),
            blocking=False,
        )
    raise ValueError(f"Unknown IO backend {name!r}; use one of {IO_BACKENDS}.")


class _TimedIO:
    """Splits a backend's ``write`` into the device-to-host copy and the rest."""

    def __init__(self, io: Any, device: torch.device, totals: dict[str, float]) -> None:
        self.io, self.device, self.totals = io, device, totals

    def add_array(self, *args: Any, **kwargs: Any) -> None:
        self.io.add_array(*args, **kwargs)

    def write(self, x: Any, coords: Any, array_name: Any) -> None:
        synchronize(self.device)
        start = time.perf_counter()
        host = x.cpu() if isinstance(x, torch.Tensor) else [t.cpu() for t in x]
        copied = time.perf_counter()
        self.io.write(host, coords, array_name)
        done = time.perf_counter()
        self.totals["d2h"] += copied - start
        self.totals["write"] += done - copied

    def close(self) -> None:
        # AsyncZarrBackend writes in the background until closed: that is write time.
        close = getattr(self.io, "close", None)
        if callable(close):
            start = time.perf_counter()
            close()
            self.totals["write"] += time.perf_counter() - start


@contextlib.contextmanager
def _instrumented(
    model: Any, device: torch.device, totals: dict[str, float]
) -> Iterator[None]:
    """Time the model's iterator and upstream's coordinate helpers, synchronized."""
    import earth2studio.run as upstream

    def timed(fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            synchronize(device)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            synchronize(device)
            totals[phase] += time.perf_counter() - start
            return out

        return wrapper

    create = model.create_iterator

    def create_iterator(x: torch.Tensor, coords: Any) -> Iterator[Any]:
        iterator = create(x, coords)
        step = timed(lambda: next(iterator), "model")
        while True:
            try:
                yield step()
            except StopIteration:
                return

    saved = {name: getattr(upstream, name) for name in ("map_coords", "split_coords")}
    try:
        for name, fn in saved.items():
            setattr(upstream, name, timed(fn, "coords"))
        model.__dict__["create_iterator"] = create_iterator
        yield
    finally:
        model.__dict__.pop("create_iterator", None)
        for name, fn in saved.items():
            setattr(upstream, name, fn)


def breakdown(
    model: Any, io_name: str, nsteps: int, device: torch.device, tmp: Path
) -> dict[str, float]:
    """Per-step milliseconds of each phase of one instrumented ``deterministic`` run."""
    totals = dict.fromkeys(PHASES, 0.0)
    io = _TimedIO(make_io(io_name, tmp, model, nsteps), device, totals)
    with _instrumented(model, device, totals):
        wall = timed_deterministic(model, io, nsteps, device)
    totals["other"] = wall - sum(totals[p] for p in PHASES if p != "other")
    out = {f"{p}_ms": 1e3 * totals[p] / nsteps for p in PHASES}
    out["wall_s"] = wall
    return out


def wall(
    model: Any,
    io_name: str,
    nsteps: int,
    device: torch.device,
    tmp: Path,
    overlap: bool,
) -> float:
    """Seconds of one plain ``deterministic`` run, the IO closed (all data written)."""
    from earth2studio_compile.overlap import OverlappedIO

    io = make_io(io_name, tmp, model, nsteps)
    io = OverlappedIO(io) if overlap else io
    return timed_deterministic(model, io, nsteps, device)


def measure_e2e(
    model: Any,
    device: torch.device,
    nsteps: int,
    backends: list[str],
    repeats: int = 2,
) -> dict[str, Any]:
    """Breakdowns and wall times, eager and compiled, for each backend.

    Returns
    -------
    dict[str, Any]
        ``{"compile_s": ..., "backends": {name: {...}}}``; wall times are the best of
        ``repeats`` runs
    """
    from earth2studio_compile import CompileSession

    results: dict[str, Any] = {"backends": {}}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)

        def best(name: str, overlap: bool) -> float:
            return min(
                wall(model, name, nsteps, device, tmp, overlap) for _ in range(repeats)
            )

        # Warm-up: CUDA context, cuDNN and cuFFT plans.
        wall(model, "zarr", 2, device, tmp, overlap=False)
        for name in backends:
            r: dict[str, Any] = {}
            r["eager"] = breakdown(model, name, nsteps, device, tmp)
            r["eager_wall_s"] = best(name, overlap=False)
            r["eager_overlap_wall_s"] = best(name, overlap=True)
            results["backends"][name] = r
        with CompileSession(model) as session:
            start = time.perf_counter()
            session.warmup()
            synchronize(device)
            results["compile_s"] = time.perf_counter() - start
            for name in backends:
                r = results["backends"][name]
                r["compiled"] = breakdown(model, name, nsteps, device, tmp)
                r["compiled_wall_s"] = best(name, overlap=False)
                r["compiled_overlap_wall_s"] = best(name, overlap=True)
                r["speedup"] = r["eager_wall_s"] / r["compiled_overlap_wall_s"]
        results["report"] = session.report.to_dict()
    return results


def e2e_table(model: str, e2e: dict[str, Any]) -> str:
    """Plain-text table of one model's end-to-end results."""
    header = ["model", "io", "run", *(f"{p} ms" for p in PHASES)]
    header += ["wall s", "overlap wall s"]
    rows = []
    for name, r in e2e["backends"].items():
        for run in ("eager", "compiled"):
            b = r[run]
            rows.append(
                [
                    model,
                    name,
                    run,
                    *(f"{b[f'{p}_ms']:.1f}" for p in PHASES),
                    f"{r[f'{run}_wall_s']:.2f}",
                    f"{r[f'{run}_overlap_wall_s']:.2f}",
                ]
            )
    return format_table(header, rows)
