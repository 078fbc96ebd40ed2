"""Which shapes make Inductor's torch.roll + window partition wrong on CUDA
(torch 2.11): the first piece of ``roll_repro.py`` (roll, then a view/permute/
reshape, pure data movement) compiled against eager, over a few shapes around
Aurora's 90x180 stage (4 levels, dim 1024, windows (2, 6, 12), shift (1, 3, 6)).
A JSON row per shape; also the roll alone, and the partition alone.

    python docs/bench/2026-11-30-h200-thirtythird/roll_shapes.py $OUT/roll-shapes.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

WS, SS = (2, 6, 12), (1, 3, 6)


def piece(x: torch.Tensor, what: str) -> torch.Tensor:
    _, c, h, w, d = x.shape
    if what != "partition":
        x = torch.roll(x, (-SS[0], -SS[1], -SS[2]), (1, 2, 3))
    if what == "roll":
        return x
    x = x.view(1, c // WS[0], WS[0], h // WS[1], WS[1], w // WS[2], WS[2], d)
    return x.permute(0, 1, 3, 5, 2, 4, 6, 7).reshape(-1, WS[0] * WS[1] * WS[2], d)


def main(out: Path) -> None:
    rows = []
    shapes = [
        (4, 90, 180, 1024),
        (4, 90, 180, 512),
        (4, 90, 180, 256),
        (4, 180, 360, 512),
        (4, 48, 96, 1024),
        (2, 90, 180, 1024),
    ]
    for c, h, w, d in shapes:
        x = torch.randn(1, c, h, w, d, device="cuda")
        for what in ("roll+partition", "roll", "partition"):
            if what != "roll+partition" and (c, h, w, d) != shapes[0]:
                continue
            torch._dynamo.reset()
            want = piece(x, what)
            got = torch.compile(piece)(x, what)
            err = float((got - want).norm() / want.norm())
            rows.append(
                {
                    "shape": [1, c, h, w, d],
                    "numel": x.numel(),
                    "what": what,
                    "rel_l2": err,
                    "torch": torch.__version__,
                }
            )
            out.write_text(json.dumps(rows, indent=1))
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
