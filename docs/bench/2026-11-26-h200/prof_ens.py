"""Exploration (not committed): where a DLWP ensemble call's time goes, H100.

python3 prof_ens.py OUTDIR [model]
"""

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

import earth2studio_compile.run  # noqa: F401
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench import calls

out = Path(sys.argv[1])
mode = sys.argv[2]
model_name = "dlwp"
logger.remove()
logger.add(sys.stderr, level="WARNING")
calls.set_precision("tf32")
device = torch.device("cuda")
model = zoo.build(model_name, size="full").to(device)
tmp = Path(tempfile.mkdtemp())
rows = []
SPEC = {
    "workflow": "ensemble",
    "model": model_name,
    "steps": 20,
    "members": 16,
    "batch_size": 8,
    "outputs": "few",
    "precision": "tf32",
    "io": "overlapped-memory",
}


class NullIO:
    """Takes writes and drops them, after a synchronous copy to host (as upstream's
    backends do), or none (``copy=False``)."""

    def __init__(self, copy):
        self.copy = copy

    def add_array(self, coords, array_name, **kw):
        pass

    def write(self, x, coords, array_name):
        if self.copy:
            for t in x if isinstance(x, list) else [x]:
                t.cpu()


def spy(tag):
    exe = "/tmp/site/bin/py-spy"
    if not os.path.exists(exe):
        return None
    p = subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(os.getpid()),
            "--threads",
            "--idle",
            "--rate",
            "500",
            "--format",
            "raw",
            "-o",
            str(out / f"spy-{mode}-{tag}.txt"),
            "--nonblocking",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
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


def row(
    tag,
    compiled,
    io="overlapped-memory",
    prof=False,
    switch=None,
    null=None,
    workers=None,
    **spec,
):
    s = {**SPEC, "io": io, **spec}
    old = sys.getswitchinterval()
    if switch:
        sys.setswitchinterval(switch)
    saved = calls.make_call_io
    if null is not None:
        calls.make_call_io = lambda spec, model, tmp: NullIO(null)
    import functools

    import earth2studio_compile as e2sc

    orig = e2sc.OverlappedIO
    if workers:
        e2sc.OverlappedIO = functools.partial(orig, workers=workers)
    p = spy(tag) if prof else None
    try:
        r = calls.call(s, model, device, tmp, compiled)
    except Exception as err:  # noqa: BLE001
        r = {"error": repr(err)}
    finally:
        calls.make_call_io = saved
        e2sc.OverlappedIO = orig
        sys.setswitchinterval(old)
        if p is not None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
            print(p.stdout.read().decode()[-500:], flush=True)
    rep = r.pop("report", None)
    if rep:
        r["regions"] = [
            (g["status"], g["executor"], g["first_call_s"], g["phases"])
            for g in rep["regions"]
        ]
    if captured:
        w = captured[-1]
        r["write_gaps_ms"] = [round(1e3 * (b - a), 1) for a, b in zip(w, w[1:])]
    r["tag"] = tag
    ms = s["members"] * s["steps"]
    if "wall_s" in r:
        r["ms_per_s"] = ms / r["wall_s"]
    rows.append(r)
    print(json.dumps(r), flush=True)
    (out / f"rows-{mode}.json").write_text(json.dumps(rows, indent=1))


if mode == "build":
    row("cold", True)
    from earth2studio_compile import wait_for_builds

    t0 = time.perf_counter()
    jobs = wait_for_builds(300)
    print(
        "build wait", time.perf_counter() - t0, [j.describe() for j in jobs], flush=True
    )
elif mode == "fresh":
    row("fresh-compiled-ovio-spy", True, prof=True)
    row("second-compiled-ovio-spy", True, prof=True)
    row("third-compiled-ovio", True)
elif mode == "eager":
    row("fresh-eager-ovio-spy", False, prof=True)
    row("second-eager-ovio", False)
