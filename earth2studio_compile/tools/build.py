"""``python -m earth2studio_compile.tools.build``: build ahead-of-time artifacts.

Builds the AOTInductor artifacts of a model's compiled regions into the package's
cache root (``EARTH2STUDIO_COMPILE_CACHE``), for one device, precision and batch
size, so that ``compile=True`` later loads them instead of compiling (see
:func:`earth2studio_compile.build`). Models: the zoo's (random weights, built
without downloads) or your own with ``--module pkg.mod:factory`` (a callable
taking no arguments and returning the model, weights loaded).

Examples
--------
.. code-block:: bash

    python -m earth2studio_compile.tools.build fcn --size full --device cuda
    python -m earth2studio_compile.tools.build --module mypkg.models:load_fcn
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from earth2studio_compile.precision import PRECISIONS


def inductor_options(text: str) -> dict[str, Any]:
    """``--options``: Inductor options as a JSON object, e.g.
    ``'{"layout_optimization": false}'`` (an argparse type)."""
    try:
        options = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err})") from err
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(
            "a JSON object of Inductor options, e.g. '{\"layout_optimization\": false}'"
        )
    return options


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, build, print one line per region; 1 if a build failed."""
    p = argparse.ArgumentParser(
        prog="python -m earth2studio_compile.tools.build",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    from earth2studio_compile.tools import zoo

    p.add_argument("model", nargs="?", choices=zoo.MODELS, help="a zoo model")
    p.add_argument("--module", help="pkg.mod:factory returning your model")
    p.add_argument("--size", choices=zoo.SIZES, default="full", help="zoo size")
    p.add_argument(
        "--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)"
    )
    p.add_argument("--precision", choices=PRECISIONS, default=None)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument(
        "--mode", default=None, help="Inductor mode (default: as compile=True)"
    )
    p.add_argument(
        "--options",
        type=inductor_options,
        default=None,
        help="Inductor options, a JSON object (part of the artifacts' key); they "
        "replace the mode's and the model table's, so add "
        "'\"triton.cudagraphs\": true' to keep CUDA graphs",
    )
    p.add_argument("--force", action="store_true", help="rebuild existing artifacts")
    a = p.parse_args(argv)
    if (a.model is None) == (a.module is None):
        p.error("give a zoo model or --module, not both")
    import torch

    import earth2studio_compile

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = zoo.build(a.module if a.module else a.model, size=a.size)
    built = earth2studio_compile.build(
        model,
        device=device,
        precision=a.precision,
        batch_size=a.batch_size,
        mode=a.mode,
        options=a.options,
        force=a.force,
    )
    for b in built:
        where = b.path if b.path is not None else b.reason
        took = f" in {b.seconds:.1f} s" if b.status in ("built", "judged") else ""
        checked = ", verified against eager" if b.verified else ""
        paid = f"; {b.payoff}" if b.payoff else ""
        print(f"{b.label}: {b.status}{took}{checked}: {where}{paid}")
    return 1 if any(b.status == "failed" for b in built) else 0


if __name__ == "__main__":
    sys.exit(main())
