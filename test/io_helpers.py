"""Shared by the tests of earth2studio_compile.io (test/io/): recording and failing
backends, copy counters, a child interpreter, and the per-test thread check."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import earth2studio_compile
from earth2studio_compile.io import OverlappedIO
from earth2studio_compile.tools.bench.e2e import make_io

NSTEPS = 3


def run_ensemble(model, io) -> None:
    """Upstream's ensemble through our workflow (``compile=False``): 5 members in
    batches of 2 (an uneven last batch), ``NSTEPS`` steps, seeded."""
    from earth2studio.perturbation import Gaussian

    from earth2studio_compile import run
    from earth2studio_compile.tools import zoo

    np.random.seed(0)
    torch.manual_seed(0)
    run.ensemble(
        ["2024-01-01T00:00"],
        NSTEPS,
        5,
        model,
        zoo.random_source(model),
        io,
        Gaussian(noise_amplitude=0.05, seed=0),
        batch_size=2,
        verbose=False,
    )


def make_backend(name: str, tmp: Path, model):
    from earth2studio.io import KVBackend

    return KVBackend() if name == "kv" else make_io(name, tmp, model, NSTEPS)


def read_back(name: str, io, path: str | None) -> dict[str, np.ndarray]:
    """Every array of a closed backend, read back from where it stored them."""
    import zarr

    if name == "kv":
        return {k: v.numpy() for k, v in io.root.items()}
    if name == "zarr":
        return {k: np.asarray(io.root[k][:]) for k in io.root.array_keys()}
    if name == "netcdf4":
        from netCDF4 import Dataset

        with Dataset(path) as ds:
            return {k: np.asarray(ds[k][:]) for k in ds.variables}
    group = zarr.open_group(path, mode="r")
    return {k: np.asarray(group[k][:]) for k in group.array_keys()}


class Recorder:
    """A backend that records what reaches it, optionally slowly or failing."""

    def __init__(self, delay: float = 0.0, fail_at: int | None = None):
        self.delay, self.fail_at = delay, fail_at
        self.writes: list[tuple[float, str]] = []
        self.thread_ids: set[int] = set()
        self.closed = False

    def add_array(self, coords, array_name, **kwargs):
        pass

    def write(self, x, coords, array_name):
        self.thread_ids.add(threading.get_ident())
        if self.fail_at is not None and len(self.writes) == self.fail_at:
            raise OSError("disk full (injected)")
        time.sleep(self.delay)
        self.writes.append((float(x.flatten()[0]), array_name))

    def close(self):
        self.closed = True


def failing_kv(fail_at: int):
    """A ``KVBackend`` whose ``fail_at``-th write (from 1) raises an injected
    ``OSError``, kept as its ``error``; the others store as usual."""
    from earth2studio.io import KVBackend

    class FailingKV(KVBackend):
        def __init__(self) -> None:
            super().__init__()
            self.count, self.error = 0, None

        def write(self, x, coords, array_name):
            self.count += 1
            if self.count == fail_at:
                self.error = OSError("disk full (injected)")
                raise self.error
            super().write(x, coords, array_name)

    return FailingKV()


class Copies:
    """Host copies alive: made (one per array of each returned ``write``) minus
    freed (a finalizer on each copy the backend is handed)."""

    def __init__(self) -> None:
        self.made = self.freed = self.peak = 0
        self.done = self.peak_stored = 0  # released when stored, not when dead
        self.lock = threading.Lock()

    def seen(self, copy: Any) -> None:
        weakref.finalize(copy, self._gone)

    def _gone(self) -> None:
        with self.lock:
            self.freed += 1

    def stored(self) -> None:
        with self.lock:
            self.done += 1

    def wrote(self, n: int) -> None:
        with self.lock:
            self.made += n
            self.peak = max(self.peak, self.made - self.freed)
            self.peak_stored = max(self.peak_stored, self.made - self.done)


def run_child(script: str) -> subprocess.CompletedProcess:
    # The child imports this checkout, wherever the package is installed from.
    root = str(Path(earth2studio_compile.__file__).parents[1])
    path = [root, *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def zarr_writes(
    names: list[str], nsteps: int, path: Path | None = None, **kwargs
) -> tuple[OverlappedIO, Any]:
    from earth2studio.io import ZarrBackend

    # On disk where copies are counted: a memory store keeps views of what it stores.
    backend = ZarrBackend(None if path is None else str(path))
    io = OverlappedIO(backend, **kwargs)
    io.add_array(OrderedDict(lead_time=np.arange(nsteps), x=np.arange(4)), names)
    return io, backend


def step_tensors(i: int, n: int) -> list[torch.Tensor]:
    return [torch.full((1, 4), float(10 * i + k)) for k in range(n)]


_BEFORE: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def own_threads():
    """Threads a failed test left behind are not the next test's: one failure
    stays one failure."""
    _BEFORE.clear()
    _BEFORE.update(threading.enumerate())


def threads_left() -> list[str]:
    """Threads of this package the test started, still alive after a short grace to
    finish exiting."""
    deadline = time.monotonic() + 10
    while True:
        names = [
            t.name
            for t in threading.enumerate()
            if t.name.startswith("OverlappedIO") and t not in _BEFORE
        ]
        if not names or time.monotonic() > deadline:
            return names
        time.sleep(0.01)
