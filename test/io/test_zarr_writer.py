"""The writer of a ZarrBackend: each member's chunk as it is, the group's members
asked once, a local directory's files from a pool of the writer's own."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import numpy as np
import pytest
import torch
from io_helpers import (
    own_threads,  # noqa: F401 (autouse fixture)
    step_tensors,
    zarr_writes,
)

from earth2studio_compile.io import OverlappedIO


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_a_step_of_members_is_stored_chunk_by_chunk_as_zarr_would(where, tmp_path):
    """An ensemble step holds one chunk per member: the writer hands Zarr each chunk
    as it is (Zarr filled a new chunk and copied each member in: 4 MB twice per
    member for DLWP), and the store holds what upstream's synchronous write stores."""
    from earth2studio.io import ZarrBackend
    from zarr.core.buffer.cpu import NDBuffer

    coords = OrderedDict(
        ensemble=np.arange(4),
        lead_time=np.array([0, 6], dtype="timedelta64[h]"),
        lat=np.linspace(-90, 90, 5),
        lon=np.linspace(0, 350, 8),
    )
    x = torch.randn(4, 2, 5, 8)
    x[1] = 0.0  # a member all fill value: not stored, either way

    def store(io, step):
        io.write(
            [x[:, step : step + 1]],
            {**coords, "lead_time": coords["lead_time"][step : step + 1]},
            ["t2m"],
        )

    def files(io) -> dict[str, bytes]:
        return (
            {k: v.to_bytes() for k, v in io.root.store._store_dict.items()}
            if where == "memory"
            else {
                str(f.relative_to(tmp_path / "s.zarr")): f.read_bytes()
                for f in sorted((tmp_path / "s.zarr").rglob("*"))
                if f.is_file()
            }
        )

    expected = ZarrBackend(None if where == "memory" else str(tmp_path / "s.zarr"))
    expected.add_array(coords, ["t2m"])
    for step in range(2):
        store(expected, step)
    want = files(expected)
    if where == "disk":
        import shutil

        shutil.rmtree(tmp_path / "s.zarr")
    made = []
    create = NDBuffer.create.__func__

    def counted(cls, *args, **kwargs):
        made.append(kwargs.get("shape"))
        return create(cls, *args, **kwargs)

    ours = ZarrBackend(None if where == "memory" else str(tmp_path / "s.zarr"))
    with OverlappedIO(ours, workers=2) as io:
        io.add_array(coords, ["t2m"])
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(NDBuffer, "create", classmethod(counted))
            for step in range(2):
                store(io, step)
            io.flush()
    assert made == []
    assert files(ours) == want
    assert len([k for k in want if "t2m/c/" in k]) == 2 * 3


def test_zarr_members_found_once_are_not_asked_again_each_step(monkeypatch):
    """Upstream's ``write`` asks its group for every dimension and array at every
    step, each a round trip through Zarr's synchronous API: a member found is
    answered from memory; one missing is asked each time, and still refused as
    upstream refuses it."""
    import zarr

    asked = []
    contains = zarr.Group.__contains__

    def counted(self, member):
        asked.append(member)
        return contains(self, member)

    monkeypatch.setattr(zarr.Group, "__contains__", counted)
    names = ["a", "b"]
    io, backend = zarr_writes(names, 4, workers=2)
    del asked[:]  # add_array's
    for i in range(4):
        coords = OrderedDict(lead_time=np.arange(i, i + 1), x=np.arange(4))
        io.write(step_tensors(i, 2), coords, names)
    io.flush()
    assert sorted(asked) == ["a", "b", "lead_time", "x"]  # the first step's
    assert [backend.root[n][3, 0].item() for n in names] == [30.0, 31.0]
    del asked[:]
    coords = OrderedDict(nowhere=np.arange(1), x=np.arange(4))
    io.write(step_tensors(0, 2), coords, names)
    with pytest.raises(AssertionError, match="nowhere not in zarr store"):
        io.flush()
    assert asked == ["nowhere"]
    io.close()


def test_a_local_stores_files_are_written_on_a_few_threads_of_the_writers_own(
    tmp_path, monkeypatch
):
    """Whole chunks of upstream's uncompressed arrays in a local directory are
    written by Zarr's own encode and file steps from one pool of the writer's, for
    every lane: FILE_THREADS threads (or Zarr's threading.max_workers), no event
    loop or executor hop per chunk (their Python per chunk took turns at the GIL:
    4.1-4.3 GB/s on the H100 host where the same files by hand took 7.0). A step
    Zarr might store otherwise (a chunk starting with the fill value) still goes
    through Zarr's async API on each lane's loop, with a share of the threads."""
    import zarr
    from earth2studio.io import ZarrBackend
    from zarr.core.codec_pipeline import BatchedCodecPipeline

    from earth2studio_compile.io import zarr_writer

    coords = OrderedDict(
        ensemble=np.arange(8),
        lead_time=np.arange(4).astype("timedelta64[h]"),
        lat=np.linspace(-90, 90, 5),
        lon=np.linspace(0, 350, 8),
    )
    started: list[str] = []
    start = threading.Thread.start

    def recorded(self, *args, **kwargs):
        started.append(self.name)
        return start(self, *args, **kwargs)

    encoded = []
    encode = BatchedCodecPipeline.encode

    def counted(self, *args, **kwargs):
        encoded.append(self)
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(threading.Thread, "start", recorded)
    monkeypatch.setattr(BatchedCodecPipeline, "encode", counted)
    for total, workers, most in ((None, 2, zarr_writer.FILE_THREADS), (3, 2, 3)):
        started.clear()
        encoded.clear()
        backend = ZarrBackend(str(tmp_path / f"s{total}.zarr"))
        with zarr.config.set({"threading.max_workers": total}):
            with OverlappedIO(backend, workers=workers) as io:
                io.add_array(coords, ["a", "b"])
                for step in range(4):
                    x = torch.randn(2, 8, 1, 5, 8) + 10.0  # no fill value
                    c = {**coords, "lead_time": coords["lead_time"][step : step + 1]}
                    io.write(list(x), c, ["a", "b"])
                assert encoded == []
                x[1, 3, 0, 0, 0] = 0.0  # Zarr's comparison decides for that step
                io.write(list(x), c, ["a", "b"])
        puts = [n for n in started if " put" in n]
        assert 0 < len(puts) <= most, started
        # Zarr's own loop writes add_array's metadata on its executor: after that,
        # the lanes' stores start no thread of asyncio's default executor.
        lanes = started[next(i for i, n in enumerate(started) if " lane " in n) :]
        assert not [n for n in lanes if n.startswith("asyncio_")], started
        # b's last step, through its lane's loop: 7 chunks by the pipeline's
        # encode, the one starting with the fill value by setitem.
        assert len(encoded) == 7
        np.testing.assert_array_equal(backend.root["b"][:, 3], x[1, :, 0].numpy())


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

    from earth2studio_compile.io import chunks

    coords = _members_coords(1)
    names = ["a", "b"]
    steps = [torch.randn(2, 8, 1, 5, 8) + 10.0 * (k + 1) for k in range(3)]
    steps[1][:, 0, 0, 0, 0] = 0.0
    write = chunks._write
    calls = [0]
    lock = threading.Lock()

    def slow_first(path, value):
        with lock:
            calls[0] += 1
            slow = calls[0] <= 16  # the first step's 16 chunks
        if slow:
            time.sleep(0.02)
        write(path, value)

    setitem = AsyncArray.setitem

    async def slow_setitem(self, *args, **kwargs):
        await asyncio.sleep(0.05)
        return await setitem(self, *args, **kwargs)

    monkeypatch.setattr(chunks, "_write", slow_first)
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

    from earth2studio_compile.io import chunks

    steps, names = 4, ["a", "b"]
    coords = _members_coords(steps)
    xs = [torch.randn(2, 8, 1, 5, 8) + 10.0 for _ in range(steps)]
    write = chunks._write
    failed = threading.Event()

    def failing(path, value):
        if "/b/c/3/1/" in path:  # member 3's chunk of b at the second lead time
            failed.set()
            raise OSError("disk full (injected)")
        write(path, value)

    monkeypatch.setattr(chunks, "_write", failing)
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

    from earth2studio_compile.io import chunks

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
        put = chunks._write

        def putting(path, value):
            collect_once()
            put(path, value)

        monkeypatch.setattr(chunks, "_write", putting)
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
