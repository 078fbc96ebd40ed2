"""OverlappedIO: same bytes as synchronous writing, errors in the caller, bounded memory.

Persistence has no network, so these rollouts cost no compile: they exercise the
writer, not Inductor.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TIME

from earth2studio_compile import run, zoo
from earth2studio_compile.bench.e2e import make_io
from earth2studio_compile.overlap import OverlappedIO

NSTEPS = 3
BACKENDS = ["kv", "zarr", "netcdf4", "async-zarr"]


def _backend(name: str, tmp: Path, model):
    from earth2studio.io import KVBackend

    return KVBackend() if name == "kv" else make_io(name, tmp, model, NSTEPS)


def _read(name: str, io, path: str | None) -> dict[str, np.ndarray]:
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


def _rollout(name: str, tmp: Path, overlap: bool) -> dict[str, np.ndarray]:
    model = zoo.build("persistence")
    np.random.seed(0)
    directory = tmp / f"{name}-{overlap}"
    directory.mkdir()
    backend = _backend(name, directory, model)
    io = OverlappedIO(backend) if overlap else backend
    run.deterministic(TIME, NSTEPS, model, zoo.random_source(model), io, verbose=False)
    if name in ("netcdf4", "async-zarr"):
        io.close()  # file-backed: written out on close
    files = list(directory.iterdir())
    return _read(name, backend, str(files[0]) if files else None)


@pytest.mark.parametrize("name", BACKENDS)
def test_overlapped_output_equals_synchronous(name, tmp_path):
    sync = _rollout(name, tmp_path, overlap=False)
    overlapped = _rollout(name, tmp_path, overlap=True)
    assert sync.keys() == overlapped.keys() and "t2m" in sync
    for key, value in sync.items():
        np.testing.assert_array_equal(overlapped[key], value, err_msg=key)
    assert np.isfinite(sync["t2m"]).all() and np.abs(sync["t2m"]).sum() > 0


class _Recorder:
    """A backend that records what reaches it, optionally slowly or failing."""

    def __init__(self, delay: float = 0.0, fail_at: int | None = None):
        self.delay, self.fail_at = delay, fail_at
        self.writes: list[tuple[float, str]] = []
        self.thread_ids: set[int] = set()

    def add_array(self, coords, array_name, **kwargs):
        pass

    def write(self, x, coords, array_name):
        self.thread_ids.add(threading.get_ident())
        if self.fail_at is not None and len(self.writes) == self.fail_at:
            raise OSError("disk full (injected)")
        time.sleep(self.delay)
        self.writes.append((float(x.flatten()[0]), array_name))


def test_writes_arrive_in_order_from_one_background_thread():
    backend = _Recorder()
    with OverlappedIO(backend) as io:
        for i in range(20):
            io.write(torch.full((2, 2), float(i)), {"lead_time": np.array([i])}, f"a{i}")
    assert backend.writes == [(float(i), f"a{i}") for i in range(20)]
    assert len(backend.thread_ids) == 1 and threading.get_ident() not in backend.thread_ids


def test_caller_may_modify_its_tensor_after_write():
    backend = _Recorder(delay=0.05)
    x = torch.zeros(2, 2)
    with OverlappedIO(backend) as io:
        io.write(x, {}, "a")
        x.fill_(7.0)  # before the background write ran
    assert backend.writes == [(0.0, "a")]


def test_queue_is_bounded_under_a_slow_writer():
    backend = _Recorder(delay=0.1)
    io = OverlappedIO(backend, max_pending=2)
    outstanding, start = [], time.perf_counter()
    for i in range(8):
        io.write(torch.full((4,), float(i)), {}, "a")
        outstanding.append(i + 1 - len(backend.writes))
    enqueued = time.perf_counter() - start
    io.close()
    # At most max_pending waiting plus the one being written: host memory is bounded.
    assert max(outstanding) <= 3
    # The producer was held back by the writer (8 writes of 0.1 s, 3 may be pending).
    assert enqueued >= 0.4
    assert [v for v, _ in backend.writes] == [float(i) for i in range(8)]


def test_writer_error_is_raised_in_the_caller_and_stops_the_writer():
    backend = _Recorder(fail_at=2)
    io = OverlappedIO(backend)
    for i in range(3):
        io.write(torch.full((2,), float(i)), {}, "a")
    with pytest.raises(OSError, match="disk full"):
        io.flush()
    with pytest.raises(OSError, match="disk full"):
        io.write(torch.zeros(2), {}, "a")  # nothing is accepted after a failure
    assert [v for v, _ in backend.writes] == [0.0, 1.0]
    with pytest.raises(OSError):
        io.close()


def test_workflow_raises_a_background_write_error():
    from earth2studio.io import KVBackend

    class Failing(KVBackend):
        def __init__(self):
            super().__init__()
            self.count = 0

        def write(self, x, coords, array_name):
            self.count += 1
            if self.count == 3:
                raise OSError("disk full (injected)")
            super().write(x, coords, array_name)

    model = zoo.build("persistence")
    with pytest.raises(OSError, match="disk full"):
        run.deterministic(
            TIME, NSTEPS, model, zoo.random_source(model), OverlappedIO(Failing()),
            verbose=False,
        )


def test_workflow_returns_only_after_every_write():
    from earth2studio.io import KVBackend

    class Slow(KVBackend):
        def write(self, x, coords, array_name):
            time.sleep(0.05)
            super().write(x, coords, array_name)

    model = zoo.build("persistence")
    backend = Slow()
    io = OverlappedIO(backend)
    np.random.seed(0)
    out = run.deterministic(TIME, NSTEPS, model, zoo.random_source(model), io, verbose=False)
    assert out is io and io._queue.unfinished_tasks == 0
    # Every lead time was written: no slice of the preallocated arrays is left at zero.
    t2m = backend.root["t2m"]
    assert all(t2m[0, i].abs().sum() > 0 for i in range(NSTEPS + 1))


def test_reading_through_the_wrapper_sees_every_write():
    from earth2studio.io import KVBackend

    io = OverlappedIO(KVBackend())
    coords = {"lead_time": np.array([0, 1])}
    io.add_array(coords, "a")
    io.write(torch.ones(1), {"lead_time": np.array([1])}, "a")
    assert io.root["a"].tolist() == [0.0, 1.0]
    io.close()


def test_bad_arguments_name_the_fix():
    from earth2studio.io import KVBackend

    with pytest.raises(TypeError, match="has no add_array"):
        OverlappedIO(object())
    with pytest.raises(ValueError, match="max_pending must be >= 1"):
        OverlappedIO(KVBackend(), max_pending=0)
    with pytest.raises(TypeError, match="max_pending must be an int"):
        OverlappedIO(KVBackend(), max_pending=2.5)
    with pytest.raises(TypeError, match="already an OverlappedIO"):
        OverlappedIO(OverlappedIO(KVBackend()))
    io = OverlappedIO(KVBackend())
    io.close()
    with pytest.raises(RuntimeError, match="closed"):
        io.write(torch.zeros(1), {}, "a")
