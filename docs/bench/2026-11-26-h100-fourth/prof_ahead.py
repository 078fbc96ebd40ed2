"""For the next session (not yet run): whether the first call ahead costs a fresh
process its first step. FCN ensemble 8 x 10, batch 4, 26 variables, TF32,
``OverlappedIO(ZarrBackend)`` on disk, each row a fresh process sharing one cache:

- ``cold``: compile=True with an empty cache (its artifact builds in the
  background; the parent waits for it);
- ``ahead``: compile=True as shipped (the first call ahead, the artifact's seal);
- ``stream``: compile=True, the first call ahead on a CUDA stream of its own and
  its syncs on that stream only (as shipped it queues on, and synchronizes, the
  device the workflow's thread is using);
- ``inline``: compile=True with ``CompileSession.ahead`` a no-op (the first call
  loads, runs and verifies on the workflow's own thread, at its first step);
- ``eager``: upstream's workflow through ``OverlappedIO``, no compile.

Rows after ``cold`` alternate, twice, while the deadline (``DEADLINE`` seconds,
by default 480) leaves time for one more. JSON after every row: ``OUT/rows.json``.

    python3 docs/bench/2026-11-26-h100-fourth/prof_ahead.py OUT

(``DEVICE=cpu SIZE=small`` for a smoke test on a machine without a GPU.)
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = {
    "workflow": "ensemble",
    "model": "fcn",
    "steps": 10,
    "members": 8,
    "batch_size": 4,
    "outputs": "all",
    "precision": "tf32",
    "io": "overlapped",
}


def child(mode: str, out: Path) -> None:
    start = time.time()
    import torch

    import earth2studio_compile as e2sc
    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench import calls

    imported = time.time() - start
    if mode == "inline":
        e2sc.CompileSession.ahead = lambda self: None
    if mode == "stream":
        from earth2studio_compile import first_call

        alone = first_call.FirstCall._first_ahead

        def on_its_own_stream(self):
            with torch.cuda.stream(torch.cuda.Stream()):
                return alone(self)

        def stream_only(device):
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()

        first_call.FirstCall._first_ahead = on_its_own_stream
        first_call.synchronize = stream_only
    calls.set_precision("tf32")
    device = torch.device(os.environ.get("DEVICE", "cuda"))
    model = zoo.build("fcn", size=os.environ.get("SIZE", "full")).to(device)
    tmp = Path(tempfile.mkdtemp())
    r = calls.call(SPEC, model, device, tmp, mode != "eager")
    if mode == "cold":
        t = time.perf_counter()
        e2sc.wait_for_builds(400)
        r["build_wait_s"] = time.perf_counter() - t
    r["mode"], r["import_s"] = mode, imported
    out.write_text(json.dumps(r, default=str))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("EARTH2STUDIO_COMPILE_CACHE", tempfile.mkdtemp())
    rows = []
    modes = ["cold"] + ["ahead", "stream", "inline", "eager"] * 2
    start, longest = time.perf_counter(), 0.0
    deadline = float(os.environ.get("DEADLINE", 480))
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
        if i:  # the cold row waits for its build
            longest = max(longest, time.perf_counter() - began)
        got = json.loads(row.read_text()) if row.exists() else {"mode": mode}
        got["rc"] = proc.returncode
        if proc.returncode:
            got["stderr"] = proc.stderr[-2000:]
        regions = (got.get("report") or {}).get("regions", [])
        got["phases"] = [g.get("phases") for g in regions]
        got.pop("report", None)
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
