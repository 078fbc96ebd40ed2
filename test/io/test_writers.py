"""Writers: which backends take parallel writes, and that per-array lanes store the
bytes of synchronous writing, in order per array, within the memory bound, and stop
at a failure without losing what was queued before it."""

from __future__ import annotations

import gc
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TIME, messages
from io_helpers import (
    NSTEPS,
    Copies,
    Recorder,
    own_threads,  # noqa: F401 (autouse fixture)
    read_back,
    step_tensors,
    threads_left,
    zarr_writes,
)

from earth2studio_compile import run
from earth2studio_compile.io import OverlappedIO
from earth2studio_compile.tools import zoo


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
        stored = read_back(name, backend, str(next(directory.iterdir())))
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
        OverlappedIO(Recorder(), workers=2)
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
    io, backend = zarr_writes(names, 6, workers=3)
    for i in range(6):
        io.write(step_tensors(i, 5), OrderedDict(lead_time=np.array([i])), names)
    io.close()
    for k, name in enumerate(names):
        assert [s for n, s in seen if n == name] == list(range(6)), name
        np.testing.assert_array_equal(
            backend.root[name][:, 0], [10.0 * i + k for i in range(6)]
        )
    assert peak[0] > 1  # arrays stored concurrently
    assert io.written == 6 and io.dropped == 0 and not threads_left()


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

    copies = Copies()
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
    io, backend = zarr_writes(
        names, 10, tmp_path / "out.zarr", max_pending=max_pending, workers=3
    )
    for i in range(10):
        io.write(step_tensors(i, 3), OrderedDict(lead_time=np.array([i])), names)
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
    queued = threading.Event()

    async def failing(self, selection, value, prototype=None):
        if selection[0].start >= 1:
            # Fail once every step is queued: the error then reaches flush(), not
            # whichever write() came after it (either may, by design).
            assert queued.wait(30)
            raised.append(OSError(f"disk full writing {self.basename} (injected)"))
            raise raised[-1]
        return await setitem(self, selection, value, prototype)

    monkeypatch.setattr(AsyncArray, "setitem", failing)
    names = ["a", "b"]
    io, backend = zarr_writes(names, 4, max_pending=4, workers=2)
    for i in range(4):
        io.write(step_tensors(i, 2), OrderedDict(lead_time=np.array([i])), names)
    queued.set()
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
        io.write(step_tensors(4, 2), OrderedDict(lead_time=np.array([3])), names)
    io.close()  # delivered once: not raised again
    assert [m for m in messages(logs, "ERROR") if "were not written" in m] == dropped
    np.testing.assert_array_equal(backend.root["a"][0], np.zeros(4))


def test_a_failed_array_loses_no_write_queued_before_it(monkeypatch):
    """Only writes queued after the failed one are skipped, on every array."""
    from earth2studio.io import KVBackend

    write = KVBackend.write
    queued, failed = threading.Event(), threading.Event()

    def uneven(self, x, coords, array_name):
        step = int(coords["lead_time"][0])
        if array_name == "a" and step == 0:
            # a lags (c, on a's lane, too) until b has failed: c's step 0 is queued
            # before the failure and stored after it.
            assert failed.wait(30)
        if array_name == "b" and step == 1:
            assert queued.wait(30)  # every step queued: none refused at write()
            raise OSError("disk full (injected)")
        if array_name == "d" and step == 1:
            # Next on b's lane: the writer has seen b fail before this runs, with
            # no pause to hope for it.
            failed.set()
        write(self, x, coords, array_name)

    monkeypatch.setattr(KVBackend, "write", uneven)
    names = ["a", "b", "c", "d"]  # lanes: a and c on one, b and d on the other
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
    # Step 0 is whole on every array; step 1 on all but b; nothing after it.
    assert [stored[name][0] for name in names] == [1.0] * 4, stored
    assert [stored[name][1] for name in names] == [2.0, 0.0, 2.0, 2.0], stored
    assert all(stored[name][2:] == [0.0, 0.0] for name in names), stored
    assert io.dropped == 2 and not threads_left()


@pytest.mark.parametrize("workers", [1, 2])
def test_more_tensors_than_names_is_refused_not_cut_short(workers):
    """Upstream refuses it; lanes paired tensors and names up and dropped the rest."""
    from earth2studio.io import KVBackend

    backend = KVBackend()
    io = OverlappedIO(backend, workers=workers)
    io.add_array(OrderedDict(lead_time=np.arange(2), x=np.arange(2)), ["a", "b"])
    coords = OrderedDict(lead_time=np.array([0]), x=np.arange(2))
    with pytest.raises(ValueError, match="3 tensor.* 2 name.*one name per tensor"):
        io.write([torch.ones(1, 2)] * 3, coords, ["a", "b"])
    io.write([torch.ones(1, 2)] * 2, coords, ["a", "b"])  # the writer goes on
    io.close()
    assert backend.root["b"][0].tolist() == [1.0, 1.0]


def test_an_error_reaches_the_caller_only_once_every_earlier_step_is_stored(
    monkeypatch,
):
    """A later step failing on one lane while an earlier one is still being stored
    on another: the caller hears of it once that earlier step is stored, so a caller
    that catches it finds every step before the failed one in the store."""
    from earth2studio.io import KVBackend

    write = KVBackend.write
    released, failed = threading.Event(), threading.Event()

    def uneven(self, x, coords, array_name):
        step = int(coords["lead_time"][0])
        if array_name == "a" and step == 0:
            assert released.wait(30)
        if array_name == "b" and step == 1:
            raise OSError("disk full (injected)")
        if array_name == "d" and step == 1:
            failed.set()  # next on b's lane: b's failure is known to the writer
        write(self, x, coords, array_name)

    monkeypatch.setattr(KVBackend, "write", uneven)
    names = ["a", "b", "c", "d"]  # lanes: a and c on one, b and d on the other
    backend = KVBackend()
    io = OverlappedIO(backend, workers=2, max_pending=4)
    io.add_array(OrderedDict(lead_time=np.arange(4), x=np.arange(2)), names)

    def write_step(i: int) -> None:
        io.write(
            [torch.full((1, 2), 1.0 + i) for _ in names],
            OrderedDict(lead_time=np.array([i]), x=np.arange(2)),
            names,
        )

    write_step(0)
    write_step(1)
    assert failed.wait(30)
    write_step(2)  # step 0 of a and c is not stored yet: not raised here
    released.set()
    with pytest.raises(OSError, match="disk full"):
        io.flush()
    assert [backend.root[name][0, 0].item() for name in names] == [1.0] * 4
    assert io.written == 1 and io.dropped == 1
    io.close()
