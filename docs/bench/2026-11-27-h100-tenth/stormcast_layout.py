"""StormCast per step, eager TF32 against its compiled regions loaded from ahead-of-time
artifacts built with Inductor's layout optimization on (default) and off, in one
process; every row with the same seed, its step-1 output compared with eager's.

    python3 -m earth2studio_compile.tools.build stormcast --precision tf32
    python3 -m earth2studio_compile.tools.build stormcast --precision tf32 \
        --options '{"layout_optimization": false}'
    python3 stormcast_layout.py OUT.json

An optional second argument lists the compiled rows' Inductor options as JSON
(default, as run: '[null, {"layout_optimization": false}]'; null is the model
table's), each built first with ``tools.build ... --options``. Since the table
turned StormCast's layout optimization off (fada6b4), its channels-last build with
CUDA graphs is '{"triton.cudagraphs": true}'.
"""

import json
import sys
import time

import torch

from earth2studio_compile import CompileSession
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.env import environment
from earth2studio_compile.tools.bench.measure import eager_precision
from earth2studio_compile.tools.bench.runs import initial_state

STEPS = 4
device = torch.device("cuda")
model = zoo.build("stormcast", size="full").to(device)
x, coords = initial_state(model, device)
out = {"argv": sys.argv, "environment": environment("cuda"), "rows": []}
first = None
compiled = (
    json.loads(sys.argv[2])
    if len(sys.argv) > 2
    else [None, {"layout_optimization": False}]
)
for name, options in [("eager", None)] + [("compiled", o) for o in compiled]:
    session = (
        CompileSession(model, precision="tf32", options=options)
        if name == "compiled"
        else eager_precision(model, "tf32")
    )
    with session:
        torch.manual_seed(0)
        iterator = model.create_iterator(x, coords)
        next(iterator)  # the initial condition
        start = time.perf_counter()
        y, _ = next(iterator)
        torch.cuda.synchronize()
        step1 = time.perf_counter() - start
        if first is None:
            first = y.clone()
        rel = float((y - first).norm() / first.norm())
        statuses = []
        if name == "compiled":
            statuses = sorted({r.status for r in session.report.regions})
        walls = []
        for _ in range(STEPS):
            start = time.perf_counter()
            next(iterator)
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - start)
        iterator.close()
    row = dict(run=name, options=options, step1_s=step1, rel_l2_step1=rel)
    row |= dict(ms=[1e3 * w for w in walls], statuses=statuses)
    row["median_ms"] = sorted(row["ms"])[STEPS // 2]
    out["rows"].append(row)
    print(row, flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
