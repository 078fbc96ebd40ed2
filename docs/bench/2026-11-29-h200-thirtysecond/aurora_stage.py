"""Inside Aurora's wrong Swin stage on CUDA (issue 33, thirty-second session).

The thirty-first's shadow bisection (each compiled region call beside its own eager
call on the same arguments, inside the workflow; published size, fp32 with TF32
off, H200, torch 2.11) found two regions wrong on their own inputs:
``model.backbone.encoder_layers.1`` (rel L2 0.22) and ``decoder_layers.1`` (0.11),
the two depth-10 stages on the 90x180 latent grid; the other six within 1e-6.

This script takes ``encoder_layers.1``'s arguments (and each of its blocks' and
attention layers') from one eager ``deterministic`` step, inside the workflow's
inference mode, and compiles pieces of it with plain ``torch.compile`` (no
library), each against the same piece run eagerly on the same arguments:

- the whole stage, Inductor's default mode (no CUDA graphs), in inference mode;
- the same under ``no_grad`` with the arguments copied out of inference mode (as
  the thirtieth's call 4, which found this stage right);
- each block alone, then each block's window attention alone, in inference mode.

A JSON row after every run. Usage (repository root, device wheels installed)::

    python docs/bench/2026-11-29-h200-thirtysecond/aurora_stage.py $OUT/stage.json

``AURORA_BISECT_SIZE=small AURORA_BISECT_DEVICE=cpu`` tries it on a CPU.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import earth2studio.run
import numpy as np
import torch
from earth2studio.io import KVBackend
from torch.utils._pytree import tree_leaves, tree_map

from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.tools import zoo

TIME = [np.datetime64("2024-01-01T00:00")]
SIZE = os.environ.get("AURORA_BISECT_SIZE", "full")
DEVICE = torch.device(os.environ.get("AURORA_BISECT_DEVICE", "cuda"))
STAGE = os.environ.get("AURORA_BISECT_STAGE", "encoder_layers.1")
MODES = os.environ.get("AURORA_BISECT_RUNS", "stage,stage-no-grad,blocks,attn")


def clone(t):
    return t.clone() if isinstance(t, torch.Tensor) else t


def errors(got, ref) -> list[float]:
    return [
        rel_l2(a, b)
        for a, b in zip(tree_leaves(got), tree_leaves(ref), strict=True)
        if isinstance(a, torch.Tensor) and a.is_floating_point()
    ]


def main(out: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch._dynamo.config.cache_size_limit = 64
    rows: list[dict] = []

    def keep(row: dict) -> None:
        rows.append(row)
        out.write_text(json.dumps(rows, indent=1, default=str))
        print(json.dumps(row, default=str)[:400], flush=True)

    model = zoo.build("aurora", size=SIZE).to(DEVICE)
    stage = model.model.backbone.get_submodule(STAGE)
    caught: dict[str, tuple] = {}

    def grab(name):
        def hook(module, args, kwargs):
            caught.setdefault(name, (tree_map(clone, args), tree_map(clone, kwargs)))

        return hook

    pieces = {"stage": stage}
    for i, block in enumerate(stage.blocks):
        pieces[f"block{i}"] = block
        pieces[f"attn{i}"] = block.attn
    for name, piece in pieces.items():
        piece.register_forward_pre_hook(grab(name), with_kwargs=True)
    np.random.seed(0)
    torch.manual_seed(0)
    t = time.perf_counter()
    earth2studio.run.deterministic(
        TIME,
        1,
        model,
        zoo.random_source(model),
        KVBackend(),
        device=DEVICE,
        verbose=False,
    )
    keep(
        {
            "run": "eager step",
            "seconds": time.perf_counter() - t,
            "caught": sorted(caught),
            "torch": torch.__version__,
        }
    )
    for piece in pieces.values():
        piece._forward_pre_hooks.clear()

    def trial(name: str, key: str, inference: bool = True, mode: str = "default"):
        args, kwargs = caught[key]
        piece = pieces[key]
        if not inference:
            args, kwargs = tree_map(clone, (args, kwargs))  # normal tensors now
        ctx = torch.inference_mode() if inference else torch.no_grad()
        with ctx:
            ref = piece(*args, **kwargs)
            again = piece(*args, **kwargs)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(piece, mode=mode)
        t = time.perf_counter()
        errs = []
        try:
            for _ in range(2):
                with ctx:
                    errs.append(errors(compiled(*args, **kwargs), ref))
        except Exception as err:  # a row, not the end of the run
            errs.append(f"{type(err).__name__}: {err}"[:300])
        stats = dict(torch._dynamo.utils.counters["stats"])
        keep(
            {
                "run": name,
                "piece": key,
                "inference": inference,
                "mode": mode,
                "seconds": time.perf_counter() - t,
                "rel_l2": errs,
                "eager_again": errors(again, ref),
                "stats": stats,
                "shapes": [
                    tuple(a.shape)
                    for a in tree_leaves(args)
                    if isinstance(a, torch.Tensor)
                ],
                "others": [
                    a
                    for a in tree_leaves((args, kwargs))
                    if not isinstance(a, torch.Tensor)
                ],
            }
        )

    runs = MODES.split(",")
    if "stage" in runs:
        trial("stage", "stage")
    if "stage-no-grad" in runs:
        trial("stage, no_grad, normal tensors", "stage", inference=False)
    for kind in ("attn", "blocks"):
        if kind in runs:
            for i in range(len(stage.blocks)):
                key = f"{'block' if kind == 'blocks' else 'attn'}{i}"
                trial(kind, key)
    if "stage-graphs" in runs:
        trial("stage, CUDA graphs", "stage", mode="reduce-overhead")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
