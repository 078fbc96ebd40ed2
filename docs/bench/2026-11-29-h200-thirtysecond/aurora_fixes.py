"""Aurora's shifted Swin block at the published 90x180 stage (dim 1024, 16 heads),
compiled on CUDA against eager with Inductor settings turned off one at a time and
with the shift mask kept out of the graph in two ways (issue 33, thirty-second
session; ``aurora_pieces.py`` found the block wrong there, right with the mask
computed eagerly outside the graph). A JSON row after each.

Usage::

    python docs/bench/2026-11-29-h200-thirtysecond/aurora_fixes.py $OUT/fixes.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import aurora.model.swin3d as swin3d
import torch
import torch._inductor.config as inductor

from earth2studio_compile.metrics import rel_l2

DEVICE = torch.device(os.environ.get("AURORA_BISECT_DEVICE", "cuda"))
WS, SS = (2, 6, 12), (1, 3, 6)
C, H, W, DIM, HEADS = (
    (4, 90, 180, 1024, 16) if DEVICE.type == "cuda" else (4, 12, 24, 64, 4)
)
ORIGINAL = swin3d.compute_3d_shifted_window_mask
SETTINGS = {
    "as is": {},
    "allow_buffer_reuse off": {"allow_buffer_reuse": False},
    "inplace_buffers off": {"inplace_buffers": False},
    "pattern_matcher off": {"pattern_matcher": False},
    "reorder_for_peak_memory off": {"reorder_for_peak_memory": False},
    "persistent_reductions off": {"triton.persistent_reductions": False},
    "split_reductions off": {"split_reductions": False},
    "max_fusion_size 1": {"max_fusion_size": 1},
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

    def run_block(x, c):
        return block(x, c, (C, H, W), 0)

    with torch.inference_mode():
        ref = run_block(x, c)

    def trial(name: str, patch: dict | None = None) -> None:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        t = time.perf_counter()
        try:
            with inductor.patch(patch or {}), torch.inference_mode():
                err: float | str = rel_l2(torch.compile(run_block)(x, c), ref)
        except Exception as e:
            err = f"{type(e).__name__}: {e}"[:300]
        keep(
            {
                "run": name,
                "rel_l2": err,
                "seconds": time.perf_counter() - t,
                "stats": dict(torch._dynamo.utils.counters["stats"]),
                "breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
            }
        )

    for name, patch in (
        SETTINGS.items() if os.environ.get("AURORA_FIXES_SETTINGS", "1") == "1" else ()
    ):
        if all(hasattr(inductor, k.split(".")[0]) for k in patch):
            trial(name, patch)
    for name, fn in {
        "mask: assume_constant_result": torch.compiler.assume_constant_result(ORIGINAL),
        "mask: first result kept": _kept,
    }.items():
        swin3d.compute_3d_shifted_window_mask = fn
        try:
            with torch.inference_mode():  # eager's first call, as in a workflow
                run_block(x, c)
            trial(name)
        finally:
            swin3d.compute_3d_shifted_window_mask = ORIGINAL


_masks: dict = {}


@torch.compiler.disable
def _kept_eager(*args, **kwargs):
    return ORIGINAL(*args, **kwargs)


def _kept(*args, **kwargs):
    # The mask from its first (eager) call, a constant tensor the graph reads.
    key = (args, tuple(sorted(kwargs.items())))
    if key not in _masks:
        _masks[key] = _kept_eager(*args, **kwargs)
    return _masks[key]


if __name__ == "__main__":
    main(Path(sys.argv[1]))
