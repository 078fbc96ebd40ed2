"""For the next session (not yet run on a GPU): two questions of the seventh
session's rows, each row a fresh process, FCN ensemble 8 x 10, batch 4, 26
variables, TF32, the data prefetched before the clock, the processes sharing one
cache (the ``cold`` row fills it and waits for its background build).

``PAIR=first`` (default): does the workflow's first call lose by not waiting for
the first call ahead? ``OverlappedIO(ZarrBackend)`` on disk:

- ``ahead``: compile=True as shipped (calls made while the first call ahead runs
  are eager; in the seventh session's warm rows the first one was, and took
  longer than a lone eager first call);
- ``join``: compile=True, the region's first call waits for the first call ahead
  (which then also records the CUDA graph, the workflow not having called yet);
- ``eager``: upstream's workflow through ``OverlappedIO``, no compile.

``PAIR=async``: is compile=True slower than eager on upstream's
``AsyncZarrBackend`` (it was in both seventh-session runs, one process each)?

- ``async-eager``: upstream's workflow on ``AsyncZarrBackend(blocking=False)``;
- ``async-ahead``: compile=True on it, as shipped.

Rows after ``cold`` alternate while the deadline (``DEADLINE`` seconds, by
default 520) leaves time for one more. JSON after every row: ``OUT/rows.json``.

    python3 docs/bench/2026-11-26-h100-seventh/prof_first.py OUT
    PAIR=async python3 docs/bench/2026-11-26-h100-seventh/prof_first.py OUT

(``DEVICE=cpu SIZE=small`` for a smoke test on a machine without a GPU.)
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import wait
from pathlib import Path

SPEC = {
    "workflow": "ensemble",
    "model": "fcn",
    "steps": 10,
    "members": 8,
    "batch_size": 4,
    "outputs": "all",
    "precision": "tf32",
    "source": "prefetched",
}
MODES = {
    "first": ["ahead", "join", "eager"],
    "async": ["async-eager", "async-ahead"],
    "all": ["ahead", "join", "eager", "async-eager", "async-ahead"],
}


def child(mode: str, out: Path) -> None:
    start = time.time()
    import torch

    import earth2studio_compile as e2sc
    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench import calls

    imported = time.time() - start
    if mode == "join":
        from earth2studio_compile.region import CompiledRegion

        shipped = CompiledRegion.__call__

        def joined(self, *args, **kwargs):
            if self._ahead is not None:
                wait([self._ahead])
            return shipped(self, *args, **kwargs)

        CompiledRegion.__call__ = joined
    calls.set_precision("tf32")
    device = torch.device(os.environ.get("DEVICE", "cuda"))
    model = zoo.build("fcn", size=os.environ.get("SIZE", "full")).to(device)
    tmp = Path(tempfile.mkdtemp())
    spec = {**SPEC, "io": "async-zarr" if mode.startswith("async") else "overlapped"}
    r = calls.call(spec, model, device, tmp, mode not in ("eager", "async-eager"))
    if mode == "cold":
        t = time.perf_counter()
        e2sc.wait_for_builds(400)
        r["build_wait_s"] = time.perf_counter() - t
    r["mode"], r["import_s"] = mode, imported
    out.write_text(json.dumps(r, default=str))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("EARTH2STUDIO_COMPILE_CACHE", tempfile.mkdtemp())
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
    rows = []
    # COLD=0: the cache dirs given are already filled (an earlier call's cold row).
    cold = ["cold"] if os.environ.get("COLD", "1") != "0" else []
    modes = cold + MODES[os.environ.get("PAIR", "first")] * 4
    start, longest = time.perf_counter(), 0.0
    deadline = float(os.environ.get("DEADLINE", 520))
    for i, mode in enumerate(modes):
        if time.perf_counter() - start + longest > deadline:
            print("deadline: stopped before", mode, flush=True)
            break
        began = time.perf_counter()
        row = out / f"row-{i}.json"
        proc = subprocess.run(
            [sys.executable, __file__, "--child", mode, str(row)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if mode != "cold":  # the cold row waits for its build
            longest = max(longest, time.perf_counter() - began)
        got = json.loads(row.read_text()) if row.exists() else {"mode": mode}
        got["rc"] = proc.returncode
        if proc.returncode:
            got["stderr"] = proc.stderr[-2000:]
        report = got.pop("report", None) or {}
        got["summary"] = report.get("summary")
        got["phases"] = [g.get("phases") for g in report.get("regions", [])]
        rows.append(got)
        (out / "rows.json").write_text(json.dumps(rows, indent=1, default=str))
        print(
            mode,
            got.get("wall_s"),
            got.get("first_step_s"),
            got.get("thread_s"),
            got["phases"],
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]))
    else:
        main(Path(sys.argv[1]))
