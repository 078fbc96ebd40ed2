"""FCN3's block MLP (makani's ``MLP``: 1x1 Conv2d 641 -> 1282, GELU, 1x1 Conv2d
1282 -> 641, NCHW) on FCN3's 360x720 processor grid, under FCN3's bf16 autocast
with TF32 flags on: eager against ``torch.compile`` with CUDA graphs and three
sets of Inductor options (the defaults; ``layout_optimization`` off; that and
``conv_1x1_as_mm``, ``sfno_inductor_options``' two). Each way in this process,
one after another; JSON after every row.

Usage: python fcn3_mlp_options.py OUT.json [--small]
"""

import json
import statistics
import sys
import time

import torch
from torch import nn

small = "--small" in sys.argv
device = torch.device("cuda" if torch.cuda.is_available() and not small else "cpu")
embed, h, w = (8, 12, 24) if small else (641, 360, 720)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.manual_seed(0)
mlp = nn.Sequential(
    nn.Conv2d(embed, 2 * embed, 1, bias=True),
    nn.GELU(),
    nn.Conv2d(2 * embed, embed, 1, bias=True),
).to(device)
x = torch.randn(1, embed, h, w, device=device)
autocast = torch.autocast(device.type, dtype=torch.bfloat16)


def timed(fn, calls=20):
    out = []
    for _ in range(calls):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e3)
    return out


rows = []
with torch.no_grad(), autocast:
    ref = mlp(x).float()
    ms = timed(mlp)
    rows.append({"way": "eager", "ms": statistics.median(ms), "min_ms": min(ms)})
    print(rows[-1], flush=True)
    for name, opts in (
        ("defaults", {}),
        ("layout_optimization off", {"layout_optimization": False}),
        ("+ conv_1x1_as_mm", {"layout_optimization": False, "conv_1x1_as_mm": True}),
    ):
        torch._dynamo.reset()
        if device.type == "cuda":
            opts = {**opts, "triton.cudagraphs": True}
        fn = torch.compile(mlp, options=opts)
        t = time.perf_counter()
        out = fn(x).float()
        fn(x)
        first = time.perf_counter() - t
        err = ((out - ref).norm() / ref.norm()).item()
        ms = timed(fn)
        rows.append(
            {
                "way": name,
                "options": opts,
                "ms": statistics.median(ms),
                "min_ms": min(ms),
                "first_two_calls_s": first,
                "rel_l2_vs_eager": err,
            }
        )
        print(rows[-1], flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(
                {
                    "torch": torch.__version__,
                    "device": str(
                        torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
                    ),
                    "shape": [1, embed, h, w],
                    "rows": rows,
                },
                f,
                indent=1,
            )
