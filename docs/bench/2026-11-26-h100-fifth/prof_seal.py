"""Where the first step's ``verified_earlier`` lap goes (prof_ahead.py at eccce8e
measured it at 0.72-1.27 s for FCN). The lap is host time after the first run's
kernels were queued, so it holds both the weights' fingerprint and the wait for
the first run's GPU work (its ``.cpu()`` synchronizes). FCN ensemble 8 x 10,
batch 4, 26 variables, TF32, ``OverlappedIO(ZarrBackend)`` on disk, fresh
processes sharing one cache: ``cold`` builds; then ``inline`` (the first call on
the workflow's thread) and ``ahead`` (as shipped) alternate. In each the
fingerprint is wrapped: ``drain_s`` (a device sync before it: the first run's
GPU work), ``print_s`` (the fingerprint, synchronized); after the call it runs
twice more (``again_s``). JSON after every row: ``OUT/rows.json``.

    python3 docs/bench/2026-11-26-h100-fifth/prof_seal.py OUT
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
    from earth2studio_compile.artifacts import verified
    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench import calls

    imported = time.time() - start
    if mode == "inline":
        e2sc.CompileSession.ahead = lambda self: None
    timed: list[dict] = []
    plain = verified.weights_print

    def wrapped(module):
        t0 = time.perf_counter()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        got = plain(module)
        t2 = time.perf_counter()
        timed.append({"drain_s": t1 - t0, "print_s": t2 - t1})
        return got

    verified.weights_print = wrapped
    calls.set_precision("tf32")
    device = torch.device(os.environ.get("DEVICE", "cuda"))
    model = zoo.build("fcn", size=os.environ.get("SIZE", "full")).to(device)
    tmp = Path(tempfile.mkdtemp())
    r = calls.call(SPEC, model, device, tmp, True)
    if mode == "cold":
        t = time.perf_counter()
        e2sc.wait_for_builds(400)
        r["build_wait_s"] = time.perf_counter() - t
    again = []
    for _ in range(2):
        t = time.perf_counter()
        plain(model)
        again.append(time.perf_counter() - t)
    r["mode"], r["import_s"], r["timed"], r["again_s"] = mode, imported, timed, again
    out.write_text(json.dumps(r, default=str))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("EARTH2STUDIO_COMPILE_CACHE", tempfile.mkdtemp())
    rows = []
    modes = ["cold"] + ["inline", "ahead"] * 2
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
        if i:
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
            got.get("timed"),
            got.get("again_s"),
            got["phases"],
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]))
    else:
        main(Path(sys.argv[1]))
