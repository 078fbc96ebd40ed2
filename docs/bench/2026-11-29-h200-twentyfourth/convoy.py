"""Do ``OverlappedIO``'s put threads stall while the workflow's thread runs Python?

Issue 34, FCN's ensemble on disk: after its first step the compiled call runs at
about 1.44 times its compute floor, its writes moving ~5 GB/s where the chunk floor
(the same files from 8 threads, nothing else running) moves ~12. DLWP's writes
reach their floor. FCN's workflow thread spends ~27 ms of CPU a step in Python
(the model's wrapper, coordinates), DLWP's ~7. Each put thread lets the GIL go
four times a chunk (open, write, close, rename) and must take it back after each:
while another thread runs Python it gets it back only when that thread is made to
drop it, at the interpreter's switch interval (5 ms by default). The hypothesis:
the writers progress mostly while the workflow's thread waits, so a step costs
its Python plus its writes instead of the larger of the two.

Each row writes ``STEPS`` steps of ``V`` variables x ``B`` members of ``H`` x
``W`` float32 (CPU tensors) through ``for_compiled_call(ZarrBackend(path))``, as
``compile=True`` wraps the backend, and before each ``write`` keeps the loop's
thread busy for ``MS`` ms in one of three ways:

- ``sleep``: ``time.sleep`` (neither a core nor the GIL);
- ``hash``: ``hashlib.sha256`` over a buffer (a core, not the GIL: hashlib lets it
  go for large inputs);
- ``python``: a pure-Python loop (a core and the GIL);

and ``none`` (no wait). Each with the default switch interval and with
``SWITCH`` seconds (``sys.setswitchinterval``, restored after the row). If the
hypothesis holds, ``python`` is slower than ``hash`` at the default interval and
the shorter interval closes most of the gap.

    PYTHONPATH=. python docs/bench/2026-11-29-h200-twentyfourth/convoy.py OUT

JSON to ``OUT/convoy.json``, rewritten after every row.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

B, V = int(os.environ.get("B", 4)), int(os.environ.get("V", 26))
STEPS = int(os.environ.get("STEPS", 10))
H, W = int(os.environ.get("H", 300)), int(os.environ.get("W", 600))
MS = float(os.environ.get("MS", 30))
SWITCH = float(os.environ.get("SWITCH", 0.0002))
REPEAT = int(os.environ.get("REPEAT", 2))
BASE = Path(os.environ.get("BASE", "/tmp/convoy"))
WAYS = os.environ.get("WAYS", "none,sleep,hash,python").split(",")


def busy(way: str, ms: float, blob: bytes) -> None:
    end = time.perf_counter() + ms / 1e3
    if way == "sleep":
        time.sleep(ms / 1e3)
    elif way == "hash":
        while time.perf_counter() < end:
            hashlib.sha256(blob).digest()
    elif way == "python":
        n = 0
        while time.perf_counter() < end:
            for i in range(200):
                n += i
    elif way != "none":
        raise ValueError(way)


def main() -> None:
    import torch
    from earth2studio.io import ZarrBackend
    from earth2studio.utils.coords import split_coords

    from earth2studio_compile.io import for_compiled_call

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    names = [f"v{i}" for i in range(V)]
    lat = np.linspace(90, -90, H)
    lon = np.linspace(0, 360, W, endpoint=False)
    t0 = np.array([np.datetime64("2024-01-01")])
    leads = np.array([np.timedelta64(6 * i, "h") for i in range(STEPS)])
    total = OrderedDict(
        ensemble=np.arange(B), time=t0, lead_time=leads, lat=lat, lon=lon
    )
    base = torch.rand(B, 1, 1, V, H, W, generator=torch.Generator().manual_seed(0))
    xs = [base + 1.0 + k for k in range(STEPS)]
    blob = os.urandom(1 << 20)  # ~1 ms of sha256 a call

    def coords_of(lead: int) -> OrderedDict:
        return OrderedDict(
            ensemble=np.arange(B),
            time=t0,
            lead_time=leads[lead : lead + 1],
            variable=np.array(names),
            lat=lat,
            lon=lon,
        )

    step_mb = B * V * H * W * 4 / 1e6
    res: dict = {
        "python": sys.version.split()[0],
        "cores": os.cpu_count(),
        "shape": [B, V, H, W],
        "steps": STEPS,
        "step_mb": step_mb,
        "busy_ms": MS,
        "default_switch_s": sys.getswitchinterval(),
        "rows": [],
    }

    def row(way: str, switch: float | None, repeat: int) -> dict:
        shutil.rmtree(BASE, ignore_errors=True)
        os.sync()
        BASE.mkdir(parents=True)
        backend = ZarrBackend(str(BASE / "s.zarr"), backend_kwargs={"overwrite": True})
        io = for_compiled_call(backend)
        assert io is not None
        io.add_array(total, names)
        if io._ahead is not None:
            io._ahead._done.result()  # its directories made, as a first step lets
        before = sys.getswitchinterval()
        busy_s = 0.0
        try:
            if switch is not None:
                sys.setswitchinterval(switch)
            start = time.perf_counter()
            for lead in range(STEPS):
                t = time.perf_counter()
                busy(way, MS, blob)
                busy_s += time.perf_counter() - t
                io.write(*split_coords(xs[lead], coords_of(lead), "variable"))
            io.flush()
            wall = time.perf_counter() - start
        finally:
            sys.setswitchinterval(before)
        return {
            "way": way,
            "switch_s": switch if switch is not None else before,
            "repeat": repeat,
            "s": round(wall, 3),
            "busy_s": round(busy_s, 3),
            "blocked_s": round(io.blocked_s, 3),
            "beyond_busy_s": round(wall - busy_s, 3),
            "gb_per_s": round(step_mb * STEPS / 1e3 / wall, 2),
        }

    for repeat in range(REPEAT):
        for switch in (None, SWITCH):
            for way in WAYS:
                r = row(way, switch, repeat)
                print(json.dumps(r), flush=True)
                res["rows"].append(r)
                (out / "convoy.json").write_text(json.dumps(res, indent=1))
    shutil.rmtree(BASE, ignore_errors=True)


if __name__ == "__main__":
    main()
