"""Whether Zarr's storage step reaches Zarr's file pattern once its Python per chunk
is cut or taken out of the writing process's GIL (``writes3.py``, thirteenth
session: the step from 8 plain threads stored 4.82 GB/s, its file pattern by hand
6.37, ``OverlappedIO`` 4.96). The same bytes as ``writes3.py`` (FCN's ensemble
steps: batch 4, 26 variables, 720 x 1440 float32, 22 steps = 9.49 GB, from a CUDA
tensor), stored as Zarr arrays with upstream's chunks, a fresh directory a row, one
process, JSON after every row; each Zarr row checks a stored chunk:

- ``zput-8``: Zarr's ``LocalStore`` file pattern by hand, 8 threads (the reference);
- ``zset-8-inline``: the library's storage step for a whole chunk
  (``chunks._set_chunk``: the codec pipeline's async encode, the store's ``set``),
  8 threads, each with an event loop whose executor writes inline;
- ``zlean-8-inline``: the same with the array's bytes codec called synchronously
  (the pipeline of upstream's arrays is that codec alone), not the pipeline's async
  batch;
- ``zsync-8``: Zarr's synchronous API, ``array[selection] = chunk``, 8 threads;
- ``proc-zarr-8``: 8 worker processes, each ``array[selection] = chunk`` (Zarr's
  synchronous API) for its share of a step's chunks, read from a host buffer the
  processes share (a file mapped in memory, pinned for the copy where CUDA lets);
- ``proc-put-8``: the same processes writing Zarr's file pattern by hand;
- ``ov-8``: ``OverlappedIO(ZarrBackend(disk))`` as shipped.

If ``proc-zarr-8`` reaches ``zput-8`` where the threads do not, the loss is the GIL
that the writing threads share: a process writer is the lever. If ``zlean-8-inline``
closes most of it, the pipeline's async encode is.

Run from the repository root: ``python3 docs/bench/2026-11-27-h100-thirteenth/writes4.py
OUT`` (``ROWS=a,b`` runs those rows; ``STEPS``, even: the steps; ``H``, ``W``: the
grid, small for a smoke test on a CPU).
"""

import asyncio
import json
import multiprocessing
import os
import shutil
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

STEPS, B, V = int(os.environ.get("STEPS", 22)), 4, 26
H, W = int(os.environ.get("H", 720)), int(os.environ.get("W", 1440))
BASE = Path(os.environ.get("BASE", "/tmp/writes4"))
SHAPE = (B, 1, 1, V, H, W)


def zput(d, s, b, v, a):
    """Zarr's ``LocalStore._put`` for a chunk, by hand."""
    final = d / f"v{v}" / "c" / str(b) / "0" / str(s) / "0" / "0"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_suffix(".partial")
    with open(tmp, "wb") as f:
        f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
    tmp.replace(final)


# Worker processes: a host buffer mapped from a file, the arrays opened once.
_worker: dict = {}


def _init(buffer, store):
    import zarr

    _worker["host"] = np.memmap(buffer, dtype="float32", mode="r", shape=SHAPE)
    _worker["store"] = store
    if store is not None:
        _worker["arrays"] = [
            zarr.open_array(
                f"{store}/v{v}", mode="r+", config={"write_empty_chunks": True}
            )
            for v in range(V)
        ]


def _job(kind, d, s, pairs):
    host = _worker["host"]
    for b, v in pairs:
        piece = host[b : b + 1, :, :, v]
        if kind == "put":
            zput(Path(d), s, b, v, piece)
        else:
            _worker["arrays"][v][b : b + 1, 0:1, s : s + 1] = piece
    return len(pairs)


def main():
    import torch

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    x = torch.randn(SHAPE, device="cuda" if cuda else "cpu")
    res: dict = {"gb": STEPS * x.numel() * 4 / 1e9, "rows": {}}
    wanted = os.environ.get("ROWS")
    host = torch.empty(SHAPE, pin_memory=cuda)
    host.fill_(0)

    def row(name, fn, check=None):
        if wanted and name not in wanted.split(","):
            return
        shutil.rmtree(BASE / "rows", ignore_errors=True)
        os.sync()
        d = BASE / "rows" / name
        d.mkdir(parents=True)
        cuda and torch.cuda.synchronize()
        t = time.perf_counter()
        timed = fn(d)  # a row that starts workers times its own steps
        cuda and torch.cuda.synchronize()
        s = time.perf_counter() - t if timed is None else timed
        res["rows"][name] = {"s": s, "gbps": res["gb"] / s}
        if check is not None:
            check(d)
            res["rows"][name]["checked"] = True
        (out / "writes4.json").write_text(json.dumps(res, indent=1))
        print(name, round(s, 3), "s", round(res["gb"] / s, 2), "GB/s", flush=True)

    def steps(pool, job):
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

    row("zput-8", lambda d: steps(ThreadPoolExecutor(8), lambda *a: zput(d, *a)))

    import zarr
    from earth2studio.io import ZarrBackend

    from earth2studio_compile.io import OverlappedIO
    from earth2studio_compile.io.chunks import _set_chunk

    names = [f"v{i}" for i in range(V)]
    t0 = np.array([np.datetime64("2024-01-01")])
    leads = np.array([np.timedelta64(6 * i, "h") for i in range(STEPS)])
    lat = np.linspace(90, -90, H, endpoint=False)
    lon = np.linspace(0, 360, W, endpoint=False)
    want = x[B - 1, 0, 0, 3].cpu().numpy()

    def store(d):
        io = ZarrBackend(str(d / "s.zarr"), backend_kwargs={"overwrite": True})
        io.add_array(
            OrderedDict(
                ensemble=np.arange(B), time=t0, lead_time=leads, lat=lat, lon=lon
            ),
            names,
        )
        return io

    def check(d):
        stored = zarr.open_array(str(d / "s.zarr"), path="v3", mode="r")
        assert np.array_equal(stored[B - 1, 0, STEPS - 1], want), "not stored"

    class Inline(ThreadPoolExecutor):
        """Runs each call at once on the calling thread (an event loop's default
        executor must be a ``ThreadPoolExecutor``)."""

        def submit(self, fn, /, *args, **kwargs):
            f: Future = Future()
            try:
                f.set_result(fn(*args, **kwargs))
            except BaseException as error:  # noqa: BLE001
                f.set_exception(error)
            return f

    async def lean(array, outer, piece):
        """``_set_chunk`` with the bytes codec called synchronously."""
        from zarr.buffer import default_buffer_prototype

        metadata = array.metadata
        coords = tuple(s.start // c for s, c in zip(outer, array.chunks))
        prototype = default_buffer_prototype()
        spec = metadata.get_chunk_spec(coords, array.config, prototype)
        chunk = prototype.nd_buffer.from_ndarray_like(piece)
        encoded = array.codec_pipeline.array_bytes_codec._encode_sync(chunk, spec)
        await (array.store_path / metadata.encode_chunk_key(coords)).set(encoded)

    def on_loops(setter):
        def run(d):
            root = store(d).root
            local = threading.local()

            def job(s, b, v, a):
                if not hasattr(local, "runner"):

                    def make():
                        loop = asyncio.new_event_loop()
                        loop.set_default_executor(Inline())
                        return loop

                    local.runner, local.arrays = asyncio.Runner(loop_factory=make), {}
                runner = local.runner
                if v not in local.arrays:
                    array = runner.run(
                        zarr.api.asynchronous.open_array(
                            store=root.store, path=names[v], mode="r+"
                        )
                    )
                    local.arrays[v] = array.with_config({"write_empty_chunks": True})
                outer = (slice(b, b + 1), slice(0, 1), slice(s, s + 1))
                outer += (slice(0, H), slice(0, W))
                runner.run(setter(local.arrays[v], outer, a))

            with ThreadPoolExecutor(8) as pool:
                steps(pool, job)

        return run

    row("zset-8-inline", on_loops(_set_chunk), check)
    row("zlean-8-inline", on_loops(lean), check)

    def zsync(d):
        store(d)
        arrays = [
            zarr.open_array(
                str(d / "s.zarr"),
                path=n,
                mode="r+",
                config={"write_empty_chunks": True},
            )
            for n in names
        ]

        def job(s, b, v, a):
            arrays[v][b : b + 1, 0:1, s : s + 1] = a

        with ThreadPoolExecutor(8) as pool:
            steps(pool, job)

    row("zsync-8", zsync, check)

    # The processes' host buffer: a file mapped in memory (/dev/shm is often
    # small in a container), pinned for the device's copy where CUDA lets.
    buffer = BASE / "host.bin"
    BASE.mkdir(parents=True, exist_ok=True)
    mapped = np.memmap(buffer, dtype="float32", mode="w+", shape=SHAPE)
    shared = torch.from_numpy(mapped)
    res["pinned_shared"] = False
    if cuda:
        flags = 0  # cudaHostRegisterDefault
        rc = torch.cuda.cudart().cudaHostRegister(
            shared.data_ptr(), shared.numel() * 4, flags
        )
        res["pinned_shared"] = int(rc) == 0
    spawn = multiprocessing.get_context("spawn")
    split = [[(b, v) for v in range(V) for b in range(B)][i::8] for i in range(8)]

    def in_processes(kind):
        def run(d):
            storage = str(d / "s.zarr") if kind == "zarr" else None
            if storage is not None:
                store(d)
            with ProcessPoolExecutor(
                8, mp_context=spawn, initializer=_init, initargs=(str(buffer), storage)
            ) as pool:
                # Started (and their imports done) before the clock: the processes
                # of a writer would live as long as its workflow.
                list(pool.map(time.sleep, [0.5] * 8))
                start = time.perf_counter()
                for s in range(STEPS):
                    shared.copy_(x)
                    futures = [pool.submit(_job, kind, str(d), s, p) for p in split]
                    for f in futures:
                        f.result()
                cuda and torch.cuda.synchronize()
                return time.perf_counter() - start

        return run

    row("proc-zarr-8", in_processes("zarr"), check)
    row("proc-put-8", in_processes("put"))

    def ov(d):
        total = OrderedDict(
            ensemble=np.arange(2 * B),
            time=t0,
            lead_time=leads[: STEPS // 2],
            lat=lat,
            lon=lon,
        )
        from earth2studio.utils.coords import split_coords

        with OverlappedIO(
            ZarrBackend(str(d / "s.zarr"), backend_kwargs={"overwrite": True}),
            workers=8,
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
        stored = zarr.open_array(str(d / "s.zarr"), path="v3", mode="r")
        assert np.array_equal(stored[2 * B - 1, 0, STEPS // 2 - 1], want), "not stored"

    row("ov-8", ov)
    row("zput-8-again", lambda d: steps(ThreadPoolExecutor(8), lambda *a: zput(d, *a)))
    shutil.rmtree(BASE, ignore_errors=True)


if __name__ == "__main__":
    main()
