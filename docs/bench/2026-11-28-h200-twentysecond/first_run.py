"""What the region's first call spends its time on, in the first process after
``tools.build``.

In the twenty-second session (README.md here, H200) DLWP's compiled ensemble call
spent 70% of its 1.54 s in its first step: upstream's ``fetch_data`` took 0.86 s
against eager's 0.37-0.48 while the region's first call ran ahead on its own
thread for 0.45 s, of which the artifact's ``first_run`` was 0.37 s. AOTInductor's
runner holds the GIL while it runs, so the two take turns. Before choosing a way
out (a first run that lets the GIL go, or a shorter one), this says what the first
run does: loading kernels (the driver's module calls), planning convolutions
(cuDNN), allocating, or launching.

One compile=True workflow call (the bench's ``calls.call``; ``MODEL`` dlwp: the job
``dlwp-ens``, 3 variables, ``OverlappedIO`` in memory; fcn: ``fcn-ens``, data
prefetched, on disk) under ``torch.profiler`` (CPU and CUDA, every thread where
this torch can), ``STEPS`` steps (2). Writes ``OUT/first-run-MODEL.txt`` and
``.json``: the region's phases, the call's first step, and per profiler thread
the ops and CUDA runtime and driver calls with the most self CPU time.

Run from the repository root, with a copy of a ``tools.build`` cache:

    EARTH2STUDIO_COMPILE_CACHE=/tmp/first-cache MODEL=dlwp python3 \\
      docs/bench/2026-11-28-h200-twentysecond/first_run.py OUT
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.calls import call, set_precision
from earth2studio_compile.tools.bench.workflow_args import JOBS

SPECS = {
    "dlwp": {"job": "dlwp-ens", "io": "overlapped-memory", "source": "random"},
    "fcn": {"job": "fcn-ens", "io": "overlapped", "source": "prefetched"},
}


def _profiler(activities: list) -> profile:
    """A profiler of every thread where this torch can (the region's first call
    runs ahead on a thread of its own), else of the calling thread's ops."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return profile(
            activities=activities,
            experimental_config=_ExperimentalConfig(profile_all_threads=True),
        )
    except TypeError:
        return profile(activities=activities)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    name = os.environ.get("MODEL", "dlwp")
    tmp = Path(os.environ.get("WORKDIR", "/tmp/first-run"))
    tmp.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    res: dict = {"model": name, "torch": torch.__version__}

    def say(*a) -> None:
        lines.append(" ".join(str(x) for x in a))
        print(*a, flush=True)
        (out / f"first-run-{name}.txt").write_text("\n".join(lines) + "\n")
        (out / f"first-run-{name}.json").write_text(
            json.dumps(res, indent=1, default=str)
        )

    device = torch.device(os.environ.get("DEVICE", "cuda"))
    job = SPECS[name]["job"]
    spec = {
        **JOBS[job],
        **SPECS[name],
        "outputs": "few" if name == "dlwp" else "all",
        "precision": "tf32",
        "size": os.environ.get("SIZE", "full"),
        "steps": int(os.environ.get("STEPS", 2)),
    }
    set_precision("tf32")
    model = zoo.build(spec["model"], size=spec["size"]).to(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    start = time.perf_counter()
    with _profiler(activities) as prof:
        row = call(spec, model, device, tmp, compiled=True)
    regions = [
        {k: r.get(k) for k in ("region", "executor", "first_call_s", "phases")}
        for r in row["report"]["regions"]
    ]
    res.update(
        wall_s=row["wall_s"],
        first_step=row["first_step"],
        regions=regions,
        profiled_s=time.perf_counter() - start,
    )
    say(
        f"{name}: wall {row['wall_s']:.2f} s (profiled), first step {row['first_step']}"
    )
    for r in regions:
        say(f"  {r['region']} ({r['executor']}): first call {r['first_call_s']}")
        say("   ", {k: round(v, 3) for k, v in (r["phases"] or {}).items()})
    per_thread: dict = {}
    for e in prof.events():
        ops = per_thread.setdefault(e.thread, {})
        n, us = ops.get(e.name, (0, 0.0))
        ops[e.name] = (n + 1, us + e.self_cpu_time_total)
    res["threads"] = {}
    for thread, ops in sorted(
        per_thread.items(), key=lambda kv: -sum(v[1] for v in kv[1].values())
    ):
        total = sum(us for _, us in ops.values()) / 1e3
        top = sorted(ops.items(), key=lambda kv: -kv[1][1])[:25]
        driver = sorted(
            (
                (k, v)
                for k, v in ops.items()
                if k.startswith(("cu", "cudnn", "aten::cudnn"))
            ),
            key=lambda kv: -kv[1][1],
        )[:15]
        res["threads"][str(thread)] = {
            "self_cpu_ms": total,
            "top": [{"op": k, "count": n, "ms": us / 1e3} for k, (n, us) in top],
            "cuda_calls": [
                {"op": k, "count": n, "ms": us / 1e3} for k, (n, us) in driver
            ],
        }
        say(f"\nthread {thread}: self CPU {total:.1f} ms; top ops (count, ms)")
        for k, (n, us) in top:
            say(f"  {k[:70]:<70} {n:>7} {us / 1e3:9.1f}")
        say("  CUDA runtime/driver and cuDNN calls:")
        for k, (n, us) in driver:
            say(f"  {k[:70]:<70} {n:>7} {us / 1e3:9.1f}")


if __name__ == "__main__":
    main()
