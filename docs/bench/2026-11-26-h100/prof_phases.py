"""Exploration (not committed at the root): where the main thread's time goes per
phase, DLWP ensemble 16x20 b8 3 vars, OverlappedIO around several stores, in one process.

python3 prof3.py OUTDIR
"""

import functools
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import earth2studio.run as e2run
import torch
from loguru import logger

import earth2studio_compile as e2sc
import earth2studio_compile.run  # noqa: F401
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench import calls

out = Path(sys.argv[1])
logger.remove()
logger.add(sys.stderr, level="WARNING")
calls.set_precision("tf32")
device = torch.device("cuda")
model = zoo.build("dlwp", size="full").to(device)
tmp = Path(tempfile.mkdtemp())
rows = []
SPEC = {"workflow": "ensemble", "model": "dlwp", "steps": 20, "members": 16,
        "batch_size": 8, "outputs": "few", "precision": "tf32",
        "io": "overlapped-memory"}
T = defaultdict(float)


def timed(name, fn):
    @functools.wraps(fn)
    def w(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[name] += time.perf_counter() - t0
    return w


e2run.map_coords = timed("map_coords", e2run.map_coords)
e2run.split_coords = timed("split_coords", e2run.split_coords)
cls = type(model)
_ci = cls.create_iterator


def create_iterator(self, x, coords):
    it = _ci(self, x, coords)
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            return
        finally:
            T["next"] += time.perf_counter() - t0
        yield item


cls.create_iterator = create_iterator


class NullStore:
    def add_array(self, coords, array_name, **kw):
        pass

    def write(self, x, coords, array_name):
        pass


class CopyStore:
    """Keeps a fresh numpy copy of each array written (memory faults, no Zarr)."""

    def __init__(self):
        self.kept = []

    def add_array(self, coords, array_name, **kw):
        pass

    def write(self, x, coords, array_name):
        for t in x if isinstance(x, list) else [x]:
            self.kept.append(t.numpy().copy())


captured = []
_tw = calls._time_writes


def _capture(io):
    io.write = timed("write", io.write)
    w = _tw(io)
    captured.append(w)
    return w


calls._time_writes = _capture


def row(tag, compiled, io="overlapped-memory", store=None, **spec):
    s = {**SPEC, "io": io, **spec}
    saved = calls.make_call_io
    if store is not None:
        def make(spec, model, tmp):
            base = store()
            return e2sc.OverlappedIO(base) if io == "ovio-custom" else base
        calls.make_call_io = make
        s["io"] = "memory-zarr"
    T.clear()
    try:
        r = calls.call(s, model, device, tmp, compiled)
    except Exception as err:  # noqa: BLE001
        r = {"error": repr(err)}
    finally:
        calls.make_call_io = saved
    r.pop("report", None)
    if captured:
        w = captured[-1]
        r["write_gaps_ms"] = [round(1e3 * (b - a), 1) for a, b in zip(w, w[1:])]
    r["tag"] = tag
    r["phases"] = dict(T)
    rows.append(r)
    print(tag, round(r.get("wall_s", -1), 3), round(r.get("first_step_s") or -1, 3),
          {k: round(v, 3) for k, v in T.items()}, r.get("error", ""), flush=True)
    (out / "rows.json").write_text(json.dumps(rows, indent=1))


row("cold", True)
t0 = time.perf_counter()
jobs = e2sc.wait_for_builds(300)
print("build wait", time.perf_counter() - t0, [j.describe() for j in jobs], flush=True)
for rep in range(2):
    row(f"comp-ovio-memzarr-{rep}", True)
    row(f"comp-ovio-null-{rep}", True, io="ovio-custom", store=NullStore)
    row(f"comp-ovio-copy-{rep}", True, io="ovio-custom", store=CopyStore)
    row(f"comp-nocopy-{rep}", True, io="plain", store=NullStore)
    row(f"eager-ovio-memzarr-{rep}", False)
    row(f"eager-ovio-null-{rep}", False, io="ovio-custom", store=NullStore)
    row(f"eager-nocopy-{rep}", False, io="plain", store=NullStore)
for rep in range(2):
    row(f"eager-memzarr-b8-{rep}", False, io="memory-zarr")
    row(f"eager-memzarr-b16-{rep}", False, io="memory-zarr", batch_size=16)
row("comp-b16-cold", True, batch_size=16)
e2sc.wait_for_builds(200)
for rep in range(2):
    row(f"comp-ovio-memzarr-b16-{rep}", True, batch_size=16)
