"""Upstream's ``ensemble`` workflow run on seeded data, and what a row asks of it.

The kinds of row (:data:`EAGER`, :data:`EAGER_TF32`, :data:`COMPILED`), the IO
backends and outputs a row writes, PyTorch's TF32 switches, one whole run of
``earth2studio.run.ensemble`` (:func:`run_ensemble`), and reading its store back.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from earth2studio_compile.tools.bench.e2e import make_io
from earth2studio_compile.tools.bench.runs import TIME, finish

EAGER, EAGER_TF32, COMPILED = "eager", "eager-tf32", "compiled"
IO_CHOICES = ("zarr-disk", "async-zarr", "zarr")
OUTPUTS = ("few", "all")
#: Variables written per member in "few" rows: the first three the model has.
FEW = ("t2m", "z500", "u10m", "v10m", "t850", "tcwv", "z1000")
NOISE = 0.05


def output_coords(model: Any, outputs: str) -> OrderedDict:
    """``output_coords`` of a row: a few variables, or everything (empty).

    Parameters
    ----------
    model : Any
        Prognostic model
    outputs : str
        ``"few"`` or ``"all"``

    Returns
    -------
    OrderedDict
        Upstream's ``output_coords`` argument
    """
    if outputs == "all":
        return OrderedDict()
    variables = [str(v) for v in model.input_coords()["variable"]]
    few = [v for v in FEW if v in variables][:3] or variables[:3]
    return OrderedDict({"variable": np.array(few)})


def store_bytes(model: Any, nensemble: int, nsteps: int, outputs: str) -> int:
    """Bytes the store of a row holds (float32, uncompressed): a field per member,
    step and variable on the grid, the dimensions after ``variable`` (``lat``/``lon``,
    or StormCast's ``hrrr_y``/``hrrr_x``)."""
    coords = model.input_coords()
    nvar = len(output_coords(model, outputs).get("variable", coords["variable"]))
    dims = list(coords)
    grid = math.prod(len(coords[d]) for d in dims[dims.index("variable") + 1 :])
    return 4 * nensemble * (nsteps + 1) * nvar * grid


def make_ensemble_io(
    name: str, directory: Path, model: Any, nsteps: int, nensemble: int
) -> Any:
    """A fresh IO backend for an ensemble; see :func:`.e2e.make_io` for the names.

    ``async-zarr`` is upstream's ``AsyncZarrBackend(blocking=False)`` with the
    ensemble, time and lead-time coordinates as its parallel (iterated) ones.
    """
    if name != "async-zarr":
        return make_io(name, directory, model, nsteps)
    from earth2studio.io import AsyncZarrBackend

    step = model.output_coords(model.input_coords())["lead_time"][-1]
    return AsyncZarrBackend(
        str(directory / f"ensemble-{time.monotonic_ns()}.zarr"),
        parallel_coords=OrderedDict(
            {
                "ensemble": np.arange(nensemble),
                "time": np.array([TIME]),
                "lead_time": np.asarray([step * i for i in range(nsteps + 1)]),
            }
        ),
        blocking=False,
    )


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """PyTorch's global TF32 switches (matmul and cuDNN) set, then restored."""
    matmul, cudnn = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = (
            matmul,
            cudnn,
        )


def run_ensemble(
    model: Any,
    io: Any,
    nensemble: int,
    nsteps: int,
    batch_size: int,
    device: torch.device,
    selection: OrderedDict,
    marks: dict[str, float] | None = None,
    perturbation: Any = None,
) -> float:
    """Wall seconds of upstream's ``ensemble`` on seeded data, everything written.

    Parameters
    ----------
    model : Any
        Prognostic model, on ``device``
    io : Any
        IO backend (closed here where it has ``close``)
    nensemble, nsteps, batch_size : int
        Members, forecast steps, members per batch
    device : torch.device
        Where the workflow runs
    selection : OrderedDict
        Upstream's ``output_coords``
    marks : dict[str, float] | None, optional
        Filled with ``perf_counter`` readings ``start``, ``returned``, ``end``
    perturbation : Any, optional
        The perturbation; by default a ``Gaussian`` seeded with 0

    Returns
    -------
    float
        Seconds from the call until the store is written and the device idle
    """
    import earth2studio.run as upstream
    from earth2studio.perturbation import Gaussian

    from earth2studio_compile.tools import zoo

    np.random.seed(0)  # the Random source draws from numpy's global generator
    torch.manual_seed(0)
    data = zoo.random_source(model)
    if perturbation is None:
        perturbation = Gaussian(noise_amplitude=NOISE, seed=0)
    marks = {} if marks is None else marks
    start = marks["start"] = time.perf_counter()
    upstream.ensemble(
        [str(TIME)],
        nsteps,
        nensemble,
        model,
        data,
        io,
        perturbation,
        batch_size=batch_size,
        output_coords=selection,
        device=device,
        verbose=False,
    )
    return finish(io, device, marks, start)


def read_step(path: Path, step: int) -> dict[str, torch.Tensor]:
    """Every array of a Zarr store at lead-time index ``step``, all members."""
    import zarr

    root = zarr.open_group(str(path), mode="r")
    out = {}
    for name, array in root.arrays():
        dims = list(getattr(array.metadata, "dimension_names", None) or ())
        if "lead_time" not in dims or "ensemble" not in dims:
            continue
        index = tuple(step if d == "lead_time" else slice(None) for d in dims)
        out[name] = torch.as_tensor(np.asarray(array[index]))
    return out


def store_path(io: Any) -> Path | None:
    """Where a backend's store lives on disk (None: in memory)."""
    for attr in ("store", "_store"):
        root = getattr(getattr(io, attr, None), "root", None)
        if root is not None:
            return Path(root)
    name = getattr(io, "file_name", None)
    return Path(name) if name else None


def tree_bytes(path: Path | None) -> int | None:
    """Bytes of the files under ``path`` (None where there is no such path)."""
    if path is None or not path.exists():
        return None
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
