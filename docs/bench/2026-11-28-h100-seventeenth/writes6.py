"""Where a chunk's write goes on the GPU host: its directories, its temporary file
and rename, and ``OverlappedIO``'s own work, each taken out in turn.

``writes5.py`` (fourteenth session, again in the seventeenth at b56e9b4): Zarr's
file pattern by hand 6.76 GB/s, ``OverlappedIO`` 4.6-5.2; py-spy found its put
threads making directories (two new ones per chunk in Earth2Studio's stores) for
more than half as long as they wrote. The seventeenth session made them ahead, on a
thread, from ``add_array`` on (``io.directories.Ahead``). The same bytes as
``writes5.py`` (batch 4, 26 variables, 720 x 1440 float32, 22 steps = 9.49 GB, from
a CUDA tensor), a fresh directory a row, JSON after every row:

- ``zput-8``: Zarr's ``LocalStore`` file pattern by hand, 8 threads (as writes5);
- ``zput-8-premade``: the same, every chunk directory made before the clock;
- ``zput-8-direct``: premade, and each chunk written in place (no temporary
  file and rename: what the chunks floor does);
- ``ov-noahead``: ``OverlappedIO(ZarrBackend(disk), workers=8)`` with nothing made
  ahead (as b56e9b4);
- ``ov``: as shipped, the directories made ahead from ``add_array``, the clock
  from before it (as writes5's ``ov-8``);
- ``ov-after``: as shipped, the clock started once the directories made ahead are
  all there (the writes alone, as a workflow's first step would leave them).

Run from the repository root: ``python3 docs/bench/2026-11-28-h100-seventeenth/
writes6.py OUT`` (``ROWS=a,b``; ``STEPS`` even; ``H``, ``W`` small on a CPU).
"""

import json
import os
import shutil
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

STEPS, B, V = int(os.environ.get("STEPS", 22)), 4, 26
H, W = int(os.environ.get("H", 720)), int(os.environ.get("W", 1440))
BASE = Path(os.environ.get("BASE", "/tmp/writes6"))
SHAPE = (B, 1, 1, V, H, W)


def chunk_path(d, s, b, v):
    return d / f"v{v}" / "c" / str(b) / "0" / str(s) / "0" / "0"


def zput(d, s, b, v, a, atomic=True, mkdir=True):
    """Zarr's ``LocalStore._put`` for a chunk, by hand."""
    final = chunk_path(d, s, b, v)
    if mkdir:
        final.parent.mkdir(parents=True, exist_ok=True)
    target = final.with_suffix(".partial") if atomic else final
    with open(target, "wb") as f:
        f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
    if atomic:
        target.replace(final)


def main():
    import torch
    import zarr
    from earth2studio.io import ZarrBackend
    from earth2studio.utils.coords import split_coords

    from earth2studio_compile.io import OverlappedIO, zarr_writer

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
        s = fn(d)
        res["rows"][name] = {"s": s, "gbps": res["gb"] / s}
        (out / "writes6.json").write_text(json.dumps(res, indent=1))
        print(name, round(s, 3), "s", round(res["gb"] / s, 2), "GB/s", flush=True)

    def timed(fn):
        cuda and torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        cuda and torch.cuda.synchronize()
        return time.perf_counter() - start

    def by_hand(premade=False, atomic=True):
        def run(d):
            if premade:
                for s in range(STEPS):
                    for b in range(B):
                        for v in range(V):
                            chunk_path(d, s, b, v).parent.mkdir(parents=True)
                os.sync()

            def steps():
                with ThreadPoolExecutor(8) as pool:
                    for s in range(STEPS):
                        host.copy_(x)
                        h = host.numpy()
                        futures = [
                            pool.submit(
                                zput,
                                d,
                                s,
                                b,
                                v,
                                h[b : b + 1, :, :, v],
                                atomic,
                                not premade,
                            )
                            for v in range(V)
                            for b in range(B)
                        ]
                        for f in futures:
                            f.result()

            return timed(steps)

        return run

    def ov(ahead=True, after=False):
        def run(d):
            total = OrderedDict(
                ensemble=np.arange(2 * B),
                time=t0,
                lead_time=leads[: STEPS // 2],
                lat=lat,
                lon=lon,
            )
            shipped = zarr_writer.directories_ahead
            done = threading.Event()

            def watched(arrays, stop):
                try:
                    return shipped(arrays, stop) if ahead else 0
                finally:
                    done.set()

            zarr_writer.directories_ahead = watched
            try:
                with zarr.config.set({"threading.max_workers": 8}):
                    io = OverlappedIO(
                        ZarrBackend(
                            str(d / "s.zarr"), backend_kwargs={"overwrite": True}
                        ),
                        workers=8,
                    )

                    def add():
                        io.add_array(total, names)

                    def steps():
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

                    if after:
                        add()
                        assert done.wait(120), "directories not made"
                        seconds = timed(steps)
                    else:
                        seconds = timed(lambda: (add(), steps()))
            finally:
                zarr_writer.directories_ahead = shipped
            stored = zarr.open_array(str(d / "s.zarr"), path="v3", mode="r")
            last = stored[2 * B - 1, 0, STEPS // 2 - 1]
            assert np.array_equal(last, want), "not stored"
            return seconds

        return run

    row("zput-8", by_hand())
    row("zput-8-premade", by_hand(premade=True))
    row("zput-8-direct", by_hand(premade=True, atomic=False))
    row("ov-noahead", ov(ahead=False))
    row("ov", ov())
    row("ov-after", ov(after=True))
    row("ov-noahead-again", ov(ahead=False))
    row("ov-again", ov())
    shutil.rmtree(BASE, ignore_errors=True)


if __name__ == "__main__":
    main()
