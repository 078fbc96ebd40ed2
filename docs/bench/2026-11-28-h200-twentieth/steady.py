"""Where FCN's compiled ensemble call waits after its first step.

At da38751 (README.md here) the FCN ensemble on disk (8 x 10, batch 4, all 26
variables, TF32, compile=True through ``OverlappedIO``) took 1.96 s after its first
step for 19 steps whose compiled core takes 73 ms each (1.39 s): the workflow's
thread spent most of the model iterator's wall time on the CPU (CUDA spin-waits
count as CPU) and was blocked on the writers 0.48 s. If the iterator waits for
the device every step, the host's work of a step (``io.write``, ``split_coords``,
the coordinates) is added to the device's instead of overlapping it. This script
answers where the host waits, in one process:

1. a first compile=True call (the bench's ``calls.call``: the job ``fcn-ens``, data
   prefetched, ``OverlappedIO`` around a ``ZarrBackend`` on disk), which loads the
   artifact from the compile cache (``EARTH2STUDIO_COMPILE_CACHE``: a copy of a
   ``tools.build`` cache) and records its CUDA graph;
2. the same call again under ``torch.profiler`` (CPU and CUDA), with stacks;
3. ``OUT/steady.txt``: the call's thread table, the CUDA runtime calls that block
   the host (synchronize, synchronous copies, event waits) by thread, with their
   callers in the workflow (five frames), and the ops with the most self CPU time
   on the workflow's thread; ``OUT/steady.json`` the numbers.

Run from the repository root (``SIZE=small DEVICE=cpu`` on a CPU):

    EARTH2STUDIO_COMPILE_CACHE=/tmp/steady-cache python3 \\
      docs/bench/2026-11-28-h200-twentieth/steady.py OUT

The nineteenth session's copy ran at 9a6d36a on an H200 and stopped after the
profiled call (README.md here): ``FunctionEvent`` has no ``cpu_time_range`` in
torch 2.11, and no event carries the workflow's Python frame (the profiler keeps
stacks on ops, not Python functions as events). Here the events' own
``time_range`` is summed, the workflow's thread is the one with the most events
(the call runs on the main thread; RecordFunction numbers threads from 1 in the
order they first record), and the trace is kept (``OUT/steady-trace.json.gz``) to
be read without the device.
"""

import gzip
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.calls import (
    background_builds,
    call,
    set_precision,
)
from earth2studio_compile.tools.bench.workflow_args import JOBS

#: CUDA runtime and driver calls that make the calling host thread wait.
BLOCKING = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaStreamWaitEvent",
    "cudaMemcpy",
    "cudaMemcpyAsync",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "aten::item",
    "aten::_local_scalar_dense",
)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(os.environ.get("WORKDIR", "/tmp/steady"))
    tmp.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    res: dict = {"rows": []}

    def say(*a) -> None:
        lines.append(" ".join(str(x) for x in a))
        print(*a, flush=True)
        (out / "steady.txt").write_text("\n".join(lines) + "\n")
        (out / "steady.json").write_text(json.dumps(res, indent=1, default=str))

    device = torch.device(os.environ.get("DEVICE", "cuda"))
    spec = {
        **JOBS["fcn-ens"],
        "job": "fcn-ens",
        "outputs": "all",
        "io": "overlapped",
        "source": "prefetched",
        "precision": "tf32",
        "size": os.environ.get("SIZE", "full"),
    }
    set_precision("tf32")
    model = zoo.build("fcn", size=spec["size"]).to(device)
    for label in ("first", "profiled"):
        start = time.perf_counter()
        if label == "first":
            row = call(spec, model, device, tmp, compiled=True)
            # A build this call started (no artifact in the cache) would run beside
            # the profiled call: cancelled, and said.
            row.update(background_builds(cancel=True))
        else:
            activities = [ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            with profile(activities=activities, with_stack=True) as prof:
                row = call(spec, model, device, tmp, compiled=True)
        row.pop("report", None)
        res["rows"].append({"label": label, **row})
        say(
            f"{label}: wall {row['wall_s']:.2f} s, first step "
            f"{row['first_step_s']:.2f} s, thread_s "
            + json.dumps({k: round(v, 3) for k, v in row["thread_s"].items()})
            + ", thread_cpu_s "
            + json.dumps({k: round(v, 3) for k, v in row["thread_cpu_s"].items()})
            + f" ({time.perf_counter() - start:.1f} s with the profiler's own work)"
        )
        if row.get("background"):
            say(f"  background builds cancelled: {row['background']}")
    events = prof.events()
    threads: dict = {}
    for e in events:
        threads[e.thread] = threads.get(e.thread, 0) + 1
    trace = out / "steady-trace.json"
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()
    # The profiler numbers threads its own way; the call runs on the main thread,
    # the first to record and the one with the most events.
    workflow_thread = max(threads, key=threads.get) if threads else None
    res["events_by_thread"] = threads
    say(f"events by thread (the workflow's: {workflow_thread}): {threads}")
    blocking: dict = {}
    for e in events:
        if not any(e.name.startswith(b) for b in BLOCKING):
            continue
        where = "workflow" if e.thread == workflow_thread else f"thread {e.thread}"
        frames = [f for f in (e.stack or []) if "earth2studio" in f][:5]
        key = (where, e.name, " <- ".join(frames))
        n, us = blocking.get(key, (0, 0.0))
        blocking[key] = (n + 1, us + e.time_range.elapsed_us())
    say("\nBlocking CUDA calls (thread, call, workflow frames): count, total ms")
    rows = sorted(blocking.items(), key=lambda kv: -kv[1][1])
    res["blocking"] = [
        {"thread": k[0], "call": k[1], "stack": k[2], "count": n, "ms": us / 1e3}
        for k, (n, us) in rows
    ]
    for (where, name, stack), (n, us) in rows[:40]:
        say(f"  {where:>18}  {name:<28} {n:>6}  {us / 1e3:9.1f} ms  {stack[:300]}")
    own = [e for e in events if e.thread == workflow_thread]
    self_cpu: dict = {}
    for e in own:
        n, us = self_cpu.get(e.name, (0, 0.0))
        self_cpu[e.name] = (n + 1, us + e.self_cpu_time_total)
    say("\nSelf CPU time on the workflow's thread, by op: count, total ms")
    top = sorted(self_cpu.items(), key=lambda kv: -kv[1][1])[:30]
    res["self_cpu"] = [{"op": k, "count": n, "ms": us / 1e3} for k, (n, us) in top]
    for name, (n, us) in top:
        say(f"  {name:<60} {n:>7}  {us / 1e3:9.1f} ms")


if __name__ == "__main__":
    main()
