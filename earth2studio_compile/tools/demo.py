"""``python -m earth2studio_compile.tools.demo``: a rollout eager, then compiled.

The default model is Earth2Studio's FCN (FourCastNet) around a physicsnemo AFNO with
random weights: small grid on CPU, the operational 720x1440 grid on CUDA. Prints time
per step, speedup, first-step (compile) cost and the largest difference between
the two rollouts on the same coordinates, then shows the one-line workflow usage.
"""

from __future__ import annotations

import argparse
import sys

import torch

_TF32_NOTE = """\
  (cuDNN convolutions run in TF32, PyTorch's default on CUDA, and eager and
   compiled pick different algorithms: a larger gap than fp32 rounding alone;
   --fp32 turns TF32 off)"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``earth2studio-compile-demo``."""
    p = argparse.ArgumentParser(
        prog="earth2studio-compile-demo", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--model",
        default="fcn",
        help="fcn, dlwp, sfno, persistence or toy (default fcn)",
    )
    p.add_argument(
        "--size",
        default="auto",
        choices=["auto", "small", "full"],
        help="model size; auto: full on CUDA, small on CPU",
    )
    p.add_argument(
        "--steps", type=int, default=20, help="forecast steps (>= 3, default 20)"
    )
    p.add_argument(
        "--device", default=None, help="cuda or cpu (default: cuda if available)"
    )
    p.add_argument(
        "--fp32", action="store_true", help="turn TF32 off (cuDNN and matmul)"
    )
    args = p.parse_args(argv)
    if args.fp32:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    if args.steps < 3:
        p.error("--steps must be >= 3")
    cuda = torch.cuda.is_available()
    device = torch.device(args.device or ("cuda" if cuda else "cpu"))
    if args.size != "auto":
        size = args.size
    else:
        size = "full" if device.type == "cuda" else "small"

    from loguru import logger
    from tqdm import tqdm

    from earth2studio_compile.metrics import rel_l2
    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench.measure import time_rollout
    from earth2studio_compile.tools.bench.runs import initial_state

    # After the imports: Earth2Studio installs its own loguru handler on import.
    logger.remove()
    logger.add(lambda m: tqdm.write(m, end=""), level="INFO", colorize=True)

    model = zoo.build(args.model, size=size).to(device)
    x, coords = initial_state(model, device)
    name = f"{type(model).__name__} ({args.model}, {size}) on {device}"
    print(
        f"earth2studio-compile demo: {name}, {args.steps} steps, "
        f"torch {torch.__version__}"
    )

    eager = time_rollout(model, x, coords, args.steps)
    compiled = time_rollout(model, x, coords, args.steps, compile_kwargs={})
    pairs = list(zip(compiled.outputs, eager.outputs))
    diff = max((a - b).abs().max().item() for a, b in pairs)
    first = rel_l2(compiled.outputs[0], eager.outputs[0])
    last = rel_l2(compiled.outputs[-1], eager.outputs[-1])
    tf32 = device.type == "cuda" and torch.backends.cudnn.allow_tf32
    regions = compiled.report["regions"] if compiled.report else []
    status = ", ".join(
        f"{r['model']}.{r['region']}: {r['status']}".replace(".:", ":") for r in regions
    )
    speedup = eager.steady_ms / compiled.steady_ms

    print()
    print(
        f"  eager     {eager.steady_ms:9.2f} ms/step   "
        f"first step {eager.first_seconds:7.2f} s"
    )
    print(
        f"  compiled  {compiled.steady_ms:9.2f} ms/step   "
        f"first step {compiled.first_seconds:7.2f} s (compile)"
    )
    print(f"  speedup   {speedup:9.2f} x      (median of steps 2..{args.steps})")
    print(
        f"  rel. L2 compiled vs eager: {first:.1e} after step 1, "
        f"{last:.1e} after step {args.steps}"
    )
    print(f"  max |compiled - eager| over all steps = {diff:.2e}")
    if tf32:
        print(_TF32_NOTE)
    print(f"  compiled regions: {status or 'none'}")
    print()
    print("In a workflow:  from earth2studio_compile.run import deterministic")
    print("                deterministic(time, nsteps, model, data, io, compile=True)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
