"""Does a step's device-to-host copy on the compute stream add to the step? FCN's
ensemble step (batch 4) yields 432 MB; the compiled step takes ~62 ms on an H200.
Rows: the copy alone; N steps of a ~60 ms stand-in compute, each followed by its copy
on the same stream; the same with a device snapshot (clone) on the compute stream
and the copy on a side stream. Writes JSON to argv[1]."""

import json
import sys
import time

import torch

out = sys.argv[1]
dev = torch.device("cuda")
x = torch.randn(4, 26, 721, 1440, device=dev)
a = torch.randn(8192, 8192, device=dev)
host = [torch.empty(x.numel(), dtype=x.dtype, pin_memory=True) for _ in range(3)]
torch.backends.cuda.matmul.allow_tf32 = True


def compute(reps: int) -> None:
    for _ in range(reps):
        torch.mm(a, a, out=b)


b = torch.empty_like(a)
rows = {}


def timed(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


for _ in range(3):
    timed(lambda: host[0].view_as(x).copy_(x, non_blocking=True))
rows["copy_ms"] = min(timed(lambda: host[0].view_as(x).copy_(x, non_blocking=True)) for _ in range(5)) * 1e3
# reps of the stand-in to about 60 ms
one = min(timed(lambda: compute(10)) for _ in range(3)) / 10
reps = max(1, round(0.060 / one))
rows["step_ms"] = min(timed(lambda: compute(reps)) for _ in range(3)) * 1e3
N = 20


def same() -> None:
    for i in range(N):
        compute(reps)
        host[i % 3].view_as(x).copy_(x, non_blocking=True)


side = torch.cuda.Stream()
snap = [torch.empty_like(x) for _ in range(3)]


def sided() -> None:
    main = torch.cuda.current_stream()
    done: list = [None, None, None]  # each slot's copy, waited for before its reuse
    for i in range(N):
        compute(reps)
        if done[i % 3] is not None:
            main.wait_event(done[i % 3])
        snap[i % 3].copy_(x)
        ev = torch.cuda.Event()
        ev.record(main)
        side.wait_event(ev)
        with torch.cuda.stream(side):
            host[i % 3].view_as(x).copy_(snap[i % 3], non_blocking=True)
        done[i % 3] = torch.cuda.Event()
        done[i % 3].record(side)


for name, fn in (("same_stream_s", same), ("side_stream_s", sided)):
    timed(fn)
    rows[name] = min(timed(fn) for _ in range(3))
    rows[name[: -len("_s")] + "_per_step_ms"] = rows[name] / N * 1e3
rows["snapshot_ms"] = min(timed(lambda: snap[0].copy_(x)) for _ in range(5)) * 1e3
rows["gpu"] = torch.cuda.get_device_name()
rows["torch"] = torch.__version__
print(json.dumps(rows, indent=1))
json.dump(rows, open(out + "/sidecopy.json", "w"), indent=1)
