"""Measuring: the relative error of one output against a reference, and device sync.

Shared by the library (speed and accuracy probes) and the tooling (benchmark, demo,
tests), so every figure in a report or a table is computed the same way.
"""

from __future__ import annotations

import torch

__all__ = ["rel_l2", "synchronize"]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||``, in float64.

    Parameters
    ----------
    a : torch.Tensor
        Output under test
    b : torch.Tensor
        Reference (same shape)

    Returns
    -------
    float
        Relative L2 error; ``inf`` for a zero reference and a nonzero difference
    """
    a, b = a.detach().double(), b.detach().double().to(a.device)
    diff = float(torch.linalg.vector_norm(a - b))
    norm = float(torch.linalg.vector_norm(b))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / norm


def synchronize(device: torch.device | str) -> None:
    """Wait for queued work on ``device`` (CUDA); nothing to wait for elsewhere.

    Parameters
    ----------
    device : torch.device | str
        Device whose work a timer must include
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
