"""Measuring: the relative error of one output against a reference, device sync, and
consecutive wall-time laps.

Shared by the library (speed and accuracy probes) and the tooling (benchmark, demo,
tests), so every figure in a report or a table is computed the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["Laps", "rel_l2", "synchronize", "timed", "worst_rel_l2"]

T = TypeVar("T")


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


def worst_rel_l2(a: torch.Tensor, b: torch.Tensor, dim: int) -> tuple[int, float]:
    """The largest :func:`rel_l2` over the slices of ``dim`` (a ``variable``
    axis), and its index.

    One relative L2 over a whole state is dominated by its largest fields
    (geopotential near 1e5 beside humidity near 1e-3): an error in a small field
    does not show in it. Slice by slice, it does.

    Parameters
    ----------
    a : torch.Tensor
        Output under test
    b : torch.Tensor
        Reference (same shape)
    dim : int
        The axis whose slices are compared one by one

    Returns
    -------
    tuple[int, float]
        Index along ``dim`` of the worst slice, and its relative L2
    """
    errors = [rel_l2(x, y) for x, y in zip(a.unbind(dim), b.unbind(dim), strict=True)]
    worst = max(range(len(errors)), key=errors.__getitem__)
    return worst, errors[worst]


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


def timed(
    device: torch.device,
    run: Callable[[], T],
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[T, float]:
    """``run()`` and the seconds it took on ``device`` (synchronised before and
    after, so queued work is neither left out nor counted twice).

    Parameters
    ----------
    device : torch.device
        Device whose work the time must include
    run : Callable[[], T]
        The work
    clock : Callable[[], float], optional
        Seconds, by default :func:`time.perf_counter`

    Returns
    -------
    tuple[T, float]
        ``run()``'s output and its seconds
    """
    synchronize(device)
    start = clock()
    out = run()
    synchronize(device)
    return out, clock() - start


class Laps:
    """Wall time cut into consecutive named laps that add up to the whole.

    Each lap starts where the previous one ended, on one clock, so the laps sum to
    the time from the start to the last lap exactly: no time escapes every phase.
    A lap may name pieces measured inside it (the backend's seconds within a
    compiled call); the lap's own name keeps the rest of it.

    Parameters
    ----------
    clock : Callable[[], float], optional
        Seconds, by default :func:`time.perf_counter`
    start : float | None, optional
        Where the first lap starts, by default now
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        start: float | None = None,
    ) -> None:
        self.clock = clock
        self.start = self.last = clock() if start is None else start
        self.phases: dict[str, float] = {}

    def lap(self, name: str, **inside: float) -> float:
        """End the current lap as ``name``; its seconds.

        ``inside`` are seconds of pieces measured within this lap, each added under
        its own name; ``name`` gets the rest of the lap.

        Parameters
        ----------
        name : str
            The lap's phase
        **inside : float
            Seconds of pieces within the lap, by name

        Returns
        -------
        float
            The whole lap's seconds
        """
        now = self.clock()
        seconds, self.last = now - self.last, now
        for piece, value in inside.items():
            self._add(piece, value)
        self._add(name, max(0.0, seconds - sum(inside.values())))
        return seconds

    def child(self) -> Laps:
        """Laps that start where these stand now (one attempt, kept or discarded)."""
        return Laps(self.clock, start=self.last)

    def merge(self, child: Laps) -> None:
        """Take ``child``'s laps as these laps' next ones."""
        for name, value in child.phases.items():
            self._add(name, value)
        self.last = child.last

    @property
    def seconds(self) -> float:
        """From the start to the end of the last lap: the sum of the laps."""
        return self.last - self.start

    def _add(self, name: str, value: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + value
