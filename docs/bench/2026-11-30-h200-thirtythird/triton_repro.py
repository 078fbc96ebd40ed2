"""Triton alone: the kernel Inductor wrote for Aurora's roll + window partition at
[1, 4, 90, 180, 1024] (roll_code.py's log), copied, launched over a few block
sizes against torch's eager answer. Its index formula is right (checked in numpy
on the CPU over every element), so a wrong answer here is Triton's compiler.

    python docs/bench/2026-11-30-h200-thirtythird/triton_repro.py $OUT/triton-repro.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def roll_partition(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xnumel = 66355200  # noqa: F841 (as Inductor wrote it)
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    x0 = xindex % 1024
    x1 = (xindex // 1024) % 12
    x2 = (xindex // 12288) % 6
    x3 = (xindex // 73728) % 2
    x4 = (xindex // 147456) % 15
    x5 = (xindex // 2211840) % 15
    x6 = xindex // 33177600
    x7 = xindex
    tmp0 = tl.load(
        in_ptr0
        + (
            x0
            + 1024 * ((6 + x1 + 12 * x4) % 180)
            + 184320 * ((3 + x2 + 6 * x5) % 90)
            + 16588800 * ((1 + x3 + 2 * x6) % 4)
        ),
        None,
    )
    tl.store(out_ptr0 + x7, tmp0, None)


def main(out: Path) -> None:
    x = torch.randn(1, 4, 90, 180, 1024, device="cuda")
    want = (
        torch.roll(x, (-1, -3, -6), (1, 2, 3))
        .view(1, 2, 2, 15, 6, 15, 12, 1024)
        .permute(0, 1, 3, 5, 2, 4, 6, 7)
        .reshape(-1)
    )
    rows = []
    for block in (128, 256, 512, 1024, 2048):
        for warps in (4, 8):
            got = torch.empty_like(want)
            grid = (triton.cdiv(x.numel(), block),)
            roll_partition[grid](x, got, x.numel(), XBLOCK=block, num_warps=warps)
            torch.cuda.synchronize()
            wrong = int((got != want).sum())
            rows.append(
                {
                    "XBLOCK": block,
                    "num_warps": warps,
                    "wrong": wrong,
                    "rel_l2": float((got - want).norm() / want.norm()),
                    "triton": triton.__version__,
                    "torch": torch.__version__,
                }
            )
            out.write_text(json.dumps(rows, indent=1))
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
