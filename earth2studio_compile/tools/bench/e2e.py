"""End to end: where a rollout's wall time goes, and what overlapped writing saves.

Measurements of upstream's ``earth2studio.run.deterministic`` per IO backend, all
after a warm-up run (CUDA context, cuDNN/cuFFT plans, and for compiled runs the
compile itself, done once by :meth:`CompileSession.warmup` the way a service does it):

``breakdown``
    One instrumented run: each phase is bracketed by a device synchronization so its
    time is its own. Set-up, once, in seconds: the data source (``fetch_data``),
    ``add_array`` and the rest before the first step (moving the model, coordinates).
    Per forecast step, in ms: model compute (the prognostic iterator's ``next``),
    ``map_coords``, ``split_coords``, the device-to-host copy, the backend's ``write``
    on host tensors, the progress bar's ``update``, and "loop", the rest of the loop
    (the checkpoint call, the workflow's own Python). Then the tail: closing the IO.
``walls``
    Plain runs, no synchronization added, best of ``repeats``: eager and compiled,
    each synchronous, with :class:`~earth2studio_compile.io.OverlappedIO` and
    one writer, and with parallel writers (``workers``) where the backend takes them.
    Each row has its speedup over the synchronous eager run and its ratio to the
    floor, the set-up plus N x the compiled model step (of the same precision): what
    a run would take if writing cost nothing.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from earth2studio_compile.metrics import synchronize
from earth2studio_compile.tools.bench.runs import TIME, timed_deterministic
from earth2studio_compile.tools.bench.text import format_table

IO_BACKENDS = ("zarr", "zarr-disk", "netcdf4", "async-zarr")
SETUP = ("data", "add_array")
STEP = ("model", "map_coords", "split_coords", "d2h", "write", "progress", "loop")
# Writers of a run: None writes synchronously (upstream), 1 is OverlappedIO with one
# writer, "auto" its default for the backend, an int > 1 that many.
Writers = int | str | None


def make_io(name: str, directory: Path, model: Any, nsteps: int) -> Any:
    """A fresh Earth2Studio IO backend by name.

    Parameters
    ----------
    name : str
        ``zarr`` (in-memory store), ``zarr-disk`` (a store on local disk),
        ``netcdf4`` (file) or ``async-zarr`` (file, non-blocking writes)
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
    if name == "zarr-disk":
        return e2s_io.ZarrBackend(
            str(directory / f"{stamp}.zarr"), backend_kwargs={"overwrite": True}
        )
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
    """Times a backend's ``add_array``, and splits its ``write`` into the
    device-to-host copy and the rest."""

    def __init__(self, io: Any, device: torch.device, totals: dict[str, float]) -> None:
        self.io, self.device, self.totals = io, device, totals

    def add_array(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        self.io.add_array(*args, **kwargs)
        self.totals["add_array"] += time.perf_counter() - start

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
        # AsyncZarrBackend and NetCDF4Backend write until closed: part of the tail.
        close = getattr(self.io, "close", None)
        if callable(close):
            close()


@contextlib.contextmanager
def _instrumented(
    model: Any, device: torch.device, totals: dict[str, float], marks: dict[str, float]
) -> Iterator[None]:
    """Time the model's iterator and upstream's helpers, synchronized.

    ``marks["loop"]`` is when the workflow creates the iterator: the set-up ends there.
    A ``map_coords`` call before it (the initial state's) is set-up, not a step.
    """
    import earth2studio.run as upstream

    def timed(fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            synchronize(device)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            synchronize(device)
            if phase in SETUP or "loop" in marks:
                totals[phase] += time.perf_counter() - start
            return out

        return wrapper

    create = model.create_iterator

    def create_iterator(x: torch.Tensor, coords: Any) -> Iterator[Any]:
        marks["loop"] = time.perf_counter()
        iterator = create(x, coords)
        step = timed(lambda: next(iterator), "model")
        while True:
            try:
                yield step()
            except StopIteration:
                return

    class Bar(upstream.tqdm):  # type: ignore[name-defined,misc]
        def update(self, n: float | None = 1) -> bool | None:
            start = time.perf_counter()
            out = super().update(n)
            totals["progress"] += time.perf_counter() - start
            return out

    names = ("map_coords", "split_coords", "fetch_data", "tqdm")
    saved = {name: getattr(upstream, name) for name in names}
    try:
        upstream.map_coords = timed(saved["map_coords"], "map_coords")
        upstream.split_coords = timed(saved["split_coords"], "split_coords")
        upstream.fetch_data = timed(saved["fetch_data"], "data")
        upstream.tqdm = Bar
        model.__dict__["create_iterator"] = create_iterator
        yield
    finally:
        model.__dict__.pop("create_iterator", None)
        for name, fn in saved.items():
            setattr(upstream, name, fn)


def breakdown(
    model: Any, io_name: str, nsteps: int, device: torch.device, tmp: Path
) -> dict[str, float]:
    """Where one instrumented ``deterministic`` run spends its time.

    Returns
    -------
    dict[str, float]
        ``setup_s`` and its parts ``data_s``, ``add_array_s``; ``{phase}_ms`` per
        forecast step for each of :data:`STEP`; ``tail_s`` (closing the IO);
        ``wall_s``. They add up: setup + N x steps + tail = wall
    """
    totals = dict.fromkeys(SETUP + STEP, 0.0)
    marks: dict[str, float] = {}
    io = _TimedIO(make_io(io_name, tmp, model, nsteps), device, totals)
    with _instrumented(model, device, totals, marks):
        wall = timed_deterministic(model, io, nsteps, device, marks=marks)
    loop_s = marks["returned"] - marks["loop"]
    totals["loop"] = loop_s - sum(totals[p] for p in STEP if p != "loop")
    out = {f"{p}_ms": 1e3 * totals[p] / nsteps for p in STEP}
    out.update({f"{p}_s": totals[p] for p in SETUP})
    out["setup_s"] = marks["loop"] - marks["start"]
    out["tail_s"] = marks["end"] - marks["returned"]
    out["wall_s"] = wall
    return out


def wall(
    model: Any,
    io_name: str,
    nsteps: int,
    device: torch.device,
    tmp: Path,
    writers: Writers,
) -> dict[str, Any]:
    """One plain ``deterministic`` run, the IO closed (all data written).

    Returns
    -------
    dict[str, Any]
        ``wall_s``; with an :class:`OverlappedIO`, its ``workers`` and ``blocked_s``
        (seconds the workflow waited for storage)
    """
    from earth2studio_compile.io import OverlappedIO

    io = make_io(io_name, tmp, model, nsteps)
    if writers is None:
        return {"wall_s": timed_deterministic(model, io, nsteps, device)}
    overlapped = OverlappedIO(io, workers=None if writers == "auto" else int(writers))
    seconds = timed_deterministic(model, overlapped, nsteps, device)
    return {
        "wall_s": seconds,
        "workers": overlapped.workers,
        "blocked_s": overlapped.blocked_s,
    }


def parallel_capable(io_name: str, model: Any, tmp: Path) -> bool:
    """Whether :class:`OverlappedIO` can write this backend with several workers."""
    from earth2studio_compile.io import parallel_writer

    io = make_io(io_name, tmp, model, 1)
    try:
        return parallel_writer(io)[0] is not None
    finally:
        close = getattr(io, "close", None)
        if callable(close):
            close()


def _label(run: str, writers: Writers, workers: int | None) -> str:
    if writers is None:
        return run
    if writers == 1:
        return f"{run}+overlap"
    return f"{run}+parallel({workers})"


def measure_e2e(
    model: Any,
    device: torch.device,
    nsteps: int,
    backends: list[str],
    repeats: int = 2,
    writers: Sequence[Writers] = ("auto",),
    precisions: Sequence[str] = (),
    eager_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
) -> dict[str, Any]:
    """Breakdowns and wall times, eager and compiled, for each backend.

    Parameters
    ----------
    model : Any
        Prognostic model, on ``device``
    device : torch.device
        Where the workflow runs
    nsteps : int
        Forecast steps
    backends : list[str]
        Names from :data:`IO_BACKENDS`
    repeats : int, optional
        Runs per wall time (the best is kept), by default 2
    writers : Sequence[Writers], optional
        Parallel rows: ``"auto"`` or worker counts, by default ("auto",); each is
        measured with the compiled model, on backends that take parallel writes
    precisions : Sequence[str], optional
        More compiled rows, one session per precision (``tf32``, ``bf16``, ...)
    eager_context : Callable | None, optional
        Context for the eager rows (the fp32 reference under ``--precision``)

    Returns
    -------
    dict[str, Any]
        ``{"nsteps", "compile_s": {run: s}, "backends": {name: {"breakdown": {run:
        ...}, "rows": [...]}}}``; each row has ``run``, ``wall_s``, ``speedup``,
        ``floor_s``, ``floor_ratio`` and, with an OverlappedIO, ``workers``,
        ``blocked_s``
    """
    from earth2studio_compile import CompileSession

    results: dict[str, Any] = {"nsteps": nsteps, "compile_s": {}, "backends": {}}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)

        def best(name: str, writers: Writers) -> dict[str, Any]:
            runs = [
                wall(model, name, nsteps, device, tmp, writers) for _ in range(repeats)
            ]
            return min(runs, key=lambda r: r["wall_s"])

        def measure(name: str, run: str, parallel: bool) -> None:
            r = results["backends"][name]
            r["breakdown"][run] = breakdown(model, name, nsteps, device, tmp)
            chosen: list[Writers] = [None, 1]
            if parallel and run != "eager":
                chosen += [w for w in writers if w != 1]
            for w in chosen:
                row = best(name, w)
                row["run"] = _label(run, w, row.get("workers"))
                row["model_run"] = run
                r["rows"].append(row)

        capable = {name: parallel_capable(name, model, tmp) for name in backends}
        # Warm-up: CUDA context, cuDNN and cuFFT plans.
        wall(model, "zarr", 2, device, tmp, None)
        with eager_context() if eager_context else contextlib.nullcontext():
            for name in backends:
                results["backends"][name] = {"breakdown": {}, "rows": []}
                measure(name, "eager", capable[name])
        reports = {}
        for chosen in [None, *precisions]:
            run = "compiled" if chosen is None else f"{chosen} compiled"
            with CompileSession(model, precision=chosen) as session:
                start = time.perf_counter()
                session.warmup()
                synchronize(device)
                results["compile_s"][run] = time.perf_counter() - start
                for name in backends:
                    measure(name, run, capable[name])
            reports[run] = session.report.to_dict()
        results["report"] = reports["compiled"]
        results["reports"] = reports
    for r in results["backends"].values():
        _derive_rows(r, nsteps)
    return results


def _derive_rows(r: dict[str, Any], nsteps: int) -> None:
    """Speedup over synchronous eager, floor and ratio to it, per row."""
    eager = next(row["wall_s"] for row in r["rows"] if row["run"] == "eager")
    for row in r["rows"]:
        # The floor of a row: its precision's compiled model; eager rows take the
        # default compiled one (what compiling could reach).
        run = row["model_run"] if row["model_run"] != "eager" else "compiled"
        b = r["breakdown"][run]
        row["floor_s"] = b["setup_s"] + nsteps * b["model_ms"] / 1e3
        row["floor_ratio"] = row["wall_s"] / row["floor_s"]
        row["speedup"] = eager / row["wall_s"]


def e2e_table(model: str, e2e: dict[str, Any]) -> str:
    """Plain-text tables of one model's end-to-end results: the breakdown per run
    (set-up in s, steps in ms per step), then the wall times with speedup and floor."""
    header = ["model", "io", "run", "setup s", "data s", "add_array s"]
    header += [f"{p} ms" for p in STEP] + ["tail s", "wall s"]
    rows = []
    for name, r in e2e["backends"].items():
        for run, b in r["breakdown"].items():
            rows.append(
                [model, name, run]
                + [f"{b[f'{p}_s']:.2f}" for p in ("setup", *SETUP)]
                + [f"{b[f'{p}_ms']:.1f}" for p in STEP]
                + [f"{b['tail_s']:.2f}", f"{b['wall_s']:.2f}"]
            )
    text = format_table(header, rows)
    header = ["model", "io", "run", "wall s", "speedup", "floor s", "wall/floor"]
    header += ["blocked s"]
    rows = []
    for name, r in e2e["backends"].items():
        for row in r["rows"]:
            blocked = row.get("blocked_s")
            rows.append(
                [
                    model,
                    name,
                    row["run"],
                    f"{row['wall_s']:.2f}",
                    f"{row['speedup']:.2f}",
                    f"{row['floor_s']:.2f}",
                    f"{row['floor_ratio']:.2f}",
                    "-" if blocked is None else f"{blocked:.2f}",
                ]
            )
    steps = e2e.get("nsteps")
    note = (
        f"\n{steps} steps; floor = set-up + {steps} x the compiled model step "
        "(breakdown of that run); blocked = seconds the workflow waited in "
        "OverlappedIO.write for storage"
    )
    return text + "\n\n" + format_table(header, rows) + note
