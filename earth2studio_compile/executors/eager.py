"""The module's own call, as an executor: after a fallback, and to compare."""

from __future__ import annotations

from typing import Any

import torch

from earth2studio_compile import _torch
from earth2studio_compile.executors.base import Measured
from earth2studio_compile.metrics import Laps


class EagerExecutor:
    """The module's own call: what a region runs after a fallback and to compare."""

    name = "eager"
    cudagraphs = False
    source = None
    not_compiled = None
    keepable = False
    compiling = False

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.measured = Measured()  # nothing to record: the region counts its calls

    def first_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], laps: Laps
    ) -> Any:
        """Nothing to build: the call, as its first run.

        See :meth:`~earth2studio_compile.executors.base.Executor.first_call`.
        """
        out = self(*args, **kwargs)
        laps.lap("first_run")
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _torch.call_module(self.module, args, kwargs)

    def detach(self) -> None:
        """Nothing is kept of an eager executor."""

    def free_graphs(self) -> None:
        """Nothing: it records no CUDA graphs."""

    def release(self) -> None:
        """Nothing is claimed for other processes."""
