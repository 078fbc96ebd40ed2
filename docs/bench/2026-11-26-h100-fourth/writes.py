"""Where the FCN ensemble's disk writes go: the same bytes (batch 4, 26 variables,
720 x 1440, float32, 22 steps = 9.49 GB) stored from CUDA tensors five ways, one
process, a fresh directory each, JSON after every row:

- ``save``: numpy.save from 8 threads, one file per variable per member per step,
  from one reused host buffer (no Zarr);
- ``put``: the same files written with ``open(..., "wb").write(memoryview)`` from
  8 threads (``put-<n>``: n threads); ``zput-<n>``: as Zarr's ``LocalStore`` does,
  a directory per chunk key, a temporary file, a rename;
- ``overlapped-8`` / ``overlapped-16``: ``OverlappedIO(ZarrBackend(disk))`` with 8 /
  16 workers, the workflow's call pattern (``split_coords`` views of one tensor).

Run from the repository root: ``python3 docs/bench/2026-11-26-h100-fourth/writes.py OUT``
(``ONLY=<row>`` runs one row; ``STEPS`` sets the steps; ``EXECUTORS=1``: the
overlapped rows with k threads in each lane loop's default executor).
"""

import json
import os
import shutil
import sys
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
STEPS, B, V, H, W = int(os.environ.get("STEPS", 22)), 4, 26, 720, 1440
cuda = torch.cuda.is_available()
dev = torch.device("cuda" if cuda else "cpu")
x = torch.randn(B, 1, 1, V, H, W, device=dev)
res: dict = {"gb": STEPS * x.numel() * 4 / 1e9}
for f in (
    "/proc/sys/vm/dirty_ratio",
    "/proc/sys/vm/dirty_background_ratio",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/proc/cmdline",
):
    try:
        res[f] = Path(f).read_text().strip()
    except OSError as err:
        res[f] = repr(err)
base = Path("/tmp/writes")


def fresh(name: str) -> Path:
    shutil.rmtree(base, ignore_errors=True)
    os.sync()
    d = base / name
    d.mkdir(parents=True)
    return d


def row(name, fn):
    if os.environ.get("ONLY", name) != name:
        return
    d = fresh(name)
    cuda and torch.cuda.synchronize()
    t = time.perf_counter()
    fn(d)
    cuda and torch.cuda.synchronize()
    res[name] = time.perf_counter() - t
    res[name + "_gbps"] = res["gb"] / res[name]
    (out / "writes.json").write_text(json.dumps(res, indent=1))
    print(
        name,
        round(res[name], 3),
        "s",
        round(res[name + "_gbps"], 2),
        "GB/s",
        flush=True,
    )


host = torch.empty(x.shape, pin_memory=cuda)
host.fill_(0)


def files(d, store, threads=8):
    with ThreadPoolExecutor(threads) as pool:
        for s in range(STEPS):
            host.copy_(x)
            h = host.numpy()
            fs = [
                pool.submit(store, d / f"f-{s}-{v}-{b}", h[b, 0, 0, v])
                for v in range(V)
                for b in range(B)
            ]
            for f in fs:
                f.result()


def put(path, a):
    with open(path, "wb") as f:
        f.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def zput(path, a):
    """Zarr's LocalStore pattern: a directory per chunk key, a temporary file, a
    rename (chunk keys c/<member>/0/<step>/0/0 as the workflow's arrays have)."""
    step, v, b = path.name.split("-")[1:]
    final = path.parent / f"v{v}" / "c" / b / "0" / step / "0" / "0"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_suffix(".partial")
    put(tmp, a)
    tmp.replace(final)


row("save", lambda d: files(d, lambda p, a: np.save(str(p) + ".npy", a)))
row("put", lambda d: files(d, put))
for n in (8, 32):
    row(f"put-{n}", lambda d, n=n: files(d, put, n))
    row(f"zput-{n}", lambda d, n=n: files(d, zput, n))

from earth2studio.io import ZarrBackend  # noqa: E402
from earth2studio.utils.coords import split_coords  # noqa: E402

from earth2studio_compile.io import OverlappedIO  # noqa: E402

names = [f"v{i}" for i in range(V)]
t0 = np.array([np.datetime64("2024-01-01")])
leads = np.array([np.timedelta64(6 * i, "h") for i in range(STEPS // 2)])
lat = np.linspace(90, -90, H, endpoint=False)
lon = np.linspace(0, 360, W, endpoint=False)
total = OrderedDict(
    ensemble=np.arange(2 * B), time=t0, lead_time=leads, lat=lat, lon=lon
)


def workflow_writes(io):
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


def overlapped(workers):
    def run(d):
        with OverlappedIO(
            ZarrBackend(str(d / "s.zarr"), backend_kwargs={"overwrite": True}),
            workers=workers,
        ) as io:
            workflow_writes(io)

    return run


if os.environ.get("EXECUTORS"):
    # Each lane's event loop with a default executor of k threads (Zarr's local
    # store writes each chunk through it): fewer threads taking turns at the GIL.
    import asyncio

    threads = {"k": None}

    class Runner(asyncio.Runner):
        def run(self, coro, **kwargs):
            loop = self.get_loop()
            if threads["k"] and not getattr(loop, "_k", None):
                loop.set_default_executor(ThreadPoolExecutor(threads["k"]))
                loop._k = threads["k"]
            return super().run(coro, **kwargs)

    asyncio.Runner = Runner
    for workers, k in ((8, None), (8, 1), (8, 2), (8, 4), (4, 2), (16, 1), (4, 4)):
        threads["k"] = k
        row(f"overlapped-{workers}-k{k}", overlapped(workers))
    sys.exit()

row("overlapped-8", overlapped(8))
row("overlapped-16", overlapped(16))
row("overlapped-8-again", overlapped(8))
row("overlapped-4", overlapped(4))
row("overlapped-2", overlapped(2))
row("zput-8-again", lambda d: files(d, zput, 8))
