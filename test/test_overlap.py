"""OverlappedIO: the bytes of synchronous writing, errors in the caller, bounded memory.

Persistence has no network, so these rollouts cost no compile: they exercise the
writer, not Inductor.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TIME, messages

import earth2studio_compile
from earth2studio_compile import run
from earth2studio_compile.overlap import OverlappedIO
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.e2e import make_io

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


def test_writes_arrive_in_order_from_one_background_thread():
    backend = _Recorder()
    with OverlappedIO(backend) as io:
        for i in range(20):
            io.write(
                torch.full((2, 2), float(i)), {"lead_time": np.array([i])}, f"a{i}"
            )
    assert backend.writes == [(float(i), f"a{i}") for i in range(20)]
    assert (
        len(backend.thread_ids) == 1 and threading.get_ident() not in backend.thread_ids
    )


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


def test_writer_error_is_raised_once_and_stops_the_writer():
    backend = _Recorder(fail_at=2)
    io = OverlappedIO(backend)
    for i in range(3):
        io.write(torch.full((2,), float(i)), {}, "a")
    with pytest.raises(OSError, match="disk full") as raised:
        io.flush()
    # Nothing is accepted after a failure, and the refusal carries the original error.
    with pytest.raises(RuntimeError, match="earlier write error") as refused:
        io.write(torch.zeros(2), {}, "a")
    assert refused.value.__cause__ is raised.value
    with pytest.raises(RuntimeError, match="earlier write error"):
        io.add_array({}, "a")
    assert [v for v, _ in backend.writes] == [0.0, 1.0]
    # Delivered once: flushing and closing do not raise it again.
    io.flush()
    io.close()
    assert backend.closed


def test_close_closes_the_backend_after_a_write_error():
    backend = _Recorder(fail_at=1)
    io = OverlappedIO(backend)
    for i in range(2):
        io.write(torch.full((2,), float(i)), {}, "a")
    with pytest.raises(OSError, match="disk full"):
        io.close()
    assert backend.closed and [v for v, _ in backend.writes] == [0.0]


class _Copies:
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


@pytest.mark.parametrize("max_pending", [1, 2])
def test_host_copies_never_exceed_max_pending_plus_one(max_pending):
    """The docstring's memory bound: one step being written plus max_pending queued."""
    copies = _Copies()

    class Counting(_Recorder):
        def write(self, x, coords, array_name):
            copies.seen(x)
            super().write(x, coords, array_name)

    backend = Counting(delay=0.05)
    with OverlappedIO(backend, max_pending=max_pending) as io:
        for i in range(8):
            io.write(torch.full((4,), float(i)), {}, "a")
            copies.wrote(1)
    assert [v for v, _ in backend.writes] == [float(i) for i in range(8)]
    assert copies.peak == max_pending + 1 and io.blocked_s > 0


def test_a_write_error_reaches_the_caller_once(logs):
    from earth2studio.io import KVBackend

    class Failing(KVBackend):
        def __init__(self):
            super().__init__()
            self.count, self.error = 0, None

        def write(self, x, coords, array_name):
            self.count += 1
            if self.count == 2:
                self.error = OSError("disk full (injected)")
                raise self.error
            super().write(x, coords, array_name)

    class SlowCaller(OverlappedIO):
        # Steps slower than the writes: the error is raised at the next write, inside
        # the workflow, which then drains its IO with failed=True.
        def write(self, x, coords, array_name):
            super().write(x, coords, array_name)
            time.sleep(0.2)

    backend = Failing()
    io = SlowCaller(backend)
    model = zoo.build("persistence")
    with pytest.raises(OSError, match="disk full") as raised:
        run.deterministic(
            TIME, NSTEPS, model, zoo.random_source(model), io, verbose=False
        )
    assert raised.value is backend.error and backend.count == 2
    io.close()  # delivered: not raised again
    reports = messages(logs, "ERROR") + messages(logs, "WARNING")
    assert not [m for m in reports if "disk full" in m], reports


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
            TIME,
            NSTEPS,
            model,
            zoo.random_source(model),
            OverlappedIO(Failing()),
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
    out = run.deterministic(
        TIME, NSTEPS, model, zoo.random_source(model), io, verbose=False
    )
    assert out is io and not _threads()
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


def test_dropping_the_last_reference_flushes_with_a_warning(logs):
    backend = _Recorder(delay=0.05)
    io = OverlappedIO(backend)
    for i in range(4):
        io.write(torch.full((2,), float(i)), {}, "a")
    del io
    gc.collect()
    # Flushed by the finalizer, before it returned: nothing was left to the daemon.
    assert [v for v, _ in backend.writes] == [0.0, 1.0, 2.0, 3.0] and backend.closed
    warnings = [m for m in messages(logs, "WARNING") if "not closed" in m]
    assert len(warnings) == 1 and "_Recorder" in warnings[0]


def test_a_finalizer_run_by_the_worker_does_not_wait_for_itself(logs):
    released = threading.Event()

    class Collecting(_Recorder):
        def write(self, x, coords, array_name):
            if not self.writes:
                # Garbage collection may run in any thread, here the writer's own.
                released.wait(5)
                gc.collect()
            super().write(x, coords, array_name)

    backend = Collecting(delay=0.01)
    gc.disable()  # only the worker's collect() may free the wrapper
    try:
        io = OverlappedIO(backend)
        io.cycle = io  # unreachable only once the reference below is dropped
        for i in range(3):
            io.write(torch.full((2,), float(i)), {}, "a")
        del io
        released.set()
        deadline = time.monotonic() + 10
        while not backend.closed and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        gc.enable()
    assert backend.closed and [v for v, _ in backend.writes] == [0.0, 1.0, 2.0]
    assert [m for m in messages(logs, "WARNING") if "not closed" in m]


def test_an_unclosed_writer_is_flushed_at_exit(tmp_path):
    out = tmp_path / "writes.txt"
    script = textwrap.dedent(
        f"""
        import time

        import torch

        from earth2studio_compile.overlap import OverlappedIO

        class FileBackend:
            def add_array(self, coords, array_name, **kwargs):
                pass

            def write(self, x, coords, array_name):
                time.sleep(0.05)
                with open({str(out)!r}, "a") as f:
                    f.write(f"{{float(x[0])}}\\n")

        io = OverlappedIO(FileBackend())
        for i in range(4):
            io.write(torch.full((2,), float(i)), {{}}, "a")
        """
    )
    done = _run_child(script)
    assert done.returncode == 0, done.stderr
    assert out.read_text().split() == ["0.0", "1.0", "2.0", "3.0"], done.stderr
    assert "WARNING" in done.stderr
    assert "OverlappedIO around FileBackend was not closed" in done.stderr, done.stderr
    assert "pending" in done.stderr


def _run_child(script: str) -> subprocess.CompletedProcess:
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


# -- parallel writing ------------------------------------------------------------------


def _parallel_rollout(
    name: str, tmp: Path, workers: int | None
) -> tuple[dict, Path, int]:
    """Every array and coordinate of a deterministic run, as the backend stored it."""
    from earth2studio.io import KVBackend, NetCDF4Backend, ZarrBackend

    model = zoo.build("persistence")
    np.random.seed(0)
    directory = tmp / f"{name}-{workers}"
    directory.mkdir()
    if name == "kv":
        backend = KVBackend()
    elif name == "zarr":
        backend = ZarrBackend(str(directory / "out.zarr"))
    else:
        backend = NetCDF4Backend(
            str(directory / "out.nc"), backend_kwargs={"mode": "w"}
        )
    io = OverlappedIO(backend, workers=workers)
    run.deterministic(TIME, NSTEPS, model, zoo.random_source(model), io, verbose=False)
    used = io.workers
    io.close()
    if name == "kv":
        stored = {k: v.numpy() for k, v in backend.root.items()}
        stored.update({f"coord {k}": np.asarray(v) for k, v in backend.coords.items()})
    else:
        stored = _read(name, backend, str(next(directory.iterdir())))
    return stored, directory, used


@pytest.mark.parametrize("name", ["zarr", "kv", "netcdf4"])
def test_parallel_writes_equal_synchronous_ones(name, tmp_path):
    # NetCDF4 asks for the default, and is detected as a one-writer backend.
    sync, sync_dir, _ = _parallel_rollout(name, tmp_path, workers=1)
    par, par_dir, used = _parallel_rollout(
        name, tmp_path, workers=None if name == "netcdf4" else 4
    )
    assert used == (1 if name == "netcdf4" else 4)
    # Every variable and every coordinate, bit for bit.
    assert sync.keys() == par.keys() and {"t2m", "lat", "lead_time"} <= {
        k.removeprefix("coord ") for k in sync
    }
    for key, value in sync.items():
        assert value.dtype == par[key].dtype, key
        np.testing.assert_array_equal(par[key], value, err_msg=key)
    assert np.abs(sync["t2m"]).sum() > 0
    if name == "zarr":
        # The store itself: the same files with the same bytes.
        def files(root: Path) -> dict[str, bytes]:
            return {
                str(f.relative_to(root)): f.read_bytes()
                for f in sorted(root.rglob("*"))
                if f.is_file()
            }

        assert files(sync_dir) == files(par_dir)


def test_backends_that_cannot_write_concurrently_keep_one_writer(tmp_path):
    from earth2studio.io import KVBackend, NetCDF4Backend, ZarrBackend

    nc = NetCDF4Backend(str(tmp_path / "a.nc"), backend_kwargs={"mode": "w"})
    # Detected: one writer by default; a request for more names the fix.
    assert OverlappedIO(nc).workers == 1
    with pytest.raises(ValueError, match="HDF5.*use workers=1"):
        OverlappedIO(nc, workers=4)
    with pytest.raises(ValueError, match="not known to take concurrent writes"):
        OverlappedIO(_Recorder(), workers=2)
    nc.close()

    class Custom(ZarrBackend):
        # A subclass that stores its own way must see every store, from one thread.
        def _write_array(self, name, selection, data):
            calls.append(threading.get_ident())
            super()._write_array(name, selection, data)

    calls: list[int] = []
    custom = Custom()
    assert OverlappedIO(custom).workers == 1
    with OverlappedIO(custom) as io:
        io.add_array({"lead_time": np.array([0, 1])}, ["a", "b"])
        io.write(
            [torch.ones(1), torch.ones(1)], {"lead_time": np.array([1])}, ["a", "b"]
        )
    assert len(calls) == 2 and len(set(calls)) == 1
    assert OverlappedIO(KVBackend(), workers=3).workers == 3
    with pytest.raises(TypeError, match="workers must be an int"):
        OverlappedIO(KVBackend(), workers=2.0)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        OverlappedIO(KVBackend(), workers=0)


def _zarr_writes(
    names: list[str], nsteps: int, path: Path | None = None, **kwargs
) -> tuple[OverlappedIO, Any]:
    from earth2studio.io import ZarrBackend

    # On disk where copies are counted: a memory store keeps views of what it stores.
    backend = ZarrBackend(None if path is None else str(path))
    io = OverlappedIO(backend, **kwargs)
    io.add_array(OrderedDict(lead_time=np.arange(nsteps), x=np.arange(4)), names)
    return io, backend


def _step(i: int, n: int) -> list[torch.Tensor]:
    return [torch.full((1, 4), float(10 * i + k)) for k in range(n)]


def test_parallel_writes_keep_each_arrays_order_and_overlap(monkeypatch):
    import asyncio

    from zarr.core.array import AsyncArray

    seen: list[tuple[str, int]] = []
    active, peak = [0], [0]
    setitem = AsyncArray.setitem

    async def recording(self, selection, value, prototype=None):
        seen.append((self.basename, selection[0].start))
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        await asyncio.sleep(0.002)  # lets other arrays interleave
        active[0] -= 1
        return await setitem(self, selection, value, prototype)

    monkeypatch.setattr(AsyncArray, "setitem", recording)
    names = ["a", "b", "c", "d", "e"]
    io, backend = _zarr_writes(names, 6, workers=3)
    for i in range(6):
        io.write(_step(i, 5), OrderedDict(lead_time=np.array([i])), names)
    io.close()
    for k, name in enumerate(names):
        assert [s for n, s in seen if n == name] == list(range(6)), name
        np.testing.assert_array_equal(
            backend.root[name][:, 0], [10.0 * i + k for i in range(6)]
        )
    assert peak[0] > 1  # arrays stored concurrently
    assert io.written == 6 and io.dropped == 0 and not _threads()


@pytest.mark.parametrize("max_pending", [1, 3])
def test_parallel_host_copies_never_exceed_max_pending_plus_one(
    max_pending, monkeypatch, tmp_path
):
    """The bound holds with several workers: a step's copies live until all its
    arrays are stored, and write blocks instead of copying more.

    A copy counts as released when Zarr has stored it. On a loaded CPU, finalizers
    showed one array per lane outliving its store until that lane's next store,
    held by nothing the garbage collector can see (a running frame): counting
    deaths made this test fail one run in three there. That every copy dies is
    checked at the end.
    """
    from zarr.core.array import AsyncArray

    copies = _Copies()
    setitem = AsyncArray.setitem

    async def slow(self, selection, value, prototype=None):
        copies.seen(value)
        time.sleep(0.05)  # storage slower than the caller, also on a loaded machine
        try:
            return await setitem(self, selection, value, prototype)
        finally:
            copies.stored()

    monkeypatch.setattr(AsyncArray, "setitem", slow)
    names = ["a", "b", "c"]
    io, backend = _zarr_writes(
        names, 10, tmp_path / "out.zarr", max_pending=max_pending, workers=3
    )
    for i in range(10):
        io.write(_step(i, 3), OrderedDict(lead_time=np.array([i])), names)
        copies.wrote(len(names))
    io.close()
    assert copies.peak_stored == (max_pending + 1) * len(names)
    assert io.blocked_s > 0 and io.written == 10
    gc.collect()
    assert copies.freed == copies.made == 10 * len(names)
    np.testing.assert_array_equal(
        backend.root["c"][:, 0], [10.0 * i + 2 for i in range(10)]
    )


def test_a_failed_lane_reaches_the_caller_once_and_nothing_is_lost_silently(
    monkeypatch, logs
):
    from zarr.core.array import AsyncArray

    setitem = AsyncArray.setitem
    raised: list[BaseException] = []

    async def failing(self, selection, value, prototype=None):
        if selection[0].start >= 1:
            raised.append(OSError(f"disk full writing {self.basename} (injected)"))
            raise raised[-1]
        return await setitem(self, selection, value, prototype)

    monkeypatch.setattr(AsyncArray, "setitem", failing)
    names = ["a", "b"]
    io, backend = _zarr_writes(names, 4, max_pending=4, workers=2)
    for i in range(4):
        io.write(_step(i, 2), OrderedDict(lead_time=np.array([i])), names)
    with pytest.raises(OSError, match="disk full") as caught:
        io.flush()
    # One of the original exception objects (two lanes fail at once: whichever the
    # writer saw first); the other lane's failure is logged, not dropped.
    assert any(caught.value is error for error in raised), (caught.value, raised)
    assert len(messages(logs, "ERROR")) == len(raised) - 1 + 1
    # Step 0 was written; step 1 failed; steps 2 and 3 were dropped, and said so once.
    assert io.written == 1 and io.dropped == 2
    dropped = [m for m in messages(logs, "ERROR") if "were not written" in m]
    assert len(dropped) == 1 and dropped[0].startswith("OverlappedIO: 2 write(s)")
    with pytest.raises(RuntimeError, match="earlier write error"):
        io.write(_step(4, 2), OrderedDict(lead_time=np.array([3])), names)
    io.close()  # delivered once: not raised again
    assert [m for m in messages(logs, "ERROR") if "were not written" in m] == dropped
    np.testing.assert_array_equal(backend.root["a"][0], np.zeros(4))


def test_writes_queued_after_a_failure_are_counted_and_logged(logs):
    backend = _Recorder(delay=0.05, fail_at=1)
    io = OverlappedIO(backend, max_pending=4)
    for i in range(4):
        io.write(torch.full((2,), float(i)), {}, "a")
    with pytest.raises(OSError, match="disk full"):
        io.close()
    assert [v for v, _ in backend.writes] == [0.0]
    assert io.written == 1 and io.dropped == 2
    assert [m for m in messages(logs, "ERROR") if "2 write(s) queued" in m]


# -- issue 21: nothing lost, nothing leaked ------------------------------------------


_BEFORE: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _own_threads():
    """Threads a failed test left behind are not the next test's: one failure
    stays one failure."""
    _BEFORE.clear()
    _BEFORE.update(threading.enumerate())


def _threads() -> list[str]:
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


def test_a_failing_backend_never_lets_the_workflow_return():
    from earth2studio.io import KVBackend

    class Failing(KVBackend):
        def __init__(self):
            super().__init__()
            self.count, self.error = 0, None

        def write(self, x, coords, array_name):
            self.count += 1
            if self.count == 3:
                self.error = OSError("disk full (injected)")
                raise self.error
            super().write(x, coords, array_name)

    backend = Failing()
    io = OverlappedIO(backend, max_pending=1)
    model = zoo.build("persistence")
    with pytest.raises(OSError, match="disk full") as raised:
        run.deterministic(
            TIME, 6, model, zoo.random_source(model), io, verbose=False, compile=False
        )
    assert raised.value is backend.error and backend.count == 3
    # Raised once: later writes are refused with the original as their cause.
    with pytest.raises(RuntimeError, match="earlier write error") as refused:
        io.write(torch.zeros(1), {}, "t2m")
    assert refused.value.__cause__ is backend.error
    io.close()
    assert not _threads()


def test_a_failed_array_loses_no_write_queued_before_it(monkeypatch):
    """Only writes queued after the failed one are skipped, on every array."""
    from earth2studio.io import KVBackend

    write = KVBackend.write
    queued, failed = threading.Event(), threading.Event()

    def uneven(self, x, coords, array_name):
        step = int(coords["lead_time"][0])
        if array_name == "a" and step == 0:
            # a lags (c, on a's lane, too) until b has failed: c's step 0 is queued
            # before the failure and stored after it. The pause lets the failure
            # reach the writer before this lane goes on.
            assert failed.wait(30)
            time.sleep(0.05)
        if array_name == "b" and step == 1:
            assert queued.wait(30)  # every step queued: none refused at write()
            failed.set()
            raise OSError("disk full (injected)")
        write(self, x, coords, array_name)

    monkeypatch.setattr(KVBackend, "write", uneven)
    names = ["a", "b", "c"]
    backend = KVBackend()
    io = OverlappedIO(backend, workers=2, max_pending=4)
    io.add_array(OrderedDict(lead_time=np.arange(4), x=np.arange(2)), names)
    for i in range(4):
        io.write(
            [torch.full((1, 2), 1.0 + i) for _ in names],
            OrderedDict(lead_time=np.array([i]), x=np.arange(2)),
            names,
        )
    queued.set()
    with pytest.raises(OSError, match="disk full"):
        io.close()
    stored = {name: backend.root[name][:, 0].tolist() for name in names}
    # Step 0 is whole on every array; nothing after step 1 is stored.
    assert [stored[name][0] for name in names] == [1.0, 1.0, 1.0], stored
    assert all(stored[name][2:] == [0.0, 0.0] for name in names), stored
    assert io.dropped == 2 and not _threads()


def test_two_threads_may_write_at_once():
    class Exclusive(_Recorder):
        """Fails if it is ever called from two threads at once."""

        def __init__(self):
            super().__init__(delay=0.002)
            self.inside = threading.Lock()

        def write(self, x, coords, array_name):
            assert self.inside.acquire(blocking=False), "called concurrently"
            try:
                super().write(x, coords, array_name)
            finally:
                self.inside.release()

    backend = Exclusive()
    io = OverlappedIO(backend, max_pending=1)
    start = threading.Barrier(2)

    def writer(name: str) -> None:
        start.wait()
        for i in range(20):
            io.write(torch.full((2,), float(i)), {}, name)

    users = [threading.Thread(target=writer, args=(n,)) for n in ("x", "y")]
    for user in users:
        user.start()
    for user in users:
        user.join(30)
    closing = threading.Thread(target=io.close)
    closing.start()
    closing.join(30)
    assert not closing.is_alive() and backend.closed  # close() did not hang
    for name in ("x", "y"):
        assert [v for v, n in backend.writes if n == name] == [
            float(i) for i in range(20)
        ]
    assert not _threads()


@pytest.mark.parametrize("how", ["close", "collected", "exception"])
def test_no_thread_outlives_its_writer(how, tmp_path):
    from earth2studio.io import ZarrBackend

    names = ["a", "b"]
    backend = ZarrBackend(str(tmp_path / "out.zarr"))
    io = OverlappedIO(backend, workers=2)
    io.add_array(OrderedDict(lead_time=np.arange(3), x=np.arange(4)), names)

    def write() -> None:
        for i in range(3):
            io.write(_step(i, 2), OrderedDict(lead_time=np.array([i])), names)

    if how == "close":
        write()
        io.close()
    elif how == "collected":
        write()
        del io
        gc.collect()
    else:
        with pytest.raises(KeyError), io:
            write()
            raise KeyError("the caller's own error")
    assert not _threads()
    np.testing.assert_array_equal(backend.root["b"][:, 0], [1.0, 11.0, 21.0])


def test_hasattr_does_not_wait_for_pending_writes():
    released = threading.Event()

    class Blocked(_Recorder):
        def write(self, x, coords, array_name):
            released.wait(30)
            super().write(x, coords, array_name)

    backend = Blocked()
    io = OverlappedIO(backend)
    io.write(torch.zeros(2), {}, "a")
    assert not hasattr(io, "no_such_attribute")
    assert not backend.writes  # answered while the write was still pending
    released.set()
    assert io.closed is False  # the backend's own attribute, after a flush
    assert backend.writes
    io.close()


@pytest.mark.parametrize("workers", [1, 4])
def test_an_unclosed_zarr_writer_loses_nothing_at_exit(workers, tmp_path):
    path = tmp_path / "out.zarr"
    script = textwrap.dedent(
        f"""
        from collections import OrderedDict

        import numpy as np
        import torch
        from earth2studio.io import ZarrBackend

        from earth2studio_compile.overlap import OverlappedIO

        names = ["a", "b", "c", "d"]
        io = OverlappedIO(ZarrBackend({str(path)!r}), max_pending=8, workers={workers})
        io.add_array(OrderedDict(lead_time=np.arange(8), x=np.arange(64)), names)
        for i in range(8):
            io.write(
                [torch.full((1, 64), 1.0 + i) for _ in names],
                OrderedDict(lead_time=np.array([i]), x=np.arange(64)),
                names,
            )
        """
    )
    done = _run_child(script)
    assert done.returncode == 0, done.stderr
    import zarr

    group = zarr.open_group(str(path), mode="r")
    for name in ["a", "b", "c", "d"]:
        assert group[name][:, 0].tolist() == [1.0 + i for i in range(8)], done.stderr
    assert "was not closed before exit" in done.stderr
