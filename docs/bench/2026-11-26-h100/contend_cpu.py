"""CPU proxy: the main thread's iterator time with OverlappedIO writers storing to a
memory Zarr, DLWP small grid, ensemble 16x20 batch 8, 3 vars (chunk count as on GPU)."""
import functools, sys, time, tempfile
from collections import defaultdict
from pathlib import Path
import torch
torch.set_num_threads(1)
import earth2studio.run as e2run
from loguru import logger
logger.remove(); logger.add(sys.stderr, level="WARNING")
import earth2studio_compile as e2sc
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench import calls
T = defaultdict(float)
def timed(name, fn):
    @functools.wraps(fn)
    def w(*a, **k):
        t0 = time.perf_counter()
        try: return fn(*a, **k)
        finally: T[name] += time.perf_counter() - t0
    return w
model = zoo.build("dlwp", size=sys.argv[1] if len(sys.argv) > 1 else "small")
cls = type(model); _ci = cls.create_iterator
def create_iterator(self, x, coords):
    it = _ci(self, x, coords)
    while True:
        t0 = time.perf_counter()
        try: item = next(it)
        except StopIteration: return
        finally: T["next"] += time.perf_counter() - t0
        yield item
cls.create_iterator = create_iterator
class NullStore:
    def add_array(self, coords, array_name, **kw): pass
    def write(self, x, coords, array_name): pass
SPEC = {"workflow": "ensemble", "model": "dlwp", "steps": 20, "members": 16, "batch_size": 8, "outputs": "few", "precision": "fp32", "io": "overlapped-memory"}
tmp = Path(tempfile.mkdtemp())
def row(tag, store=None, io="overlapped-memory"):
    saved = calls.make_call_io
    if store is not None:
        calls.make_call_io = lambda spec, m, t: e2sc.OverlappedIO(store()) if io == "ovio" else store()
    T.clear()
    try:
        r = calls.call({**SPEC, "io": "memory-zarr" if store else io}, model, torch.device("cpu"), tmp, False)
    finally:
        calls.make_call_io = saved
    print(f"{tag:24s} wall {r['wall_s']:.3f} next {T['next']:.3f}", flush=True)
for rep in range(int(__import__("os").environ.get("REPS","2"))):
    row("nocopy", NullStore, io="plain")
    row("ovio-null", NullStore, io="ovio")
    row("ovio-memzarr")
    row("memzarr", io="memory-zarr")
