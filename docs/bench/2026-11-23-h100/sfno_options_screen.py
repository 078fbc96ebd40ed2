"""One-off screen of Inductor options for the full-size SFNO core (run 14).

Run from the repository root on the GPU machine:
``python docs/bench/2026-11-23-h100/sfno_options_screen.py tf32conv`` (PyTorch's
defaults) or ``... fp32`` (TF32 off). Median of 12 synchronized core calls after 3
warm-up calls, eager then each option set, in one process (Dynamo reset between).
"""
import sys
import time

import torch

from earth2studio_compile import CompileSession
from earth2studio_compile.tools import zoo

if sys.argv[1] == "fp32":
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
model = zoo.build("sfno", size="full").cuda()
core = model.model
inp = torch.randn(1, 73, 721, 1440, device="cuda")


def timeit(n=12):
    with torch.no_grad():
        for _ in range(3):
            core(inp)
        torch.cuda.synchronize()
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            core(inp)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
    return sorted(ts)[n // 2] * 1e3


print(sys.argv[1], "eager", round(timeit(), 2), flush=True)
for name, kw in [
    ("default", {}),
    ("1x1mm", {"options": {"conv_1x1_as_mm": True}}),
    ("nolayout", {"options": {"layout_optimization": False}}),
    ("both", {"options": {"conv_1x1_as_mm": True, "layout_optimization": False}}),
]:
    torch._dynamo.reset()
    with CompileSession(model, cache=False, **kw) as s:
        t = timeit()
    print(sys.argv[1], name, round(t, 2), s.report.summary()[-160:], flush=True)
