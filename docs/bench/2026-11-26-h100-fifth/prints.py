"""The weights' fingerprint on FCN's weights (H100): as at eccce8e (a sum over
the rows of a (n / 251, 251) view) and as shipped (whole-tensor sums), each
three times in one process; seconds, synchronized. JSON: ``OUT/prints.json``.

    python3 docs/bench/2026-11-26-h100-fifth/prints.py OUT
"""

import json
import sys
import time
from pathlib import Path

import torch

from earth2studio_compile.artifacts import verified
from earth2studio_compile.tools import zoo


def rows_sums(group: list[torch.Tensor]) -> torch.Tensor:
    """``verified._sums`` at eccce8e."""
    n = sum(t.numel() for t in group)
    tail = torch.zeros(-n % 251, dtype=group[0].dtype, device=group[0].device)
    rows = torch.cat([*group, tail]).view(-1, 251)
    columns = rows.sum(dim=0, dtype=torch.float64)
    weights = torch.arange(1, 252, dtype=torch.float64, device=rows.device)
    return torch.stack([columns.sum(), (columns * weights).sum()])


def timed(n: int = 3) -> list[float]:
    took = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        verified.weights_print(model)
        took.append(time.perf_counter() - t)
    return took


out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
model = zoo.build("fcn", size="full").cuda()
shipped = verified._sums
res = {"elements": sum(p.numel() for p in model.parameters())}
res["shipped_s"] = timed()
verified._sums, verified._GROUP = rows_sums, 1 << 26
res["eccce8e_s"] = timed()
verified._sums, verified._GROUP = shipped, 1 << 24
res["shipped_again_s"] = timed()
print(res, flush=True)
(out / "prints.json").write_text(json.dumps(res))
