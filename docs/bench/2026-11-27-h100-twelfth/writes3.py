"""Where ``OverlappedIO(ZarrBackend)`` loses against Zarr's own file pattern on local
disk (``writes2.py``: 4.1-4.8 GB/s against 5.1-7.4 from 8 threads). The same bytes
(FCN's ensemble steps: batch 4, 26 variables, 720 x 1440 float32, 22 steps = 9.49 GB,
from a CUDA tensor) stored as Zarr arrays (upstream's chunks: a member, a variable, a
lead time each), a fresh directory a row, in one process, JSON after every row:

- ``zput-8``: Zarr's ``LocalStore`` file pattern by hand (a directory per key part, a
  temporary file, a rename), 8 threads, a step at a time (the reference);
- ``zset-8-inline``: Zarr's own storage step for a whole chunk
  (:func:`earth2studio_compile.io.chunks._set_chunk`: the array's codec pipeline,
  then its store's ``set``) from 8 threads, each with an event loop of its own whose
  executor runs the store's file write inline (no thread hop);
- ``zset-8-hop``: the same, the file write on the loop's executor (a thread of a pool
  of 8 shared by the loops, as Zarr's ``to_thread`` does);
- ``ov-8``: ``OverlappedIO(ZarrBackend(disk))`` as shipped (8 lanes);
- ``ov-chunk-pool-8``: the same with a prototype writer (:class:`ChunkPool`, here
  only): the lanes hand each whole chunk to one pool of 8 chunk workers, each doing
  ``zset-8-inline``'s storage step.

If ``zset-8-inline`` reaches ``zput-8``, the loss is in how OverlappedIO schedules its
chunks (lanes, one array at a time each); if not, in Zarr's storage step itself.

Run from the repository root: ``python3 docs/bench/2026-11-27-h100-twelfth/writes3.py
OUT`` (``ROWS=a,b`` runs those rows; ``STEPS``, even: the steps; ``H``, ``W``: the
grid, small for a smoke test on a CPU).
"""

import asyncio
import json
import os
import shutil
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
STEPS, B, V = int(os.environ.get("STEPS", 22)), 4, 26
H, W = int(os.environ.get("H", 720)), int(os.environ.get("W", 1440))
cuda = torch.cuda.is_available()
x = torch.randn(B, 1, 1, V, H, W, device="cuda" if cuda else "cpu")
res: dict = {"gb": STEPS * x.numel() * 4 / 1e9, "rows": {}}
base = Path(os.environ.get("BASE", "/tmp/writes3"))
wanted = os.environ.get("ROWS")
host = torch.empty(x.shape, pin_memory=cuda)
host.fill_(0)


def row(name, fn):
    if wanted and name not in wanted.split(","):
        return
    shutil.rmtree(base, ignore_errors=True)
    os.sync()
    d = base / name
    d.mkdir(parents=True)
    cuda and torch.cuda.synchronize()
    t = time.perf_counter()
    fn(d)
    cuda and torch.cuda.synchronize()
    s = time.perf_counter() - t
    res["rows"][name] = {"s": s, "gbps": res["gb"] / s}
    (out / "writes3.json").write_text(json.dumps(res, indent=1))
    print(name, round(s, 3), "s", round(res["gb"] / s, 2), "GB/s", flush=True)


def steps(pool, job):
    """Each step copied to the host, then ``job(step, member, variable, chunk)`` for
    each of its chunks on ``pool``, the step's chunks stored before the next copy."""
    for s in range(STEPS):
        host.copy_(x)
        h = host.numpy()
        futures = [
            pool.submit(job, s, b, v, h[b : b + 1, :, :, v])
            for v in range(V)
            for b in range(B)
        ]
        for f in futures:
            f.result()


def zput(d, s, b, v, a):
    final = d / f"v{v}" / "c" / str(b) / "0" / str(s) / "0" / "0"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_suffix(".partial")
    with open(tmp, "wb") as f:
        f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
    tmp.replace(final)


row("zput-8", lambda d: steps(ThreadPoolExecutor(8), lambda *a: zput(d, *a)))

import zarr  # noqa: E402
from earth2studio.io import ZarrBackend  # noqa: E402
from earth2studio.utils.coords import split_coords  # noqa: E402

from earth2studio_compile.io import OverlappedIO, writers  # noqa: E402
from earth2studio_compile.io.chunks import _set_chunk, chunk_pieces  # noqa: E402

names = [f"v{i}" for i in range(V)]
t0 = np.array([np.datetime64("2024-01-01")])
leads = np.array([np.timedelta64(6 * i, "h") for i in range(STEPS)])
lat = np.linspace(90, -90, H, endpoint=False)
lon = np.linspace(0, 360, W, endpoint=False)


class Inline(ThreadPoolExecutor):
    """An executor that runs each call at once, on the calling thread (a
    ``ThreadPoolExecutor`` by type only: an event loop's default executor must be
    one)."""

    def submit(self, fn, /, *args, **kwargs):
        f: Future = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001
            f.set_exception(error)
        return f


def zset(executor):
    def run(d):
        io = ZarrBackend(str(d / "s.zarr"), backend_kwargs={"overwrite": True})
        io.add_array(
            OrderedDict(
                ensemble=np.arange(B), time=t0, lead_time=leads, lat=lat, lon=lon
            ),
            names,
        )
        local = threading.local()
        root = io.root

        def job(s, b, v, a):
            if not hasattr(local, "runner"):

                def make():
                    loop = asyncio.new_event_loop()
                    loop.set_default_executor(executor)
                    return loop

                local.runner = asyncio.Runner(loop_factory=make)
                local.arrays = {}
            runner = local.runner
            if v not in local.arrays:
                array = runner.run(
                    zarr.api.asynchronous.open_array(
                        store=root.store, path=names[v], mode="r+"
                    )
                )
                local.arrays[v] = array.with_config({"write_empty_chunks": True})
            outer = (
                slice(b, b + 1),
                slice(0, 1),
                slice(s, s + 1),
                slice(0, H),
                slice(0, W),
            )
            runner.run(_set_chunk(local.arrays[v], outer, a))

        with ThreadPoolExecutor(8) as pool:
            steps(pool, job)

    return run


row("zset-8-inline", zset(Inline()))
row("zset-8-hop", zset(ThreadPoolExecutor(8)))


def ov(d):
    total = OrderedDict(
        ensemble=np.arange(2 * B),
        time=t0,
        lead_time=leads[: STEPS // 2],
        lat=lat,
        lon=lon,
    )
    with OverlappedIO(
        ZarrBackend(str(d / "s.zarr"), backend_kwargs={"overwrite": True}), workers=8
    ) as io:
        io.add_array(total, names)
        for s in range(STEPS):
            batch, lead = divmod(s, STEPS // 2)
            c = OrderedDict(
                ensemble=np.arange(batch * B, (batch + 1) * B),
                time=t0,
                lead_time=leads[lead : lead + 1],
                variable=np.array(names),
                lat=lat,
                lon=lon,
            )
            io.write(*split_coords(x, c, "variable"))
    # What the store holds: the last batch's member and lead time of one variable.
    stored = zarr.open_array(str(d / "s.zarr"), path="v3", mode="r")
    want = x[B - 1, 0, 0, 3].cpu().numpy()
    assert np.array_equal(stored[2 * B - 1, 0, STEPS // 2 - 1], want), "not stored"


row("ov-8", ov)


class ChunkPool(writers.ZarrWriter):
    """A prototype, not the library's: OverlappedIO's lanes hand each whole chunk to
    one pool of 8 chunk workers, each running Zarr's storage step for it on an event
    loop of its own with the file write inline (``zset-8-inline``'s way), the lane
    waiting for its array's chunks (so each array's writes keep their order). Only
    for whole chunks of the array's dtype that are not all fill value (this probe's
    random steps); anything else raises."""

    def __init__(self, io, workers):
        super().__init__(io, workers)
        self._chunk_pool = ThreadPoolExecutor(8, thread_name_prefix="chunk worker")
        self._local = threading.local()
        self._layout = {}  # name: (shape, chunks, dtype), read once per array

    def _put(self, name, outer, piece):
        local = self._local
        if not hasattr(local, "runner"):

            def make():
                loop = asyncio.new_event_loop()
                loop.set_default_executor(Inline())
                return loop

            local.runner, local.arrays = asyncio.Runner(loop_factory=make), {}
        if name not in local.arrays:
            root = self.io.root
            array = local.runner.run(
                zarr.api.asynchronous.open_array(store=root.store, path=name, mode="r+")
            )
            local.arrays[name] = array.with_config({"write_empty_chunks": True})
        local.runner.run(_set_chunk(local.arrays[name], outer, piece))

    def _store(self, collector, name):
        selection, data = collector.pop(name)
        if name not in self._layout:  # Zarr's synchronous API: not once per step
            array = self.io.root[name]
            self._layout[name] = (array.shape, array.chunks, array.dtype)
        shape, chunks, dtype = self._layout[name]
        pieces = chunk_pieces(selection, shape, chunks, data.shape)
        if pieces is None or data.dtype != dtype:
            raise NotImplementedError("the probe writes whole chunks of float32")
        futures = [
            self._chunk_pool.submit(self._put, name, outer, data[inner])
            for outer, inner in pieces
        ]
        for f in futures:
            f.result()

    def close(self, then=None):
        pool = self._chunk_pool

        def finish():
            pool.shutdown()
            if then is not None:
                then()

        super().close(finish)


def ov_chunk_pool(d):
    import earth2studio_compile.io.overlap as overlap

    shipped = overlap.parallel_writer
    overlap.parallel_writer = lambda io: (ChunkPool, "")
    try:
        ov(d)
    finally:
        overlap.parallel_writer = shipped


row("ov-chunk-pool-8", ov_chunk_pool)
row("ov-8-again", ov)
row("zput-8-again", lambda d: steps(ThreadPoolExecutor(8), lambda *a: zput(d, *a)))
shutil.rmtree(base, ignore_errors=True)
