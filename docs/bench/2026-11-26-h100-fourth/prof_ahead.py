"""For the next session (not yet run): whether the first call ahead costs a fresh
process its first step. FCN ensemble 8 x 10, batch 4, 26 variables, TF32,
``OverlappedIO(ZarrBackend)`` on disk, each row a fresh process sharing one cache:

- ``cold``: compile=True with an empty cache (its artifact builds in the
  background; the parent waits for it);
- ``ahead``: compile=True as shipped (the first call ahead, the artifact's seal);
- ``inline``: compile=True with ``CompileSession.ahead`` a no-op (the first call
  loads, runs and verifies on the workflow's own thread, at its first step);
- ``eager``: upstream's workflow through ``OverlappedIO``, no compile.

Rows after ``cold`` alternate, twice. JSON after every row: ``OUT/rows.json``.

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
    modes = ["cold"] + ["ahead", "inline", "eager"] * 2
    for i, mode in enumerate(modes):
        row = out / f"row-{i}.json"
        proc = subprocess.run(
            [sys.executable, __file__, "--child", mode, str(row)],
            capture_output=True,
            text=True,
            timeout=300,
        )
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
