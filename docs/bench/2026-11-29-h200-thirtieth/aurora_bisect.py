"""Where Aurora's compiled answers part from eager's on CUDA (issue 33, thirtieth
session): the published-size zoo Aurora, fp32 with TF32 off, 2-step
``deterministic`` calls from the same seeded data, each against eager per variable
and per lead time. Not yet run (written for the next session's device time).

Phases (one process each, a JSON row written after every run):

- ``subsets``: eager with TF32 *on* against eager with it off (does TF32-sized
  rounding give the compiled error's size and pattern?), then ``compile=True``'s
  path (the table's entry, its CUDA refusal lifted) over the Perceiver regions
  only, the encoder stages only, the decoder stages only. The precision flags
  are read eagerly around each Swin stage (hooks on the backbone, which stays
  eager) and after each call.
- ``modes``: every region, CUDA graphs off (``mode="default"``), then every
  region with CUDA graphs on again in the same process.
- ``shadow``: every region as ``compile=True`` runs them, each compiled call
  followed by the region's own eager call on the same arguments (the library's
  eager path, inside the workflow's inference mode): which region, at which call
  (1: the first, 2: the CUDA graph's recording), parts from eager on its own inputs.

Usage (repository root, device wheels installed as the twenty-seventh README says)::

    python docs/bench/2026-11-29-h200-thirtieth/aurora_bisect.py subsets $OUT/x.json

``AURORA_BISECT_SIZE=small AURORA_BISECT_DEVICE=cpu`` tries the script on a CPU.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import earth2studio.run
import numpy as np
import torch
from earth2studio.io import KVBackend

from earth2studio_compile import CompileSession
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.models import MODEL_TABLE, lookup
from earth2studio_compile.tools import zoo

# Compiled in this process (thirty-second session): with background builds on (the
# CUDA default since the twenty-eighth) every region ran eagerly while its artifact
# built, and the bisection compared eager with eager.
os.environ.setdefault("EARTH2STUDIO_COMPILE_BACKGROUND", "off")
TIME = [np.datetime64("2024-01-01T00:00")]
SIZE = os.environ.get("AURORA_BISECT_SIZE", "full")
DEVICE = torch.device(os.environ.get("AURORA_BISECT_DEVICE", "cuda"))
PERCEIVER = ("model.encoder.level_agg", "model.decoder.level_decoder")
ENCODER = ("model.backbone.encoder_layers.*",)
DECODER = ("model.backbone.decoder_layers.*",)


def flags() -> dict:
    return {
        "matmul_fp32_precision": torch.backends.cuda.matmul.fp32_precision,
        "cudnn_fp32_precision": torch.backends.cudnn.fp32_precision,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "autocast": torch.is_autocast_enabled("cuda"),
    }


def main(phase: str, out: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rows: list[dict] = []

    def keep(row: dict) -> None:
        rows.append(row)
        out.write_text(json.dumps(rows, indent=1, default=str))
        print(json.dumps(row, default=str)[:600], flush=True)

    model = zoo.build("aurora", size=SIZE).to(DEVICE)
    key, spec = lookup(model)
    MODEL_TABLE[key] = replace(spec, devices_refused={})
    start = {k: v.clone() for k, v in model.state_dict().items()}
    seen: list[dict] = []
    model.model.backbone.register_forward_pre_hook(lambda m, a: seen.append(flags()))

    def call(**session) -> dict[str, torch.Tensor]:
        with torch.inference_mode():
            model.load_state_dict(start)
        model.preds_idx = 0
        np.random.seed(0)
        torch.manual_seed(0)
        io = KVBackend()
        source = zoo.random_source(model)
        args = (TIME, 2, model, source, io)
        kwargs = dict(device=DEVICE, verbose=False)
        if session:
            with CompileSession(model, **session) as s:
                earth2studio.run.deterministic(*args, **kwargs)
            call.summary = s.report.summary()
        else:
            earth2studio.run.deterministic(*args, **kwargs)
        return {k: v.clone() for k, v in io.root.items() if k != "time"}

    def compare(name: str, got: dict, ref: dict, seconds: float, **more) -> None:
        per_lead = {}
        for lead in (1, 2):
            e = {
                v: rel_l2(got[v][:, lead], ref[v][:, lead])
                for v in ref
                if ref[v].ndim > 2
            }
            worst = max(e, key=e.get)
            per_lead[lead] = {
                "median": float(np.median(list(e.values()))),
                "worst": (worst, e[worst]),
            }
        keep({"run": name, "seconds": seconds, "per_lead": per_lead, **more})

    t = time.perf_counter()
    eager = call()
    keep({"run": "eager", "seconds": time.perf_counter() - t, "flags": seen[-1]})
    # AURORA_BISECT_REGIONS (thirty-second session): a comma-separated subset.
    chosen = os.environ.get("AURORA_BISECT_REGIONS")
    every = {
        "regions": tuple(chosen.split(","))
        if chosen
        else (*PERCEIVER, *ENCODER, *DECODER)
    }
    shadows: list[dict] = []
    if phase == "subsets":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        t = time.perf_counter()
        tf32 = call()
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        compare("eager tf32", tf32, eager, time.perf_counter() - t, flags=seen[-1])
        runs = {
            "perceiver": {"regions": PERCEIVER},
            "encoder": {"regions": ENCODER},
            "decoder": {"regions": DECODER},
        }
    elif phase == "modes":
        runs = {"all, no CUDA graphs": {"mode": "default"}, "all, CUDA graphs": every}
    elif phase == "shadow":
        shadow(shadows)
        runs = {"all, each call shadowed by eager": every}
    else:
        raise SystemExit(f"phase: shadow, subsets or modes, not {phase!r}")
    for name, session in runs.items():
        seen.clear()
        t = time.perf_counter()
        got = call(**session)
        more = {"shadows": shadows} if shadows else {}
        compare(
            name,
            got,
            eager,
            time.perf_counter() - t,
            flags=seen,
            after=flags(),
            summary=call.summary,
            **more,
        )


def shadow(shadows: list[dict]) -> None:
    """Follow each compiled region call with the region's own eager call on the
    same arguments, and keep their relative L2 in ``shadows``."""
    from earth2studio_compile.region import CompiledRegion

    run = CompiledRegion._run

    def shadowed(self, call, laps=None):
        out = run(self, call, laps)
        ref = self._eager(call, count=False)
        pairs = zip(
            torch.utils._pytree.tree_leaves(out),
            torch.utils._pytree.tree_leaves(ref),
            strict=True,
        )
        shadows.append(
            {
                "region": self.report.region,
                "call": self.report.calls,
                "rel_l2": [
                    rel_l2(a, b)
                    for a, b in pairs
                    if isinstance(a, torch.Tensor) and a.is_floating_point()
                ],
            }
        )
        return out

    CompiledRegion._run = shadowed


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
