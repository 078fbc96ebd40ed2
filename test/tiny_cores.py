"""Small modules that several test modules use (no heavy imports: a build process
imports this module to unpickle them). Test modules share classes through here,
never by importing one another."""

from __future__ import annotations

import functools

import torch

from earth2studio_compile.patches import MethodPatch, source_digest


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


class Holds(torch.nn.Module):
    """A model whose region is ``net``, the core it is given."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.net(*args)


class StatefulCore(torch.nn.Module):
    """A recurrent core: updates the state it is handed, in place."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.mix = torch.nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        state.mul_(0.5).add_(x)
        return self.mix(x) + state


class Blocks(torch.nn.Module):
    """Blocks of one class and different widths: each needs its own compiled code."""

    def __init__(self, n: int = 12, start: int = 4) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Linear(start + i, start + i) for i in range(n)
        )

    def run_each(self) -> list[torch.Tensor]:
        with torch.no_grad():
            return [b(torch.ones(2, b.in_features)) for b in self.blocks]


@functools.lru_cache
def window_mask(n: int, device: torch.device) -> torch.Tensor:
    """A mask made once per shape and cached, in place (Aurora's shifted-window
    masks are made so)."""
    mask = torch.zeros(n, device=device)
    mask[::3] = -100.0
    return mask


class MaskedCore(torch.nn.Module):
    """Adds a cached mask made while it runs: ``torch.export`` lifts it as a
    constant with no name in the module."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.lin(x) + window_mask(x.shape[-1], x.device), -1)


@functools.lru_cache
def window_masks(n: int, device: torch.device) -> torch.Tensor:
    """Masks of four windows, made once per shape and cached."""
    mask = torch.zeros(4, n, n, device=device)
    mask[:, ::3] = -100.0
    return mask


class WindowMaskedCore(torch.nn.Module):
    """Adds a row of each window's cached mask (a view of it), as Aurora's
    attention takes its windows' masks."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(
            self.lin(x) + window_masks(x.shape[-1], x.device)[:, 0], -1
        )


class HeldTensorCore(torch.nn.Module):
    """Holds a tensor that is neither a parameter nor a buffer: the model's own
    data, which no artifact may keep."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.offset = torch.randn(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.offset


class SteppedCore(torch.nn.Module):
    """Takes a Python rollout step beside its tensor, as Aurora's Swin stages do;
    reads it (``uses_step``: a step-dependent correction, as a LoRA per step) or
    not."""

    def __init__(self, uses_step: bool, width: int = 8) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.uses_step = uses_step

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        return self.lin(x) * (step + 1 if self.uses_step else 1)


class RecurrentCell(torch.nn.Module):
    """Keeps its state on itself, as physicsnemo's ConvGRUBlock does: a
    ``(1, 1, 1, 1)`` placeholder until a call of another shape makes a zero state
    of the input's shape, then ``self.h = h_next`` at every call (``update``
    False: only the placeholder is replaced, at a call of a new shape)."""

    def __init__(self, channels: int, update: bool = True) -> None:
        super().__init__()
        self.gate = torch.nn.Conv2d(2 * channels, channels, 1)
        self.update = update
        self.h = torch.zeros(1, 1, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != self.h.shape:
            self.h = torch.zeros_like(x)
        z = torch.sigmoid(self.gate(torch.cat([x, self.h], dim=1)))
        h_next = (1 - z) * self.h + z * torch.tanh(x)
        if self.update:
            self.h = h_next
        return x + h_next


class RecurrentCore(torch.nn.Module):
    """A convolution, then a :class:`RecurrentCell`: a region whose module keeps
    tensor state on a submodule from call to call."""

    def __init__(self, channels: int = 4, update: bool = True) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.cell = RecurrentCell(channels, update)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cell(self.conv(x))


class ConvCore(torch.nn.Module):
    """Three convolutions, one of them (``b``) made twice on inputs of one shape
    and one transposed: an artifact whose convolutions are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 4, 3, padding=2, dilation=2, groups=2)
        self.c = torch.nn.ConvTranspose2d(4, 2, 2, stride=2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.c(self.b(torch.relu(h)) * self.b(torch.sigmoid(h)))


def _linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, self.weight, self.bias)


#: A table-style method patch for every ``Linear`` submodule (as Aurora's for its
#: Swin blocks): upstream's values, and importable, as a build process needs it.
LINEAR_PATCH = MethodPatch(
    "forward",
    _linear_forward,
    source=source_digest(torch.nn.Linear.forward),
    submodules="Linear",
)


class SdpaCore(torch.nn.Module):
    """Attention through ``F.scaled_dot_product_attention`` with a mask, whose
    backend PyTorch chooses where it is traced (Aurora's windows, small)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.lin(x)
        mask = torch.zeros(8, 8)
        return torch.nn.functional.scaled_dot_product_attention(q, x, x, attn_mask=mask)


class WindowAttentionCore(torch.nn.Module):
    """Masked window attention as Aurora's Swin stages run it, small: 3 windows of
    24 tokens, 2 heads of 16, an additive mask per window (0 or -100)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        gen = torch.Generator().manual_seed(0)
        mask = (torch.rand(3, 1, 24, 24, generator=gen) > 0.7).float() * -100.0
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).reshape(3, 24, 3, 2, 16).permute(2, 0, 3, 1, 4)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=self.mask
        )
        return out.transpose(1, 2).reshape(3, 24, 32)
