"""Writing-bound CPU rollout (as docs/bench/2026-11-24-cpu-overlap/io_compare.py):
persistence (no compute) on a 181x360 grid with every FCN variable, 12 steps, into an
on-disk ZarrBackend; OverlappedIO of main before issue 31 (overlap.py + writers.py,
a dispatcher thread and futures of lists of futures) against the io/ package (one
future per array), default workers, interleaved.

The old code is extracted first::

    mkdir -p /tmp/oldov2/e2sc_main && touch /tmp/oldov2/e2sc_main/__init__.py
    git show 1515a4c:earth2studio_compile/overlap.py \
        | sed 's/from earth2studio_compile.writers/from e2sc_main.writers/' \
        > /tmp/oldov2/e2sc_main/overlap.py
    git show 1515a4c:earth2studio_compile/writers.py > /tmp/oldov2/e2sc_main/writers.py
    python docs/bench/2026-11-25-cpu-io-package/io_compare.py
"""

import json
import statistics
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

sys.path.insert(0, "/tmp/oldov2")
from e2sc_main.overlap import OverlappedIO as Old  # noqa: E402
from earth2studio.io import ZarrBackend  # noqa: E402
from earth2studio.models.px import Persistence  # noqa: E402

from earth2studio_compile import run  # noqa: E402
from earth2studio_compile.io import OverlappedIO as New  # noqa: E402
from earth2studio_compile.tools import zoo  # noqa: E402

VARS = [f"v{i}" for i in range(26)]
lat, lon = np.linspace(90, -90, 181), np.linspace(0, 359, 360)
model = Persistence(VARS, OrderedDict(lat=lat, lon=lon))
data = zoo.random_source(model)
rows: dict[str, list[float]] = {"sync": [], "old": [], "new": []}
tmp = Path(tempfile.mkdtemp())
for rep in range(5):
    for kind in ("sync", "old", "new"):
        backend = ZarrBackend(
            str(tmp / f"{kind}-{rep}.zarr"), backend_kwargs={"overwrite": True}
        )
        io = backend if kind == "sync" else (Old if kind == "old" else New)(backend)
        np.random.seed(0)
        start = time.perf_counter()
        run.deterministic(["2024-01-01"], 12, model, data, io, verbose=False)
        if kind != "sync":
            io.close()
        rows[kind].append(time.perf_counter() - start)
        print(kind, rep, round(rows[kind][-1], 3), flush=True)
print(
    json.dumps(
        {
            k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)}
            for k, v in rows.items()
        }
    )
)
