"""SFNO (the zoo's, published size) per step: eager TF32 against compiled with the
model table's spec (spectral convolutions opaque, no CUDA graphs) and with the
spectral transforms compiled too (nothing opaque; CUDA graphs off and on), in one
process; each compiled row's output after step 1 compared with eager's.

Written after the tenth session's device time: not run yet. It needs
torch-harmonics >= 0.9.3 (Inductor-safe transforms); the GPU machine's torch 2.11
has 0.9.2, so install the Python-only 0.9.3 of ``.ci/fetch-model-wheels.sh`` ahead
of it on the path:

    pip install -q --no-index --no-deps --target /tmp/th093 .whl-models/th/*.whl
    PYTHONPATH=/tmp/th093:$PYTHONPATH python3 sfno_sht.py OUT.json

``SFNO_DEVICE=cpu`` runs the small size on the CPU (a rehearsal).
"""

import dataclasses
import json
import os
import sys
import time

import torch
import torch_harmonics

from earth2studio_compile import CompileSession, register_model, wait_for_builds
from earth2studio_compile.models import TORCH_HARMONICS_SFNO
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.env import environment
from earth2studio_compile.tools.bench.measure import eager_precision
from earth2studio_compile.tools.bench.runs import initial_state

WARM, SWITCH, STEPS = 16, 4, 20


def sync() -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


device = torch.device(os.environ.get("SFNO_DEVICE", "cuda"))
size = "full" if device.type == "cuda" else "small"
model = zoo.build("sfno", size=size).to(device)
x, coords = initial_state(model, device)
env = environment(device.type) | {"torch-harmonics": torch_harmonics.__version__}
out = {"argv": sys.argv, "environment": env, "rows": []}
SPECS = {
    "eager": None,
    "table": TORCH_HARMONICS_SFNO,
    "nothing opaque": dataclasses.replace(TORCH_HARMONICS_SFNO, opaque=()),
    "nothing opaque, CUDA graphs": dataclasses.replace(
        TORCH_HARMONICS_SFNO, opaque=(), cudagraphs=True
    ),
}
reference: dict[int, torch.Tensor] = {}
for name, spec in SPECS.items():
    row: dict = {"run": name}
    try:
        if spec is not None:
            register_model(type(model), spec)
        scope = (
            CompileSession(model, precision="tf32")
            if spec is not None
            else eager_precision(model, "tf32")
        )
        with scope:
            iterator = model.create_iterator(x, coords)
            next(iterator)  # the initial condition
            start = time.perf_counter()
            outputs = {1: next(iterator)[0].clone()}
            sync()
            row["step1_s"] = time.perf_counter() - start
            for _ in range(WARM):
                next(iterator)
            if spec is not None and any(j.poll() == "built" for j in wait_for_builds()):
                for _ in range(SWITCH):
                    next(iterator)
            sync()
            walls = []
            for _ in range(STEPS):
                start = time.perf_counter()
                y, _ = next(iterator)
                sync()
                walls.append(1e3 * (time.perf_counter() - start))
            iterator.close()
            if spec is not None:
                report = scope.report
                row["summary"] = report.summary()
                row["statuses"] = sorted({r.status for r in report.regions})
        row["ms"] = walls
        row["median_ms"] = sorted(walls)[STEPS // 2]
        if not reference:
            reference = outputs
        row["rel_l2_step1"] = float(
            (outputs[1] - reference[1]).norm() / reference[1].norm()
        )
    except Exception as err:  # a row that fails is a finding: keep the others
        row["error"] = f"{type(err).__name__}: {err}"
    finally:
        register_model(type(model), TORCH_HARMONICS_SFNO)
    out["rows"].append(row)
    print({k: v for k, v in row.items() if k not in ("ms", "summary")}, flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
