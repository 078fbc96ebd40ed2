"""Random weights under which every layer of a zoo network matters.

Networks initialised as for training often start with layers at or near zero
(physicsnemo's Song UNet's output convolutions, anemoi's noise conditioning): a
forecast made with them does not show a compiled layer that computes the wrong
thing, or a lost input. :func:`scramble` redraws them.
"""

from __future__ import annotations

import torch

__all__ = ["scramble"]


def scramble(net: torch.nn.Module, gen: torch.Generator) -> torch.nn.Module:
    """Redraw every weight of ``net`` in place so each layer's output matters:
    matrices and kernels with variance 1/fan-in (complex ones, as makani's
    spectral filters, with random phases too), biases and norm scales around 0
    and 1 (a parameter named ``*weight`` of one dimension is a scale).

    Parameters
    ----------
    net : torch.nn.Module
        The network
    gen : torch.Generator
        The draws' generator (the caller's seed; the global random state is left
        alone)

    Returns
    -------
    torch.nn.Module
        ``net``, in eval mode
    """
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() > 1:
                # A real draw into a complex filter would zero its imaginary part.
                dtype = p.dtype if p.is_complex() else None
                draw = torch.randn(p.shape, generator=gen, dtype=dtype)
                p.copy_(draw / p[0].numel() ** 0.5)
            else:
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
    return net.eval()
