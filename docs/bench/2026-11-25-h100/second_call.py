"""Whole workflow calls, eager vs compile=True, interleaved in one process (issue 30).

FCN full size (random weights), 40 steps, all 26 variables, TF32 set globally for
every row (the user's one line), IO backends given on the command line. Each call is
timed from calling ``earth2studio_compile.run.deterministic`` until the store is
written (``io.close()`` for AsyncZarrBackend) and the device is idle. Call 1 of
compile=True compiles (cold or warm local cache); later ones find the compiled core
kept in the process (earth2studio_compile.resident). JSON after every row.

    python docs/bench/2026-11-25-h100/second_call.py OUT.json async-zarr,zarr 40
"""

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from earth2studio_compile import resident, run
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.e2e import make_io
from earth2studio_compile.tools.bench.runs import TIME, finish

out_path, ios, nsteps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
device = torch.device("cuda")
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
model = zoo.build("fcn", size="full").to(device)
meta = {
    "command": " ".join(sys.argv),
    "device": torch.cuda.get_device_name(),
    "torch": torch.__version__,
    "python": platform.python_version(),
    "date": time.strftime("%Y-%m-%d"),
    "nsteps": nsteps,
    "precision": "tf32 (global flags)",
    "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
}
rows = []
tmp = Path(tempfile.mkdtemp(prefix="second-call-"))


def call(io_name: str, compiled: bool) -> dict:
    np.random.seed(0)
    torch.manual_seed(0)
    data = zoo.random_source(model)
    io = make_io(io_name, tmp, model, nsteps)
    marks = {}
    start = marks["start"] = time.perf_counter()
    run.deterministic(
        [str(TIME)], nsteps, model, data, io, device=device, verbose=False,
        compile=compiled,
    )
    wall = finish(io, device, marks, start)
    row = {"io": io_name, "compile": compiled, "wall_s": wall,
           "returned_s": marks["returned"] - start}
    if compiled:
        report = run.last_report()
        region = next(r for r in report.regions if r.region == "model")
        row.update(status=region.status, reused=region.reused,
                   first_call_s=region.first_call_seconds, phases=region.phases,
                   summary=report.summary())
    return row


for io_name in ios:
    for i in range(3):
        for compiled in (False, True):
            row = call(io_name, compiled)
            row["repeat"] = i + 1
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "summary"}), flush=True)
            Path(out_path).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    resident.release()  # the next backend's first compiled call compiles again (warm)
