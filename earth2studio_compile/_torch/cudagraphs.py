"""CUDA graph trees: marking a new step, counting Inductor's skipped graphs."""

from __future__ import annotations

import torch

from earth2studio_compile._torch.probes import missing


def mark_cudagraph_step() -> None:
    """Tell CUDA graph trees a new step starts: old outputs may be reused."""
    torch.compiler.cudagraph_mark_step_begin()


def cudagraph_skips() -> int:
    """Times Inductor skipped CUDA graphs so far in this process; 0 if unknown."""
    if missing("counters"):
        return 0
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])
