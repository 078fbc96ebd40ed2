"""Wall time of N processes started together on one shared compile cache root.

Each process imports the package, builds the small FCN, runs it eagerly, then
compiled under ``CompileSession`` (the region's first call: compile, or load a
bundle another process saved). Every run starts from an empty shared root and empty
local Inductor caches. Usage::

    python docs/bench/2026-11-24-cpu-cluster/cluster_wall.py --processes 1 2 --out X.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = """
import json, sys, time
start = time.perf_counter()
import torch
from earth2studio_compile import CompileSession
from earth2studio_compile.session import example_input
from earth2studio_compile.tools import zoo
model = zoo.build("fcn")
x, coords = example_input(model, device="cpu")
x.normal_(generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    eager, _ = model(x, coords)
first = time.perf_counter()
with CompileSession(model) as session, torch.no_grad():
    out, _ = model(x, coords)
(region,) = session.report.regions
json.dump({"artifact": region.artifact, "cache": region.cache,
           "max_abs_diff": (out - eager).abs().max().item(),
           "imports_and_eager_s": first - start,
           "first_compiled_call_s": time.perf_counter() - first},
          open(sys.argv[1], "w"))
"""


def run(n: int, base: Path) -> dict:
    root = base / f"n{n}"
    root.mkdir()
    script = root / "worker.py"
    script.write_text(WORKER)
    procs = []
    start = time.perf_counter()
    for i in range(n):
        local = root / f"local-{i}"
        env = {
            **os.environ,
            "EARTH2STUDIO_COMPILE_CACHE": str(root / "shared"),
            "TORCHINDUCTOR_CACHE_DIR": str(local),
            "TRITON_CACHE_DIR": str(local / "triton"),
        }
        log = open(root / f"p{i}.log", "w")
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(root / f"p{i}.json")],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        )
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - start
    results = [
        json.loads((root / f"p{i}.json").read_text()) if c == 0 else {"rc": c}
        for i, c in enumerate(codes)
    ]
    return {"processes": n, "wall_s": wall, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch

    rows = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": len(os.sched_getaffinity(0)),
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        for n in args.processes:
            rows["rows"].append(run(n, Path(tmp)))
            one = rows["rows"][0]["wall_s"]
            rows["rows"][-1]["ratio_to_first_row"] = rows["rows"][-1]["wall_s"] / one
            args.out.write_text(json.dumps(rows, indent=1))
            print(json.dumps(rows["rows"][-1]), flush=True)


if __name__ == "__main__":
    main()
