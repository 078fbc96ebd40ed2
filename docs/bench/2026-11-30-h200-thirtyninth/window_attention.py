"""AIFS's sliding-window attention at its published size, three ways (issue 33).

The processor's attention over 40,320 hidden nodes, 16 heads of 64, a window of
512 either side, bfloat16: PyTorch's SDPA with the window as a dense boolean mask
(what the zoo's network runs: anemoi's ``SDPAAttentionWrapper``), flash-attn's
sliding window (anemoi's default, what users of the published AIFS run; the
reduced wheel of ``.ci/build-flash-attn.sh``), and PyTorch's FlexAttention
compiled with a block-sparse mask of the same window (what a compiled processor
could run without flash-attn). Prints and writes, per way, the median ms of a
call (CUDA events) and its relative L2 against the dense SDPA's output.

    python3 docs/bench/2026-11-30-h200-thirtyninth/window_attention.py OUT.json
    python3 .../window_attention.py OUT.json --nodes 1024 --window 64 --device cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def _timed(fn: Callable[[], torch.Tensor], device: torch.device, n: int) -> list[float]:
    times = []
    for _ in range(n):
        if device.type == "cuda":
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return times


def _ways(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int
) -> dict[str, Callable[[], torch.Tensor]]:
    """The ways to run the attention, each a call with no arguments returning
    ``(batch, heads, nodes, dim)``; a way whose package is missing is left out."""
    n = q.shape[-2]
    idx = torch.arange(n, device=q.device)
    dense = (idx[None, :] - idx[:, None]).abs() <= window
    ways: dict[str, Callable[[], torch.Tensor]] = {
        "sdpa dense mask": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=dense
        )
    }
    try:
        import flash_attn_2_cuda  # noqa: F401
        from flash_attn import flash_attn_func
    except ImportError:
        pass
    else:
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        ways["flash-attn window"] = lambda: flash_attn_func(
            qt, kt, vt, window_size=(window, window)
        ).transpose(1, 2)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def in_window(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (q_idx - kv_idx).abs() <= window

    block = create_block_mask(in_window, None, None, n, n, device=str(q.device))
    flex = torch.compile(flex_attention, dynamic=False)
    ways["flex block mask (compiled)"] = lambda: flex(q, k, v, block_mask=block)
    return ways


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", help="write the rows here")
    p.add_argument("--nodes", type=int, default=40320)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (1, args.heads, args.nodes, args.dim)
    q, k, v = (
        torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
        for _ in range(3)
    )
    rows = []
    with torch.inference_mode():
        ways = _ways(q, k, v, args.window)
        reference = ways["sdpa dense mask"]().float()
        for name, fn in ways.items():
            out = fn()  # the first call: compiles, plans
            err = float((out.float() - reference).norm() / reference.norm())
            times = _timed(fn, device, args.repeats)
            row = {"way": name, "median_ms": statistics.median(times), "rel_l2": err}
            rows.append(row)
            print(f"{name:28s} {row['median_ms']:9.3f} ms  rel L2 {err:.1e}")
            meta = {"args": vars(args), "torch": torch.__version__}
            if device.type == "cuda":
                meta["device"] = torch.cuda.get_device_name(device)
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
