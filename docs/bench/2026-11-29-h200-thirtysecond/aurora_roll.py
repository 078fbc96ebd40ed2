"""Aurora's shifted Swin block at the published 90x180 stage (dim 1024, 16 heads)
on CUDA, compiled against eager, with its two cyclic shifts (``torch.roll``) done
another, bitwise-equal way (two slices concatenated), one at a time and together
(issue 33, thirty-second session). ``aurora_fixes.py`` found the block wrong
whatever Inductor setting was turned off, and with the shift mask a graph input;
``aurora_pieces.py`` found it right when the mask's call broke the graph after the
first shift. A JSON row after each. Usage::

    python docs/bench/2026-11-29-h200-thirtysecond/aurora_roll.py $OUT/roll.json
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from pathlib import Path

import aurora.model.swin3d as swin3d
import torch

from earth2studio_compile.metrics import rel_l2

DEVICE = torch.device(os.environ.get("AURORA_BISECT_DEVICE", "cuda"))
WS, SS = (2, 6, 12), (1, 3, 6)
C, H, W, DIM, HEADS = (4, 90, 180, 1024, 16)
if DEVICE.type == "cpu":
    C, H, W, DIM, HEADS = (4, 12, 24, 64, 4)


def cat_roll(x: torch.Tensor, shifts, dims) -> torch.Tensor:
    """``torch.roll`` as slices concatenated: the same values, bit for bit."""
    for s, d in zip(shifts, dims, strict=True):
        n = x.shape[d]
        s %= n
        if s:
            x = torch.cat([x.narrow(d, n - s, s), x.narrow(d, 0, n - s)], dim=d)
    return x


def forward(self, x, c, res, rollout_step, warped=True, *, first, back, brk=False):
    """Upstream's Swin3DTransformerBlock.forward (microsoft-aurora 2.0.1), its two
    rolls replaceable."""
    C, H, W = res
    B, L, D = x.shape
    ws, ss = swin3d.maybe_adjust_windows(self.window_size, self.shift_size, res)
    shortcut = x
    x = x.view(B, C, H, W, D)
    shifted_x = first(x, shifts=(-ss[0], -ss[1], -ss[2]), dims=(1, 2, 3))
    if brk:
        torch._dynamo.graph_break()
    attn_mask, _ = swin3d.compute_3d_shifted_window_mask(
        C, H, W, ws, ss, x.device, x.dtype, warped=warped
    )
    pad_size = ((-C) % ws[0], (-H) % ws[1], (-W) % ws[2])
    shifted_x = swin3d.pad_3d(shifted_x, pad_size)
    x_windows = swin3d.window_partition_3d(shifted_x, ws)
    x_windows = x_windows.view(-1, ws[0] * ws[1] * ws[2], D)
    attn_windows = self.attn(x_windows, mask=attn_mask, rollout_step=rollout_step)
    attn_windows = attn_windows.view(-1, ws[0], ws[1], ws[2], D)
    _, pad_C, pad_H, pad_W, _ = shifted_x.shape
    shifted_x = swin3d.window_reverse_3d(attn_windows, ws, pad_C, pad_H, pad_W)
    shifted_x = swin3d.crop_3d(shifted_x, pad_size)
    x = back(shifted_x, shifts=(ss[0], ss[1], ss[2]), dims=(1, 2, 3))
    x = x.reshape(B, C * H * W, D)
    x = shortcut + self.drop_path(self.norm1(x, c))
    x = x + self.drop_path(self.norm2(self.mlp(x), c))
    return x


VARIANTS = {
    "upstream forward (as is)": None,
    "copy, both torch.roll": dict(first=torch.roll, back=torch.roll),
    "first shift as cat": dict(first=cat_roll, back=torch.roll),
    "shift back as cat": dict(first=torch.roll, back=cat_roll),
    "both as cat": dict(first=cat_roll, back=cat_roll),
    "graph break after the first shift": dict(
        first=torch.roll, back=torch.roll, brk=True
    ),
}


def main(out: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rows: list[dict] = []

    def keep(row: dict) -> None:
        rows.append(row)
        out.write_text(json.dumps(rows, indent=1, default=str))
        print(json.dumps(row, default=str)[:300], flush=True)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, C * H * W, DIM, generator=g).to(DEVICE)
    c = torch.randn(1, 512, generator=g).to(DEVICE)
    block = swin3d.Swin3DTransformerBlock(
        DIM, HEADS, 512, window_size=WS, shift_size=SS
    )
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    block = block.to(DEVICE).eval()
    with torch.inference_mode():
        ref = block(x, c, (C, H, W), 0)
    for name, kw in VARIANTS.items():
        if kw is None:
            fn = block.forward
        else:
            fn = types.MethodType(
                lambda self, *a, kw=kw: forward(self, *a, **kw), block
            )
        with torch.inference_mode():
            eager_err = rel_l2(fn(x, c, (C, H, W), 0), ref)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        t = time.perf_counter()
        try:
            with torch.inference_mode():
                err: float | str = rel_l2(torch.compile(fn)(x, c, (C, H, W), 0), ref)
        except Exception as e:
            err = f"{type(e).__name__}: {e}"[:300]
        keep(
            {
                "run": name,
                "rel_l2": err,
                "eager_rel_l2": eager_err,
                "seconds": time.perf_counter() - t,
                "stats": dict(torch._dynamo.utils.counters["stats"]),
                "breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
            }
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
