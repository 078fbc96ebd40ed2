"""The zoo's medium Aurora (the published Swin windows on a 144x288 grid) through a
2-step ``deterministic`` call on the CPU, eager and with ``compile=True``: which
regions compiled, and each variable's relative L2 after step 1.

    python docs/bench/2026-11-29-cpu-thirtyfirst/aurora_medium_cpu.py OUT.json [scalar]

``scalar`` sets Inductor's ``cpp.simdlen = 1`` (C++ without vector code) first.
Run from the repository root; the compile cache is ``TORCHINDUCTOR_CACHE_DIR``.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from earth2studio_compile import run
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.tools import zoo


def deterministic(compile: bool) -> dict[str, torch.Tensor]:
    from earth2studio.io import KVBackend

    np.random.seed(0)
    torch.manual_seed(0)
    model = zoo.build("aurora", size="medium")
    io = KVBackend()
    data = zoo.random_source(model)
    run.deterministic(
        ["2024-01-01T00:00"], 2, model, data, io, verbose=False, compile=compile
    )
    return {k: torch.as_tensor(np.asarray(v)) for k, v in io.root.items()}


def main() -> None:
    out, scalar = sys.argv[1], "scalar" in sys.argv[2:]
    if scalar:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.simdlen = 1
    eager = deterministic(False)
    compiled = deterministic(True)
    report = run.last_report()
    assert report is not None
    names = [k for k in eager if eager[k].ndim >= 3 and k in compiled]
    errors = {
        k: float(rel_l2(compiled[k][:, 1:], eager[k][:, 1:]))
        for k in names
        if k not in ("time", "lead_time", "lat", "lon")
    }
    worst = max(errors, key=errors.__getitem__)
    row = {
        "torch": torch.__version__,
        "scalar": scalar,
        "regions": {r.region: r.status for r in report.regions},
        "fell_back": [r.reason for r in report.regions if r.status == "eager"][:1],
        "rel_l2_worst": [worst, errors[worst]],
        "rel_l2_median": float(np.median(list(errors.values()))),
    }
    print(json.dumps(row))
    with open(out, "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
