"""The pieces of Aurora's shifted Swin block, compiled on CUDA against eager
(issue 33, thirty-second session): random weights and inputs, no Earth2Studio.

``aurora_stage.py`` found, at the published size's 90x180 stage (dim 1024, 16
heads), every *shifted* block wrong compiled (rel L2 0.08-0.16) while each block's
window attention, compiled alone with the shift mask given as an input, matched
eager exactly. Here, per case (levels, height, width, dim, heads):

- ``mask``: ``compute_3d_shifted_window_mask`` compiled (Dynamo traces through its
  ``lru_cache``) against eager;
- ``attn+mask``: the window attention with the mask computed in the same graph;
- ``block``: the shifted block;
- ``block, mask eager``: the same with the mask function kept out of the graph
  (``torch.compiler.disable``);
- ``attn+mask, math``: the first again, with SDPA limited to its math kernel.

A JSON row after each. Usage::

    python docs/bench/2026-11-29-h200-thirtysecond/aurora_pieces.py $OUT/pieces.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import aurora.model.swin3d as swin3d
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from earth2studio_compile.metrics import rel_l2

DEVICE = torch.device(os.environ.get("AURORA_BISECT_DEVICE", "cuda"))
WS, SS = (2, 6, 12), (1, 3, 6)
CASES = {
    "stage1": (4, 90, 180, 1024, 16),
    "stage0": (4, 180, 360, 512, 8),
    "90x180, dim 512": (4, 90, 180, 512, 8),
    "medium stage0": (4, 36, 72, 1024, 16),
}
if DEVICE.type == "cpu":
    CASES = {"small": (4, 12, 24, 64, 4)}
ORIGINAL = swin3d.compute_3d_shifted_window_mask


def randomise(module: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return module.to(DEVICE).eval()


def main(out: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch._dynamo.config.cache_size_limit = 64
    rows: list[dict] = []

    def keep(row: dict) -> None:
        rows.append(row)
        out.write_text(json.dumps(rows, indent=1, default=str))
        print(json.dumps(row, default=str)[:400], flush=True)

    def trial(case: str, name: str, fn, *args, ctx=torch.inference_mode):
        with ctx():
            ref = fn(*args)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        t = time.perf_counter()
        try:
            with ctx():
                got = torch.compile(fn)(*args)
            err: float | str = rel_l2(got, ref)
            if got.dtype != torch.float32:
                err = float((got != ref).sum())
        except Exception as e:
            err = f"{type(e).__name__}: {e}"[:300]
        keep(
            {
                "case": case,
                "run": name,
                "rel_l2": err,
                "seconds": time.perf_counter() - t,
                "stats": dict(torch._dynamo.utils.counters["stats"]),
                "breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
            }
        )

    for case, (C, H, W, dim, heads) in CASES.items():
        g = torch.Generator().manual_seed(1)
        x = torch.randn(1, C * H * W, dim, generator=g).to(DEVICE)
        c = torch.randn(1, 512, generator=g).to(DEVICE)
        block = randomise(
            swin3d.Swin3DTransformerBlock(
                dim, heads, 512, window_size=WS, shift_size=SS
            )
        )
        nw = (C // WS[0]) * (H // WS[1]) * (W // WS[2])
        xw = torch.randn(nw, WS[0] * WS[1] * WS[2], dim, generator=g).to(DEVICE)

        def mask(x):
            m, _ = swin3d.compute_3d_shifted_window_mask(
                C, H, W, WS, SS, x.device, x.dtype
            )
            return m + 0  # a graph needs one tensor op

        def attn(xw):
            m, _ = swin3d.compute_3d_shifted_window_mask(
                C, H, W, WS, SS, xw.device, xw.dtype
            )
            return block.attn(xw, mask=m, rollout_step=0)

        def run_block(x, c):
            return block(x, c, (C, H, W), 0)

        trial(case, "mask", mask, x)
        trial(case, "attn+mask", attn, xw)
        trial(case, "block", run_block, x, c)
        swin3d.compute_3d_shifted_window_mask = torch.compiler.disable(ORIGINAL)
        try:
            trial(case, "block, mask eager", run_block, x, c)
        finally:
            swin3d.compute_3d_shifted_window_mask = ORIGINAL
        trial(
            case,
            "attn+mask, math",
            attn,
            xw,
            ctx=lambda: _both(torch.inference_mode(), sdpa_kernel(SDPBackend.MATH)),
        )


class _both:
    def __init__(self, *cms):
        self.cms = cms

    def __enter__(self):
        for cm in self.cms:
            cm.__enter__()

    def __exit__(self, *exc):
        for cm in reversed(self.cms):
            cm.__exit__(*exc)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
