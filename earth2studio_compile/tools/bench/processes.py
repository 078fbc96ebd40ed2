"""The bench's fresh processes: one measurement, one ahead-of-time build.

Every row of the rollout and ensemble modes runs in a process of its own
(:func:`run_one`, ``python -m`` :data:`MEASURE`, or :data:`MEASURE_ENSEMBLE` for an
ensemble row) with its own, empty local compile
caches; ``--aot`` rows build their artifacts first in another (:func:`build_one`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from earth2studio_compile.tools.bench.measure import AUTO, EAGER

MEASURE = "earth2studio_compile.tools.bench.measure"  # run once per fresh process
#: The child of an ensemble row (``spec["mode"] == "ensemble"``).
MEASURE_ENSEMBLE = "earth2studio_compile.tools.bench.ensemble.measure"


def run_one(spec: dict[str, Any], timeout: int, workdir: Path) -> dict[str, Any]:
    """One measurement in a fresh process with its own, empty local compile caches.

    The package's portable bundles live in one directory per (model, mode), shared
    by the cold run (which writes them) and the warm run (which only reads them):
    that is a warm start on a fresh machine with an empty local cache.
    """
    tag = spec.get("tag") or f"{spec['model'].replace(':', '_')}-{spec['mode']}"
    local = workdir / f"local-{tag}-{spec.get('cache') or 'eager'}"
    env = {
        **os.environ,
        "EARTH2STUDIO_COMPILE_CACHE": str(workdir / f"bundles-{tag}"),
        "TORCHINDUCTOR_CACHE_DIR": str(local),
        "TRITON_CACHE_DIR": str(local / "triton"),
    }
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    child = MEASURE_ENSEMBLE if spec.get("mode") == "ensemble" else MEASURE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", child, json.dumps(spec), str(out)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        if proc.returncode != 0 or not out.stat().st_size:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {**spec, "error": " | ".join(tail) or f"exit {proc.returncode}"}
        return json.loads(out.read_text())
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout} s"}
    finally:
        out.unlink(missing_ok=True)


def build_one(spec: dict[str, Any], timeout: int, workdir: Path) -> dict[str, Any]:
    """Build the ahead-of-time artifacts of ``spec``'s model in a fresh process,
    into the cache root its rows share; ``build_s`` or ``build_error``."""
    tag = f"{spec['model'].replace(':', '_')}-{spec['mode']}"
    local = workdir / f"local-{tag}-build"
    env = {
        **os.environ,
        "EARTH2STUDIO_COMPILE_CACHE": str(workdir / f"bundles-{tag}"),
        "TORCHINDUCTOR_CACHE_DIR": str(local),
        "TRITON_CACHE_DIR": str(local / "triton"),
    }
    model = spec["model"]
    cmd = [sys.executable, "-m", "earth2studio_compile.tools.build"]
    cmd += ["--module", model] if ":" in model else [model, "--size", spec["size"]]
    if spec.get("device"):
        cmd += ["--device", spec["device"]]
    if spec.get("precision"):
        cmd += ["--precision", spec["precision"]]
    if spec["mode"] not in (AUTO, EAGER):
        cmd += ["--mode", spec["mode"]]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"build_error": f"timed out after {timeout} s"}
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        return {"build_s": seconds, "build_error": " | ".join(tail)}
    return {"build_s": seconds}


def say_which_path(result: dict[str, Any]) -> None:
    """Mark an ``aot`` row that did not run its artifact, with the reasons."""
    regions = (result.get("report") or {}).get("regions", [])
    declined = [d for r in regions if r.get("executor") != "aot" for d in r["declined"]]
    if regions and any(r.get("executor") != "aot" for r in regions):
        result["cache"] = "aot-declined"
        result["aot_declined"] = declined
