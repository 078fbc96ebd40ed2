"""OverlappedIO: the bytes of synchronous writing, in order, with bounded host memory
reused across steps (errors and endings: test_overlap_ending.py).

Persistence has no network, so these rollouts cost no compile: they exercise the
writer, not Inductor. Ordering is set with events, not sleeps, wherever a result
depends on it (the machine running them may be loaded); a sleep only makes storage
slower than the caller.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TIME
from io_helpers import (
    NSTEPS,
    Copies,
    Recorder,
    make_backend,
    own_threads,  # noqa: F401 (autouse fixture)
    read_back,
    run_ensemble,
    threads_left,
    zarr_writes,
)

from earth2studio_compile import run
from earth2studio_compile.io import OverlappedIO
from earth2studio_compile.tools import zoo

BACKENDS = ["kv", "zarr", "netcdf4", "async-zarr"]


def _rollout(name: str, tmp: Path, overlap: bool) -> dict[str, np.ndarray]:
    model = zoo.build("persistence")
    np.random.seed(0)
    directory = tmp / f"{name}-{overlap}"
    directory.mkdir()
    backend = make_backend(name, directory, model)
    io = OverlappedIO(backend) if overlap else backend
    run.deterministic(TIME, NSTEPS, model, zoo.random_source(model), io, verbose=False)
    if name in ("netcdf4", "async-zarr"):
        io.close()  # file-backed: written out on close
    files = list(directory.iterdir())
    return read_back(name, backend, str(files[0]) if files else None)


def _ensemble(name: str, tmp: Path, overlap: bool) -> dict[str, np.ndarray]:
    """Upstream's ensemble, 5 members in batches of 2 (an uneven last batch), 3
    steps, on a fresh backend, through OverlappedIO or not; what the store holds."""
    from earth2studio.io import KVBackend

    from earth2studio_compile.tools.bench.ensemble.upstream import make_ensemble_io

    model = zoo.build("persistence")
    directory = tmp / f"ens-{name}-{overlap}"
    directory.mkdir()
    backend = (
        KVBackend()
        if name == "kv"
        else make_ensemble_io(name, directory, model, NSTEPS, 5)
    )
    io = OverlappedIO(backend) if overlap else backend
    run_ensemble(model, io)
    if callable(getattr(io, "close", None)):
        io.close()  # file-backed and asynchronous ones: written out on close
    files = list(directory.iterdir())
    return read_back(name, backend, str(files[0]) if files else None)


@pytest.mark.parametrize("name", [*BACKENDS, "zarr-disk"])
def test_an_overlapped_ensemble_stores_upstreams_members_bitwise(name, tmp_path):
    """Every member and step of upstream's synchronous eager ensemble, through
    OverlappedIO (the ZarrWriter stores each member's chunk apart)."""
    sync = _ensemble(name, tmp_path, overlap=False)
    overlapped = _ensemble(name, tmp_path, overlap=True)
    assert sync.keys() == overlapped.keys() and "t2m" in sync
    for key, value in sync.items():
        assert value.dtype == overlapped[key].dtype, key
        np.testing.assert_array_equal(overlapped[key], value, err_msg=key)
    t2m = sync["t2m"]
    assert t2m.shape[0] == 5 and np.isfinite(t2m).all()
    assert not np.array_equal(t2m[0], t2m[4])  # the members differ


@pytest.mark.parametrize("name", BACKENDS)
def test_overlapped_output_equals_synchronous(name, tmp_path):
    sync = _rollout(name, tmp_path, overlap=False)
    overlapped = _rollout(name, tmp_path, overlap=True)
    assert sync.keys() == overlapped.keys() and "t2m" in sync
    for key, value in sync.items():
        np.testing.assert_array_equal(overlapped[key], value, err_msg=key)
    assert np.isfinite(sync["t2m"]).all() and np.abs(sync["t2m"]).sum() > 0


def test_writes_arrive_in_order_from_one_background_thread():
    backend = Recorder()
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
    backend = Recorder(delay=0.05)
    x = torch.zeros(2, 2)
    with OverlappedIO(backend) as io:
        io.write(x, {}, "a")
        x.fill_(7.0)  # before the background write ran
    assert backend.writes == [(0.0, "a")]


def test_queue_is_bounded_under_a_slow_writer():
    backend = Recorder(delay=0.1)
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


@pytest.mark.parametrize("max_pending", [1, 2])
def test_host_copies_never_exceed_max_pending_plus_one(max_pending):
    """The docstring's memory bound: one step being written plus max_pending queued."""
    copies = Copies()

    class Counting(Recorder):
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


class _Keeper:
    """Keeps a copy of every tensor it is handed, by name."""

    def __init__(self):
        self.stored: dict[str, list[torch.Tensor]] = {}

    def add_array(self, coords, array_name, **kwargs):
        pass

    def write(self, x, coords, array_name):
        for t, name in zip(x, array_name):
            self.stored.setdefault(name, []).append(t.clone())


@pytest.mark.parametrize("max_pending", [1, 2])
def test_a_write_of_views_is_one_copy_into_buffers_reused_across_steps(max_pending):
    """What split_coords hands write(): 26 views of one tensor, one copy per step;
    over 10 steps no more buffers than steps in flight."""
    backend, names = _Keeper(), [f"v{i}" for i in range(26)]
    torch.manual_seed(0)
    x = torch.zeros(2, 1, 1, 26, 9, 12)
    step_bytes = x.numel() * x.element_size()
    with OverlappedIO(backend, max_pending=max_pending) as io:
        for step in range(10):
            x.normal_()  # in place: the writer must hold a copy
            io.write([x[:, :, :, i] for i in range(26)], {}, names)
            assert io._pool.copies == step + 1
        assert io._pool.allocated <= max_pending + 1 + io._pool.kept
        assert 0 < io.host_bytes <= (max_pending + 1) * step_bytes
    assert io._pool.held_bytes == 0  # let go at close
    torch.manual_seed(0)  # the same draws again
    x = torch.zeros(2, 1, 1, 26, 9, 12)
    for step in range(10):
        x.normal_()
        for i, name in enumerate(names):
            assert torch.equal(backend.stored[name][step], x[:, :, :, i])


@pytest.mark.parametrize("workers", [None, 1])  # Zarr's lanes; upstream's write
def test_an_in_memory_zarr_store_keeps_every_step_whole(workers):
    """A memory store keeps views of what it stores: it gets copies of its own,
    made on the writer's threads, and the host buffers are reused (handing it the
    buffers would take a new one each step: on CUDA a new pinned allocation)."""
    from earth2studio.io import ZarrBackend

    names, nsteps = ["a", "b", "c"], 10
    io = OverlappedIO(ZarrBackend(), max_pending=1, workers=workers)
    io.add_array(OrderedDict(lead_time=np.arange(nsteps), x=np.arange(4)), names)
    x = torch.zeros(1, 3, 4)
    for i in range(nsteps):
        x.fill_(float(i))
        io.write(list(x.unbind(1)), OrderedDict(lead_time=np.array([i])), names)
    io.close()
    for name in names:
        np.testing.assert_array_equal(io.io.root[name][:, 0], np.arange(nsteps))
    assert io._pool.kept == 0
    assert io._pool.allocated <= io.max_pending + 1


@pytest.mark.parametrize("workers", [1, 4])
def test_buffers_are_reused_with_a_zarr_store_on_disk(workers, tmp_path):
    names, nsteps = [f"v{i}" for i in range(6)], 10
    io, backend = zarr_writes(names, nsteps, tmp_path / "out.zarr", workers=workers)
    x = torch.zeros(1, 6, 4)
    for i in range(nsteps):
        x.fill_(float(i))
        io.write(list(x.unbind(1)), OrderedDict(lead_time=np.array([i])), names)
    io.close()
    for name in names:
        np.testing.assert_array_equal(backend.root[name][:, 0], np.arange(nsteps))
    # A buffer is let go, not reused, where a writer's thread still held it when
    # checked (seldom: it lets go as its job ends); nothing else adds buffers.
    assert io._pool.copies == nsteps and io._pool.kept <= 2
    assert io._pool.allocated <= io.max_pending + 1 + io._pool.kept


@pytest.mark.gpu
@pytest.mark.parametrize("max_pending", [1, 2])
def test_a_cuda_rollout_of_views_is_stored_bitwise_with_bounded_buffers(
    max_pending, tmp_path
):
    from earth2studio.io import ZarrBackend
    from earth2studio.utils.coords import split_coords

    nsteps, nvar = 12, 26
    names = [f"v{i}" for i in range(nvar)]
    grid = OrderedDict(lat=np.arange(181), lon=np.arange(360))

    def rollout(io) -> None:
        torch.manual_seed(0)
        io.add_array(
            OrderedDict(batch=np.arange(2), lead_time=np.arange(nsteps), **grid), names
        )
        x = torch.randn(2, 1, nvar, 181, 360, device="cuda")
        for step in range(nsteps):
            torch.cuda._sleep(5_000_000)  # a slow step: the copy must wait for it
            x = x * 1.01 + torch.randn_like(x)  # a new tensor; the old one is freed
            coords = OrderedDict(
                batch=np.arange(2),
                lead_time=np.array([step]),
                variable=np.array(names),
                **grid,
            )
            io.write(*split_coords(x, coords))

    sync = ZarrBackend(str(tmp_path / "sync.zarr"))
    rollout(sync)
    backend = ZarrBackend(str(tmp_path / "overlapped.zarr"))
    with OverlappedIO(backend, max_pending=max_pending) as io:
        rollout(io)
        step_bytes = 2 * nvar * 181 * 360 * 4
        assert io._pool.copies == nsteps and io._pool.kept <= 2
        assert io._pool.allocated <= max_pending + 1 + io._pool.kept
        assert io.host_bytes <= (max_pending + 1) * step_bytes
    for name in names:
        np.testing.assert_array_equal(backend.root[name][:], sync.root[name][:])


def test_a_new_stores_chunk_directories_are_made_before_its_writes(
    tmp_path, monkeypatch
):
    """Added arrays on disk: their chunk directories are made on a thread from then
    on (the workflow's first step), and a maker still running when the writer is
    closed is stopped first, nothing made after."""
    from earth2studio.io import ZarrBackend

    from earth2studio_compile.io import zarr_writer

    done, made = threading.Event(), []
    shipped = zarr_writer.directories_ahead

    def recorded(arrays, stop):
        made.append(shipped(arrays, stop))
        done.set()
        return made[-1]

    monkeypatch.setattr(zarr_writer, "directories_ahead", recorded)
    coords = OrderedDict(ensemble=np.arange(3), lead_time=np.arange(2), x=np.arange(4))
    backend = ZarrBackend(str(tmp_path / "s.zarr"))
    io = OverlappedIO(backend)
    io.add_array(coords, ["t2m", "u10"])
    assert done.wait(30) and made == [12]
    chunks = tmp_path / "s.zarr" / "t2m" / "c"
    assert sorted(p.relative_to(chunks).as_posix() for p in chunks.glob("*/*")) == [
        f"{m}/{s}" for m in range(3) for s in range(2)
    ]
    for s in range(2):
        step = OrderedDict(coords, lead_time=np.array([s]))
        x = torch.full((3, 1, 4), float(s))
        io.write([x, -x], step, ["t2m", "u10"])
    io.flush()
    stored = backend.root["u10"][:, 1]
    np.testing.assert_array_equal(stored, np.full((3, 4), -1.0, "float32"))

    # A maker that would go on: stopped by close, before it returns.
    stopped = threading.Event()

    def endless(arrays, stop):
        while not stop.wait(0.01):
            pass
        stopped.set()
        return 0

    monkeypatch.setattr(zarr_writer, "directories_ahead", endless)
    io.add_array(OrderedDict(lead_time=np.arange(2), x=np.arange(4)), "v")
    io.close()
    assert stopped.is_set() and threads_left() == []


def test_a_compiled_call_overlaps_only_the_zarr_backends_measured(tmp_path):
    """compile=True wraps what it was measured to speed up, a ZarrBackend in memory
    or on disk and an AsyncZarrBackend (one worker: it writes concurrently itself);
    never a backend not measured, a subclass, one whose instance writes otherwise,
    nor a wrapper."""
    import os

    from earth2studio.io import AsyncZarrBackend, KVBackend, NetCDF4Backend, ZarrBackend

    from earth2studio_compile.io import for_compiled_call

    class Mine(ZarrBackend):
        pass

    class MyAsync(AsyncZarrBackend):
        pass

    for io in (ZarrBackend(), ZarrBackend(str(tmp_path / "a.zarr"))):
        wrapped = for_compiled_call(io)
        assert isinstance(wrapped, OverlappedIO) and wrapped.io is io
        assert wrapped.workers == min(8, os.cpu_count() or 1)  # the defaults
        assert wrapped.max_pending == 2
    async_io = AsyncZarrBackend(str(tmp_path / "b.zarr"), OrderedDict())
    wrapped = for_compiled_call(async_io)
    assert isinstance(wrapped, OverlappedIO) and wrapped.io is async_io
    assert (wrapped.workers, wrapped.max_pending) == (1, 2)
    patched = ZarrBackend()
    patched.write = lambda *args: None
    others = [
        KVBackend(),
        MyAsync(str(tmp_path / "d.zarr"), OrderedDict()),
        NetCDF4Backend(str(tmp_path / "c.nc"), backend_kwargs={"mode": "w"}),
        Mine(),
        patched,
        OverlappedIO(ZarrBackend()),
        None,
    ]
    assert [for_compiled_call(io) for io in others] == [None] * len(others)
