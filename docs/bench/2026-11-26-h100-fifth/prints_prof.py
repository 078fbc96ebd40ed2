"""Where the weights' fingerprint of FCN spends its 0.6-0.9 s on an H100
(prints.py: the same with a sum over rows and with whole-tensor sums): each
stage synchronized, then torch.profiler over one call. ``OUT/prints_prof.txt``.

    python3 docs/bench/2026-11-26-h100-fifth/prints_prof.py OUT
"""

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from earth2studio_compile.artifacts import verified
from earth2studio_compile.tools import zoo

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
lines: list[str] = []


def say(*a) -> None:
    lines.append(" ".join(str(x) for x in a))
    print(*a, flush=True)
    (out / "prints_prof.txt").write_text("\n".join(lines))


model = zoo.build("fcn", size="full").cuda()
torch.cuda.synchronize()
tensors = [*model.parameters(), *model.buffers()]
say("tensors", len(tensors), {str(t.device) for t in tensors})
for attempt in range(2):
    t0 = time.perf_counter()
    bits = [verified._bits(t.detach()) for t in tensors]
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    groups, group, n = [], [], 0
    for b in bits:
        if n + b.numel() > verified._GROUP and group:
            groups.append(group)
            group, n = [], 0
        group.append(b)
        n += b.numel()
    groups.append(group)
    took = []
    for g in groups:
        t = time.perf_counter()
        s = verified._sums(g)
        torch.cuda.synchronize()
        took.append(round(time.perf_counter() - t, 4))
    t2 = time.perf_counter()
    s.cpu()
    t3 = time.perf_counter()
    say("attempt", attempt, "bits", round(t1 - t0, 4), "sums", took, "cpu", t3 - t2)
    t = time.perf_counter()
    big = torch.cat(bits[:20])
    torch.cuda.synchronize()
    say("  cat of 20", big.numel(), round(time.perf_counter() - t, 4))
    t = time.perf_counter()
    big.sum(dtype=torch.float64)
    torch.cuda.synchronize()
    say("  sum f64", round(time.perf_counter() - t, 4))
    t = time.perf_counter()
    big.float().sum()
    torch.cuda.synchronize()
    say("  sum f32", round(time.perf_counter() - t, 4))
    t = time.perf_counter()
    verified.weights_print(model)
    say("  weights_print", round(time.perf_counter() - t, 4))
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    verified.weights_print(model)
    torch.cuda.synchronize()
for key in ("self_cpu_time_total", "self_device_time_total"):
    say(prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=40))
