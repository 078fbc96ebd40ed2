"""Why ``OverlappedIO(ZarrBackend)`` stores FCN's ensemble steps on local disk at about
half the rate of Zarr's own file pattern from as many threads (the fourth session's
``writes.py``: 5 GB/s against 10). The same bytes (batch 4, 26 variables, 720 x 1440,
float32, 22 steps = 9.49 GB, from a CUDA tensor) in one process, a fresh directory
each, JSON after every row:

- ``zput-8``: Zarr's ``LocalStore`` pattern (a directory per chunk key, a temporary
  file, a rename) from 8 threads, a step at a time (the reference);
- ``ov-w<W>-f<F>-p<P>``: ``OverlappedIO(ZarrBackend(disk), workers=W,
  max_pending=P)`` with Zarr's ``threading.max_workers`` = F (the file threads, shared
  out over the lanes), the workflow's call pattern (``split_coords`` views).

Run from the repository root: ``python3 docs/bench/2026-11-27-h100-twelfth/writes2.py
OUT`` (``ONLY=<row>`` runs one row; ``ROWS=a,b`` several; ``SET=shared`` the
rows run after the lanes came to share one pool of file threads).
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
res: dict = {"gb": STEPS * x.numel() * 4 / 1e9, "rows": {}}
base = Path(os.environ.get("BASE", "/tmp/writes2"))
wanted = os.environ.get("ROWS") or os.environ.get("ONLY")
wanted_rows = set(wanted.split(",")) if wanted else None


def fresh(name: str) -> Path:
    shutil.rmtree(base, ignore_errors=True)
    os.sync()
    d = base / name
    d.mkdir(parents=True)
    return d


def row(name, fn):
    if wanted_rows is not None and name not in wanted_rows:
        return
    d = fresh(name)
    cuda and torch.cuda.synchronize()
    t = time.perf_counter()
    extra = fn(d) or {}
    cuda and torch.cuda.synchronize()
    s = time.perf_counter() - t
    res["rows"][name] = {"s": s, "gbps": res["gb"] / s, **extra}
    (out / "writes2.json").write_text(json.dumps(res, indent=1))
    print(name, round(s, 3), "s", round(res["gb"] / s, 2), "GB/s", extra, flush=True)


host = torch.empty(x.shape, pin_memory=cuda)
host.fill_(0)


def put(path, a):
    with open(path, "wb") as f:
        f.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def zput(path, a):
    step, v, b = path.name.split("-")[1:]
    final = path.parent / f"v{v}" / "c" / b / "0" / step / "0" / "0"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_suffix(".partial")
    put(tmp, a)
    tmp.replace(final)


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


row("zput-8", lambda d: files(d, zput, 8))

import zarr  # noqa: E402
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


def overlapped(workers, files_, pending):
    def run(d):
        with zarr.config.set({"threading.max_workers": files_}):
            io = OverlappedIO(
                ZarrBackend(str(d / "s.zarr"), backend_kwargs={"overwrite": True}),
                workers=workers,
                max_pending=pending,
            )
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
            io.close()
            return {"blocked_s": getattr(io, "blocked_s", None)}

    return run


ROW_SET = os.environ.get("SET", "lanes")
CONFIGS = {
    # call 1, at 9d4316c: a share of the file threads per lane
    "lanes": (
        (8, 8, 2),
        (8, 16, 2),
        (13, 13, 2),
        (26, 26, 2),
        (8, 8, 4),
        (13, 13, 4),
        (26, 8, 2),
        (8, 8, 2),
    ),
    # SET=shared, after: one pool of F file threads for every lane
    "shared": ((8, 8, 2), (8, 16, 2), (8, 8, 4), (13, 8, 2), (8, 8, 2)),
}
for w, f, p in CONFIGS[ROW_SET]:
    name = f"ov-w{w}-f{f}-p{p}"
    if name in res["rows"]:
        name += "-again"
    row(name, overlapped(w, f, p))
row("zput-8-again", lambda d: files(d, zput, 8))
shutil.rmtree(base, ignore_errors=True)
