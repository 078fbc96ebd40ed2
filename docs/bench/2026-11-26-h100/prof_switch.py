"""Exploration (not committed at the root): GIL share and switch interval, DLWP
ensemble 16x20 b8, 3 vars, memory Zarr through OverlappedIO, in one process.

python3 prof2.py OUTDIR
"""

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import earth2studio.run  # noqa: F401
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


class NullIO:
    def __init__(self, copy):
        self.copy = copy

    def add_array(self, coords, array_name, **kw):
        pass

    def write(self, x, coords, array_name):
        if self.copy:
            for t in x if isinstance(x, list) else [x]:
                t.cpu()


def spy(tag, gil):
    exe = "/tmp/site/bin/py-spy"
    if not os.path.exists(exe):
        return None
    args = [exe, "record", "--pid", str(os.getpid()), "--threads", "--rate", "1000",
            "--format", "raw", "-o", str(out / f"spy-{tag}.txt"), "--nonblocking"]
    args.append("--gil" if gil else "--idle")
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(1.5)
    if p.poll() is not None:
        print("py-spy failed:", p.stdout.read().decode()[-2000:], flush=True)
        return None
    return p


captured = []
_tw = calls._time_writes


def _capture(io):
    w = _tw(io)
    captured.append(w)
    return w


calls._time_writes = _capture


def row(tag, compiled, io="overlapped-memory", spy_gil=None, switch=None, null=None,
        workers=None, **spec):
    s = {**SPEC, "io": io, **spec}
    old = sys.getswitchinterval()
    saved = calls.make_call_io
    if null is not None:
        calls.make_call_io = lambda spec, model, tmp: NullIO(null)
    orig = e2sc.OverlappedIO
    if workers:
        e2sc.OverlappedIO = functools.partial(orig, workers=workers)
    p = spy(tag, spy_gil) if spy_gil is not None else None
    if switch:
        sys.setswitchinterval(switch)
    try:
        r = calls.call(s, model, device, tmp, compiled)
    except Exception as err:  # noqa: BLE001
        r = {"error": repr(err)}
    finally:
        sys.setswitchinterval(old)
        calls.make_call_io = saved
        e2sc.OverlappedIO = orig
        if p is not None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    rep = r.pop("report", None)
    if rep:
        r["regions"] = [(g["status"], g["executor"], g["first_call_s"])
                        for g in rep["regions"]]
    if captured:
        w = captured[-1]
        r["write_gaps_ms"] = [round(1e3 * (b - a), 1) for a, b in zip(w, w[1:])]
    r["tag"] = tag
    r["switch"] = switch
    if "wall_s" in r:
        r["ms_per_s"] = s["members"] * s["steps"] / r["wall_s"]
    rows.append(r)
    print(tag, round(r.get("wall_s", -1), 3), round(r.get("first_step_s") or -1, 3),
          r.get("error", ""), flush=True)
    (out / "rows.json").write_text(json.dumps(rows, indent=1))


row("cold", True)
t0 = time.perf_counter()
jobs = e2sc.wait_for_builds(300)
print("build wait", time.perf_counter() - t0, [j.describe() for j in jobs], flush=True)
for rep in range(2):
    row(f"comp-default-{rep}", True)
    row(f"comp-sw0.5ms-{rep}", True, switch=0.0005)
    row(f"comp-sw1ms-{rep}", True, switch=0.001)
    row(f"comp-sw0.2ms-{rep}", True, switch=0.0002)
    row(f"eager-ovio-default-{rep}", False)
    row(f"eager-ovio-sw0.5ms-{rep}", False, switch=0.0005)
row("comp-null-nocopy", True, null=False)
row("comp-null-copy", True, null=True)
row("comp-w16", True, workers=16)
row("comp-spy-gil", True, spy_gil=True)
row("comp-spy-idle", True, spy_gil=False)
row("comp-sw0.5ms-spy-gil", True, spy_gil=True, switch=0.0005)
row("eager-memzarr", False, io="memory-zarr")
row("eager-memzarr-sw0.5ms", False, io="memory-zarr", switch=0.0005)
