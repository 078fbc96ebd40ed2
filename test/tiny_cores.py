"""Small modules for tests that hand a core to another process (no heavy imports:
a build process imports this module to unpickle them)."""

from __future__ import annotations

import torch


class TinyCore(torch.nn.Module):
    """Two linear layers: an ahead-of-time build of it takes seconds on a CPU."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.a = torch.nn.Linear(width, 2 * width)
        self.b = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class TinyModel(torch.nn.Module):
    """A model whose region is ``core``."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.core = TinyCore(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.core(x)
