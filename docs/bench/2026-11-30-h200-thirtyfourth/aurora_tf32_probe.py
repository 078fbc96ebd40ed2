"""The published Aurora's eight regions in TF32: each region's speed probe (its
compiled call beside its eager call, both TF32) from one 3-step deterministic
call with compile=True, built in the foreground. Writes JSON to argv[1].

Run as call 4 of the thirty-fourth session, after the bench rollout ran out of
its time before its compiled row."""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["EARTH2STUDIO_COMPILE_BACKGROUND"] = "off"
os.environ["EARTH2STUDIO_COMPILE_PRECISION"] = "tf32"

import numpy as np  # noqa: E402
import torch  # noqa: E402
from earth2studio.io import KVBackend  # noqa: E402

from earth2studio_compile import run  # noqa: E402
from earth2studio_compile.tools import zoo  # noqa: E402

out = sys.argv[1]
size, device = (sys.argv[2], "cpu") if len(sys.argv) > 2 else ("full", "cuda")
model = zoo.build("aurora", size=size)
np.random.seed(0)
torch.manual_seed(0)
data = zoo.random_source(model)
start = time.perf_counter()
run.deterministic(
    ["2024-01-01T00:00"],
    3,
    model,
    data,
    KVBackend(),
    device=torch.device(device),
    compile=True,
)
seconds = time.perf_counter() - start
report = run.last_report()
rows = [
    {
        k: getattr(r, k)
        for k in (
            "region",
            "status",
            "executor",
            "graphs",
            "graph_breaks",
            "recompiles",
            "compiled_ms",
            "eager_ms",
            "precision",
            "precision_error",
            "compile_seconds",
        )
    }
    for r in report.regions
]
json.dump(
    {
        "call_s": seconds,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "regions": rows,
    },
    open(out, "w"),
    indent=1,
)
for r in rows:
    print(r)
print(report.summary())
