"""A local directory's steps (earth2studio_compile/io/steps.py): one job a step, its
chunks taken by the put threads from one batch, writes of a chunk in step order, a
failure stopping the later steps, nothing lost to a finalizer on a writer thread."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import numpy as np
import pytest
import torch
from io_helpers import own_threads  # noqa: F401 (autouse fixture)

from earth2studio_compile.io import OverlappedIO
from earth2studio_compile.io import steps as local_steps


def _around_puts(monkeypatch, around) -> None:
    """Each chunk the steps write goes through ``around(put, array, outer, piece)``,
    which calls ``put(outer, piece)`` to write it (or not)."""
    plan = local_steps.local_chunks

    def planned(array, selection, data):
        found = plan(array, selection, data)
        if found is None:
            return None
        put, chunks = found

        def wrapped(outer, piece):
            around(put, array, outer, piece)

        return wrapped, chunks

    monkeypatch.setattr(local_steps, "local_chunks", planned)


def _members_coords(steps: int) -> OrderedDict:
    return OrderedDict(
        ensemble=np.arange(8),
        lead_time=np.arange(steps).astype("timedelta64[h]"),
        lat=np.linspace(-90, 90, 5),
        lon=np.linspace(0, 350, 8),
    )


def _chunk_files(path, names: list[str]) -> dict[str, bytes]:
    """The chunk files of arrays ``names`` under ``path``, by their path there."""
    return {
        str(f.relative_to(path)): f.read_bytes()
        for name in names
        for f in sorted((path / name / "c").rglob("*"))
        if f.is_file()
    }


def test_a_local_directorys_step_is_one_job_and_a_few_put_jobs(tmp_path, monkeypatch):
    """A step of whole chunks in a local directory is one job on the writer's steps
    thread, its chunks taken by the put threads from one batch: no lane job, and a
    put job per put thread, not per chunk. A lane job per array, each handing its
    chunks to the put pool one job each, made 26 lane wake-ups and 104 put jobs a
    step for an FCN ensemble, each a hand-off of the GIL that the workflow's own
    thread waited behind (docs/bench/2026-11-28-cpu-writers). The files are
    upstream's, byte for byte."""
    import collections
    from concurrent.futures import ThreadPoolExecutor

    from earth2studio.io import ZarrBackend

    from earth2studio_compile.io import zarr_writer

    steps, names = 4, [f"v{i}" for i in range(6)]
    coords = _members_coords(steps)
    xs = [torch.randn(len(names), 8, 1, 5, 8) + 10.0 for _ in range(steps)]

    def at(step: int) -> OrderedDict:
        return OrderedDict(
            {**coords, "lead_time": coords["lead_time"][step : step + 1]}
        )

    expected = ZarrBackend(str(tmp_path / "sync.zarr"))
    expected.add_array(coords, names)
    for step, x in enumerate(xs):
        expected.write(list(x), at(step), names)

    jobs: collections.Counter[str] = collections.Counter()
    submit = ThreadPoolExecutor.submit

    def counted(self, fn, /, *args, **kwargs):
        kind = self._thread_name_prefix.rpartition(" ")[2]
        name = getattr(fn, "__name__", "")
        if " lane " in self._thread_name_prefix:
            kind = "lane"
        # A lane's marker and its loop's closing are the writer's close, not a step's;
        # the put pool's other jobs are reads of Zarr's loops (opening an array).
        if (
            fn is not int
            and name != "close"
            and (kind != "put" or name in ("put", "_take"))
        ):
            jobs[kind] += 1
        return submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", counted)
    ours = ZarrBackend(str(tmp_path / "ours.zarr"))
    with OverlappedIO(ours, workers=3, max_pending=steps) as io:
        io.add_array(coords, names)
        for step, x in enumerate(xs):
            io.write(list(x), at(step), names)
    chunks = len(names) * 8
    assert jobs["lane"] == 0, jobs
    assert jobs["steps"] == steps, jobs
    assert 0 < jobs["put"] <= steps * min(zarr_writer.FILE_THREADS, chunks), jobs
    want = _chunk_files(tmp_path / "sync.zarr", names)
    assert len(want) == steps * chunks
    assert _chunk_files(tmp_path / "ours.zarr", names) == want


def test_a_chunk_written_again_lands_after_its_earlier_write(tmp_path, monkeypatch):
    """The same chunks written by three steps: the first's files slow to write, the
    second through the arrays' lanes (a member starting with the fill value, which
    Zarr's comparison decides for) and slow there, the third as whole chunks again.
    Each step's writes wait for the earlier ones, and the store holds the third's."""
    import asyncio

    from earth2studio.io import ZarrBackend
    from zarr.core.array import AsyncArray

    coords = _members_coords(1)
    names = ["a", "b"]
    steps = [torch.randn(2, 8, 1, 5, 8) + 10.0 * (k + 1) for k in range(3)]
    steps[1][:, 0, 0, 0, 0] = 0.0
    calls = [0]
    lock = threading.Lock()

    def slow_first(put, array, outer, piece):
        with lock:
            calls[0] += 1
            slow = calls[0] <= 16  # the first step's 16 chunks
        if slow:
            time.sleep(0.02)
        put(outer, piece)

    setitem = AsyncArray.setitem

    async def slow_setitem(self, *args, **kwargs):
        await asyncio.sleep(0.05)
        return await setitem(self, *args, **kwargs)

    _around_puts(monkeypatch, slow_first)
    monkeypatch.setattr(AsyncArray, "setitem", slow_setitem)
    backend = ZarrBackend(str(tmp_path / "s.zarr"))
    with OverlappedIO(backend, workers=2, max_pending=3) as io:
        io.add_array(coords, names)
        for x in steps:
            io.write(list(x), coords, names)
    assert calls[0] == 32  # the first and third steps' files
    for k, name in enumerate(names):
        np.testing.assert_array_equal(backend.root[name][:], steps[2][k].numpy())


def test_a_failed_chunk_stops_the_writer_with_every_earlier_step_stored(
    tmp_path, monkeypatch
):
    """A chunk's file failing in a local directory's step: the error reaches the
    caller once, every earlier step is stored whole, the failed step's other
    chunks are stored, nothing after it."""
    from earth2studio.io import ZarrBackend

    steps, names = 4, ["a", "b"]
    coords = _members_coords(steps)
    xs = [torch.randn(2, 8, 1, 5, 8) + 10.0 for _ in range(steps)]
    failed = threading.Event()

    def failing(put, array, outer, piece):
        # member 3's chunk of b at the second lead time
        if array.basename == "b" and (outer[0].start, outer[1].start) == (3, 1):
            failed.set()
            raise OSError("disk full (injected)")
        put(outer, piece)

    _around_puts(monkeypatch, failing)
    backend = ZarrBackend(str(tmp_path / "s.zarr"))
    io = OverlappedIO(backend, workers=2, max_pending=steps)
    io.add_array(coords, names)
    with pytest.raises(OSError, match="injected"):
        for step, x in enumerate(xs):
            c = OrderedDict(
                {**coords, "lead_time": coords["lead_time"][step : step + 1]}
            )
            io.write(list(x), c, names)
            if step == 1:
                assert failed.wait(30)
                deadline = time.monotonic() + 30
                while io._writer is not None and io._writer._failed_at > 2:
                    assert time.monotonic() < deadline
                    time.sleep(0.005)
        io.flush()
    io.close()
    for k, name in enumerate(names):
        stored = backend.root[name][:]
        np.testing.assert_array_equal(stored[:, 0], xs[0][k, :, 0].numpy())
        wrote = xs[1][k, :, 0].numpy()
        if name == "b":
            wrote[3] = 0.0  # the fill value: that chunk was never written
        np.testing.assert_array_equal(stored[:, 1], wrote)
        assert (stored[:, 2:] == 0.0).all()
    files = _chunk_files(tmp_path / "s.zarr", names)
    assert len(files) == 2 * 2 * 8 - 1
    assert not [f for f in files if f.split("/")[3] in ("2", "3")], files


@pytest.mark.parametrize("where", ["steps", "put"])
def test_a_finalizer_run_by_a_local_directorys_thread_loses_nothing(
    where, tmp_path, monkeypatch
):
    """An unclosed writer collected on its steps thread (running upstream's write)
    or on a put thread (writing a chunk): it cannot wait for itself there, so the
    steps thread finishes the closing after the last step; every step is stored
    and no thread is left."""
    import gc

    from earth2studio.io import ZarrBackend
    from io_helpers import threads_left

    released, collected = threading.Event(), threading.Event()

    def collect_once() -> None:
        if not collected.is_set():
            collected.set()
            assert released.wait(30)
            gc.collect()

    if where == "steps":
        write = ZarrBackend.write

        def writing(self, *args, **kwargs):
            collect_once()
            return write(self, *args, **kwargs)

        monkeypatch.setattr(ZarrBackend, "write", writing)
    else:

        def putting(put, array, outer, piece):
            collect_once()
            put(outer, piece)

        _around_puts(monkeypatch, putting)
    steps, names = 3, ["a", "b"]
    coords = _members_coords(steps)
    xs = [torch.randn(2, 8, 1, 5, 8) + 10.0 for _ in range(steps)]
    backend = ZarrBackend(str(tmp_path / "s.zarr"))
    gc.disable()  # only the writer's collect() may free the wrapper
    try:
        io = OverlappedIO(backend, workers=2, max_pending=steps)
        io.add_array(coords, names)
        io.cycle = io  # unreachable only once the reference below is dropped
        for step, x in enumerate(xs):
            c = OrderedDict(
                {**coords, "lead_time": coords["lead_time"][step : step + 1]}
            )
            io.write(list(x), c, names)
        del io
        released.set()
        assert not threads_left()  # the writer's threads all end, once it is done
    finally:
        gc.enable()
    assert collected.is_set()
    for k, name in enumerate(names):
        np.testing.assert_array_equal(
            backend.root[name][:], torch.stack(xs)[:, k, :, 0].transpose(0, 1).numpy()
        )
