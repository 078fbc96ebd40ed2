"""Narrowing triton_repro.py's wrong kernel (every element wrong at XBLOCK <= 1024,
right at 2048; Triton 3.6.0, an H200): the same gather with one term changed at a
time. A JSON row per variant: how many elements differ from the numpy-checked
formula computed by torch on the device.

    python docs/bench/2026-11-30-h200-thirtythird/triton_narrow.py $OUT/narrow.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def gather(in_ptr, out_ptr, VARIANT: tl.constexpr, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    if VARIANT == 1:  # 64-bit indices
        xindex = xindex.to(tl.int64)
    x0 = xindex % 1024
    x1 = (xindex // 1024) % 12
    x2 = (xindex // 12288) % 6
    x3 = (xindex // 73728) % 2
    x4 = (xindex // 147456) % 15
    x5 = (xindex // 2211840) % 15
    x6 = xindex // 33177600
    w = (6 + x1 + 12 * x4) % 180
    h = (3 + x2 + 6 * x5) % 90
    c = (1 + x3 + 2 * x6) % 4
    if VARIANT == 2:  # no roll: plain partition
        w = x1 + 12 * x4
        h = x2 + 6 * x5
        c = x3 + 2 * x6
    if VARIANT == 3:  # roll in the last spatial axis only
        h = x2 + 6 * x5
        c = x3 + 2 * x6
    if VARIANT == 4:  # roll in the level axis only
        w = x1 + 12 * x4
        h = x2 + 6 * x5
    if VARIANT == 5:  # store the source index instead of loading
        tl.store(
            out_ptr + xindex, (x0 + 1024 * w + 184320 * h + 16588800 * c).to(tl.float32)
        )
        return
    tmp = tl.load(in_ptr + (x0 + 1024 * w + 184320 * h + 16588800 * c))
    tl.store(out_ptr + xindex, tmp)


def reference(x: torch.Tensor, variant: int) -> torch.Tensor:
    shifts = {
        0: (-1, -3, -6),
        1: (-1, -3, -6),
        2: (0, 0, 0),
        3: (0, 0, -6),
        4: (-1, 0, 0),
        5: (-1, -3, -6),
    }[variant]
    r = torch.roll(x, shifts, (1, 2, 3))
    return (
        r.view(1, 2, 2, 15, 6, 15, 12, 1024).permute(0, 1, 3, 5, 2, 4, 6, 7).reshape(-1)
    )


def main(out: Path) -> None:
    n = 4 * 90 * 180 * 1024
    x = torch.randn(1, 4, 90, 180, 1024, device="cuda")
    # Index values for variant 5 stay exact in fp32 below 2**24 only: compare as
    # the float of the integer reference.
    ids = torch.arange(n, device="cuda", dtype=torch.float64).view(1, 4, 90, 180, 1024)
    rows = []
    for variant in range(6):
        for block in (1024, 2048):
            got = torch.empty(n, device="cuda")
            gather[(n // block,)](x, got, VARIANT=variant, XBLOCK=block)
            torch.cuda.synchronize()
            want = (
                reference(ids, variant).float()
                if variant == 5
                else reference(x, variant)
            )
            rows.append(
                {
                    "variant": variant,
                    "XBLOCK": block,
                    "wrong": int((got != want).sum()),
                    "triton": triton.__version__,
                }
            )
            out.write_text(json.dumps(rows, indent=1))
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
