"""Aurora's shifted-window attention at its published sizes, four ways (issue 33).

Aurora's TF32 backbone gains 1.35x compiled (the forty-first session), short of
1.5x; on SDPA's math path its attention is two TF32 batched matmuls around a
fused softmax that writes the 144 x 144 scores of every window and head. This
times one attention call of each Swin stage (fp32 tensors, TF32 matmuls; windows
of 2 x 6 x 12 = 144 tokens, heads of 64; stage 1: 1800 windows x 8 heads, stage
2: 450 x 16, stage 3: 128 x 32), with the shifted blocks' additive mask (0 or
-100 between the sub-regions of a window, as Swin's) and without:

- ``sdpa``: PyTorch's own choice, eager (what upstream runs);
- ``compiled math``: the call compiled on SDPA's math path (the table's choice);
- ``compiled flex``: the same call compiled with ``F.scaled_dot_product_attention``
  routed to FlexAttention by a ``TorchFunctionMode`` (the mask read by a
  ``score_mod``), one fused kernel that never writes the scores.

Prints and writes, per stage, mask and way, the median ms of a call
(``torch.utils.benchmark``, which synchronizes CUDA), its TFLOP/s (4 N^2 d a
window and head) and its relative L2 against fp32 eager with TF32 off.

    python3 docs/bench/2026-11-30-h200-fortyfirst/swin_attention.py OUT.json
    python3 .../swin_attention.py OUT.json --device cpu --scale 0.02   # a dry run
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import flex_attention
from torch.overrides import TorchFunctionMode
from torch.utils.benchmark import Timer

STAGES = {"stage 1": (1800, 8), "stage 2": (450, 16), "stage 3": (128, 32)}
TOKENS, DIM = 144, 64


class FlexSDPA(TorchFunctionMode):
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=additive)`` as
    FlexAttention: the mask, broadcast over heads, added to each score."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v = args[:3]
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        if mask is None:
            return flex_attention(q, k, v)

        def add_mask(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return score + mask[b, 0, q_idx, kv_idx]

        return flex_attention(q, k, v, score_mod=add_mask)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any
) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _shifted_mask(
    windows: int, device: torch.device, gen: torch.Generator
) -> torch.Tensor:
    """Swin's additive mask shape and values: each window's tokens fall in up to
    four sub-regions (cut at a random row and column); -100 between them."""
    t, h, w = torch.meshgrid(
        torch.arange(2), torch.arange(6), torch.arange(12), indexing="ij"
    )
    cuts = torch.randint(1, 6, (windows, 1), generator=gen, device="cpu")
    cols = torch.randint(1, 12, (windows, 1), generator=gen, device="cpu")
    region = (h.reshape(1, -1) >= cuts).long() * 2 + (w.reshape(1, -1) >= cols).long()
    mask = (region[:, :, None] != region[:, None, :]).float() * -100.0
    return mask[:, None].to(device)  # (windows, 1, N, N)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", help="write the rows here")
    p.add_argument("--scale", type=float, default=1.0, help="of the windows (dry runs)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    math_compiled = torch.compile(_attend, dynamic=False)
    flex_compiled = torch.compile(_attend, dynamic=False)
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"args": vars(args), "torch": torch.__version__}
    if device.type == "cuda":
        meta["device"] = torch.cuda.get_device_name(device)
    try:
        for stage, (windows, heads) in STAGES.items():
            windows = max(2, int(windows * args.scale))
            shape = (windows, heads, TOKENS, DIM)
            q, k, v = (torch.randn(shape, generator=gen).to(device) for _ in range(3))
            for masked in (True, False):
                mask = _shifted_mask(windows, device, gen) if masked else None
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
                with torch.inference_mode(), sdpa_kernel([SDPBackend.MATH]):
                    reference = _attend(q, k, v, mask)
                torch.backends.cuda.matmul.allow_tf32 = True
                torch.backends.cudnn.allow_tf32 = True

                def in_math() -> torch.Tensor:
                    with sdpa_kernel([SDPBackend.MATH]):
                        return math_compiled(q, k, v, mask)

                def in_flex() -> torch.Tensor:
                    with FlexSDPA():
                        return flex_compiled(q, k, v, mask)

                ways = {
                    "sdpa": lambda: _attend(q, k, v, mask),
                    "compiled math": in_math,
                    "compiled flex": in_flex,
                }
                flop = 4.0 * windows * heads * TOKENS * TOKENS * DIM
                for name, fn in ways.items():
                    row: dict[str, Any] = {
                        "stage": stage,
                        "masked": masked,
                        "way": name,
                        "windows": windows,
                        "heads": heads,
                    }
                    try:
                        with torch.inference_mode():
                            out = fn()  # the first call compiles
                            err = (out.float() - reference).norm() / reference.norm()
                            timer = Timer(stmt="fn()", globals={"fn": fn})
                            times = timer.timeit(args.repeats)
                    # A way that fails is a finding, not the end of the run.
                    except Exception as exc:
                        row["error"] = f"{type(exc).__name__}: {exc}"[:400]
                        print(f"{stage} masked={masked} {name} failed: {row['error']}")
                    else:
                        median = times.median * 1e3
                        row.update(
                            median_ms=median,
                            tflops=flop / median / 1e9,
                            rel_l2=float(err),
                        )
                        print(
                            f"{stage} masked={masked!s:5s} {name:14s} {median:9.3f} ms"
                            f"  {row['tflops']:7.1f} TFLOP/s  rel L2 {float(err):.1e}"
                        )
                    rows.append(row)
                    with open(args.json, "w") as f:
                        json.dump({"meta": meta, "rows": rows}, f, indent=1)
                torch._dynamo.reset()  # each stage's shapes compile afresh
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


if __name__ == "__main__":
    main()
