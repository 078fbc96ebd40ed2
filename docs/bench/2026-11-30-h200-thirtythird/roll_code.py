"""The Triton code Inductor writes for roll + window partition (roll_shapes.py's
first piece) at the wrong shape [1, 4, 90, 180, 1024] and a right one (dim 512),
for a report to PyTorch, and the wrong shape under a few tiling settings.

    TORCH_LOGS=output_code python roll_code.py $OUT/roll-code.json 2>$OUT/roll.log
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from roll_shapes import piece  # type: ignore[import-not-found]
from torch._inductor import config

SETTINGS = {
    "default": {},
    "max_tiles=1": {"triton.max_tiles": 1},
    "prefer_nd_tiling": {"triton.prefer_nd_tiling": True},
    "no_block_ptr": {"triton.use_block_ptr": False},
    "block_ptr": {"triton.use_block_ptr": True},
}


def main(out: Path) -> None:
    rows = []
    for d, settings in ((1024, SETTINGS), (512, {"default": {}})):
        x = torch.randn(1, 4, 90, 180, d, device="cuda")
        want = piece(x, "roll+partition")
        for name, patch in settings.items():
            torch._dynamo.reset()
            print(f"=== dim {d}, {name}", file=sys.stderr, flush=True)
            with config.patch(patch):
                got = torch.compile(piece)(x, "roll+partition")
            err = float((got - want).norm() / want.norm())
            rows.append({"dim": d, "setting": name, "rel_l2": err})
            out.write_text(json.dumps(rows, indent=1))
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
