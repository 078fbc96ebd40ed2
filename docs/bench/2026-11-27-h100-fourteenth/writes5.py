"""Whether ``OverlappedIO`` stores FCN's ensemble steps at the rate of Zarr's file
pattern once a local directory's whole chunks skip the event loop
(``chunks.store_local``, fourteenth session). ``writes4.py`` (same session): Zarr's
storage step from 8 threads 4.06 GB/s, with the codec called synchronously 4.18,
``OverlappedIO`` 4.28, the files by hand 6.98; 8 worker processes 3.07 (Zarr) and
5.47 (by hand): not the lever.

The same bytes as ``writes4.py`` (batch 4, 26 variables, 720 x 1440 float32, 22
steps = 9.49 GB, from a CUDA tensor), a fresh directory a row, JSON after every row:

- ``zput-8``, ``zput-16``: Zarr's ``LocalStore`` file pattern by hand, 8 or 16
  threads (the reference);
- ``ov-8``: ``OverlappedIO(ZarrBackend(disk), workers=8)`` as shipped (whole chunks
  through ``store_local``, ``FILE_THREADS`` = 8 writing);
- ``ov-8-loop``: the same with ``store_local`` turned off (each lane's event loop,
  as before this session);
- ``ov-16``: ``workers=16`` and Zarr's ``threading.max_workers`` 16.

Run from the repository root: ``python3 docs/bench/2026-11-27-h100-fourteenth/writes5.py
OUT`` (``ROWS=a,b``; ``STEPS`` even; ``H``, ``W`` small for a smoke test on a CPU).
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

STEPS, B, V = int(os.environ.get("STEPS", 22)), 4, 26
H, W = int(os.environ.get("H", 720)), int(os.environ.get("W", 1440))
BASE = Path(os.environ.get("BASE", "/tmp/writes5"))
SHAPE = (B, 1, 1, V, H, W)


def zput(d, s, b, v, a):
    """Zarr's ``LocalStore._put`` for a chunk, by hand."""
    final = d / f"v{v}" / "c" / str(b) / "0" / str(s) / "0" / "0"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_suffix(".partial")
    with open(tmp, "wb") as f:
        f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
    tmp.replace(final)


def main():
    import torch
    import zarr
    from earth2studio.io import ZarrBackend
    from earth2studio.utils.coords import split_coords

    from earth2studio_compile.io import OverlappedIO, writers

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    x = torch.randn(SHAPE, device="cuda" if cuda else "cpu")
    res: dict = {"gb": STEPS * x.numel() * 4 / 1e9, "rows": {}}
    wanted = os.environ.get("ROWS")
    host = torch.empty(SHAPE, pin_memory=cuda)
    names = [f"v{i}" for i in range(V)]
    t0 = np.array([np.datetime64("2024-01-01")])
    leads = np.array([np.timedelta64(6 * i, "h") for i in range(STEPS)])
    lat = np.linspace(90, -90, H, endpoint=False)
    lon = np.linspace(0, 360, W, endpoint=False)
    want = x[B - 1, 0, 0, 3].cpu().numpy()

    def row(name, fn):
        if wanted and name not in wanted.split(","):
            return
        shutil.rmtree(BASE, ignore_errors=True)
        os.sync()
        d = BASE / name
        d.mkdir(parents=True)
        cuda and torch.cuda.synchronize()
        t = time.perf_counter()
        fn(d)
        cuda and torch.cuda.synchronize()
        s = time.perf_counter() - t
        res["rows"][name] = {"s": s, "gbps": res["gb"] / s}
        (out / "writes5.json").write_text(json.dumps(res, indent=1))
        print(name, round(s, 3), "s", round(res["gb"] / s, 2), "GB/s", flush=True)

    def by_hand(threads):
        def run(d):
            with ThreadPoolExecutor(threads) as pool:
                for s in range(STEPS):
                    host.copy_(x)
                    h = host.numpy()
                    futures = [
                        pool.submit(zput, d, s, b, v, h[b : b + 1, :, :, v])
                        for v in range(V)
                        for b in range(B)
                    ]
                    for f in futures:
                        f.result()

        return run

    def ov(workers, local=True):
        def run(d):
            total = OrderedDict(
                ensemble=np.arange(2 * B),
                time=t0,
                lead_time=leads[: STEPS // 2],
                lat=lat,
                lon=lon,
            )
            shipped = writers.store_local
            if not local:
                writers.store_local = lambda *args: False
            try:
                with (
                    zarr.config.set({"threading.max_workers": workers}),
                    OverlappedIO(
                        ZarrBackend(
                            str(d / "s.zarr"), backend_kwargs={"overwrite": True}
                        ),
                        workers=workers,
                    ) as io,
                ):
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
            finally:
                writers.store_local = shipped
            stored = zarr.open_array(str(d / "s.zarr"), path="v3", mode="r")
            last = stored[2 * B - 1, 0, STEPS // 2 - 1]
            assert np.array_equal(last, want), "not stored"

        return run

    row("zput-8", by_hand(8))
    row("ov-8", ov(8))
    row("ov-8-loop", ov(8, local=False))
    row("zput-16", by_hand(16))
    row("ov-16", ov(16))
    row("ov-8-again", ov(8))
    shutil.rmtree(BASE, ignore_errors=True)


if __name__ == "__main__":
    main()
