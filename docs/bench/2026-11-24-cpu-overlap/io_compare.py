"""Writing-bound CPU rollout: persistence (no compute) on a 181x360 grid with every
FCN variable, 12 steps, into an on-disk ZarrBackend; OverlappedIO before
(ce16c1e, hand-built threads) and after (concurrent.futures), interleaved.

The old code is extracted first (its overlap.py imports writers from e2sc_old)::

    mkdir -p /tmp/oldov/e2sc_old && touch /tmp/oldov/e2sc_old/__init__.py
    git show ce16c1e:earth2studio_compile/overlap.py \
        | sed 's/from earth2studio_compile.writers/from e2sc_old.writers/' \
        > /tmp/oldov/e2sc_old/overlap.py
    git show ce16c1e:earth2studio_compile/writers.py > /tmp/oldov/e2sc_old/writers.py
    python docs/bench/2026-11-24-cpu-overlap/io_compare.py
"""

import json, statistics, sys, tempfile, time
from pathlib import Path
import numpy as np

sys.path.insert(0, "/tmp/oldov")
from earth2studio.io import ZarrBackend
from earth2studio.models.px import Persistence
from earth2studio_compile import run
from earth2studio_compile.overlap import OverlappedIO as New
from e2sc_old.overlap import OverlappedIO as Old
from earth2studio_compile.tools import zoo

VARS = [f"v{i}" for i in range(26)]
lat, lon = np.linspace(90, -90, 181), np.linspace(0, 359, 360)
from collections import OrderedDict

model = Persistence(VARS, OrderedDict(lat=lat, lon=lon))
data = zoo.random_source(model)
rows = {"sync": [], "old": [], "new": []}
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
        {k: {"median_s": statistics.median(v), "all": v} for k, v in rows.items()}
    )
)
