"""A PyTorch-only reproduction attempt of Aurora's wrong compiled block (issue 33),
for a report upstream: no Aurora, no Earth2Studio. Not yet run on a GPU (written
after the thirty-second session's device time).

``aurora_roll.py`` found the block right when its first ``torch.roll`` is written as
slices concatenated. Here, at the published 90x180 stage's shape (4 levels, dim
1024, windows (2, 6, 12), shift (1, 3, 6)), growing pieces of the block after that
roll, each compiled (Inductor, default mode) against eager, fp32 with TF32 off:

1. roll, window partition;
2. + the qkv projection;
3. + scaled-dot-product attention with the shift mask, the output projection;
4. + window reverse, roll back, residual and layer norm.

A JSON row after each. Usage::

    python docs/bench/2026-11-29-h200-thirtysecond/roll_repro.py $OUT/roll-repro.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

DEVICE = torch.device(os.environ.get("AURORA_BISECT_DEVICE", "cuda"))
C, H, W, D, HEADS = (4, 90, 180, 1024, 16)
if DEVICE.type == "cpu":
    C, H, W, D, HEADS = (4, 12, 24, 64, 4)
WS, SS = (2, 6, 12), (1, 3, 6)
N = WS[0] * WS[1] * WS[2]


def partition(x: torch.Tensor) -> torch.Tensor:
    x = x.view(1, C // WS[0], WS[0], H // WS[1], WS[1], W // WS[2], WS[2], D)
    return x.permute(0, 1, 3, 5, 2, 4, 6, 7).reshape(-1, N, D)


def reverse(w: torch.Tensor) -> torch.Tensor:
    w = w.view(1, C // WS[0], H // WS[1], W // WS[2], WS[0], WS[1], WS[2], D)
    return w.permute(0, 1, 4, 2, 5, 3, 6, 7).reshape(1, C, H, W, D)


def stage(k: int, x, mask, qkv_w, qkv_b, proj_w, proj_b):
    shortcut = x
    x = x.view(1, C, H, W, D)
    w = partition(torch.roll(x, (-SS[0], -SS[1], -SS[2]), (1, 2, 3)))
    if k == 1:
        return w
    qkv = F.linear(w, qkv_w, qkv_b)
    if k == 2:
        return qkv
    q, k_, v = qkv.view(-1, N, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(q, k_, v, attn_mask=mask.unsqueeze(1))
    o = F.linear(o.transpose(1, 2).reshape(-1, N, D), proj_w, proj_b)
    if k == 3:
        return o
    y = torch.roll(reverse(o), SS, (1, 2, 3)).reshape(1, C * H * W, D)
    return shortcut + F.layer_norm(y, (D,))


def main(out: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE)

    x = randn(1, C * H * W, D)
    nw = (C // WS[0]) * (H // WS[1]) * (W // WS[2])
    mask = torch.where(randn(nw, N, N) > 1.0, -100.0, 0.0)
    weights = (
        randn(3 * D, D, scale=0.03),
        randn(3 * D, scale=0.03),
        randn(D, D, scale=0.03),
        randn(D, scale=0.03),
    )
    rows = []
    for k in (1, 2, 3, 4):
        torch._dynamo.reset()
        with torch.inference_mode():
            want = stage(k, x, mask, *weights)
            got = torch.compile(stage)(k, x, mask, *weights)
        err = float((got - want).norm() / want.norm())
        rows.append({"pieces": k, "rel_l2": err, "torch": torch.__version__})
        out.write_text(json.dumps(rows, indent=1))
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
