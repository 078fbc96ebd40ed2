"""A bitwise-identical patch of anemoi-models' SDPA attention, for the AIFS family.

anemoi-models' ``SDPAAttentionWrapper`` (the attention AIFS runs on PyTorch's SDPA)
keeps its sliding-window mask as a plain tensor attribute, made at its first call.
An ahead-of-time artifact must not keep such a tensor (a model's own data, not
made by its code as far as the export can tell): AIFS2ENS's processor was refused
one, and every process compiled it on the Dynamo path at its first call (2.3 s on
an H200 at the published size: a 20-step call ran it eagerly). The patch makes the
mask as upstream does, in the traced graph (the artifact computes it) and, for
eager calls, through a cache of its own keyed by the mask's arguments.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from earth2studio_compile.patches import MethodPatch

__all__ = ["AIFS_WINDOW_MASK", "sdpa_wrapper_forward", "window_mask"]


def _made_mask(seq_len: int, window_size: int, device: torch.device) -> torch.Tensor:
    """anemoi-models 0.11.2's ``SDPAAttentionWrapper.update_mask``, as a function
    (:func:`window_mask` says what it makes)."""
    return (
        torch.abs(
            torch.arange(seq_len, device=device).unsqueeze(0)
            - torch.arange(seq_len, device=device).unsqueeze(1)
        )
        <= window_size
    )


# Decorated, not wrapped by assignment: a background build pickles the patch, its
# ``release`` with it, and pickle finds this cache by its name.
@functools.lru_cache(maxsize=2)
def window_mask(seq_len: int, window_size: int, device: torch.device) -> torch.Tensor:
    """The sliding-window mask, True where two positions are at most
    ``window_size`` apart, as anemoi-models 0.11.2's
    ``SDPAAttentionWrapper.update_mask`` makes it; kept per arguments for eager
    calls (two at most: one model's processor asks for one), where upstream keeps
    one per attention layer, and let go of when the session's patches are removed
    (:data:`AIFS_WINDOW_MASK`'s ``release``).

    Parameters
    ----------
    seq_len : int
        Sequence length
    window_size : int
        Half the window
    device : torch.device
        Where it is made

    Returns
    -------
    torch.Tensor
        Boolean ``(seq_len, seq_len)``
    """
    return _made_mask(seq_len, window_size, device)


def sdpa_wrapper_forward(
    self: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    batch_size: int,
    causal: bool = False,
    window_size: int | None = None,
    dropout_p: float = 0.0,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """anemoi-models 0.11.2's ``SDPAAttentionWrapper.forward``, its window mask from
    :func:`window_mask` instead of the instance's attribute.

    Upstream's ``softcap`` and ``alibi_slopes`` checks make an exception without
    raising it: left out, as they change nothing. The instance's own ``mask`` is
    left as it was; without a window it is still what the call uses.

    Parameters
    ----------
    self : Any
        The wrapper
    query, key, value : torch.Tensor
        As SDPA takes them
    batch_size : int
        Unused, as upstream
    causal : bool, optional
        Causal attention, by default False
    window_size : int | None, optional
        Sliding-window half width, by default None (the instance's mask)
    dropout_p : float, optional
        Dropout probability, by default 0.0
    softcap, alibi_slopes : optional
        Unsupported by SDPA, as upstream (ignored)

    Returns
    -------
    torch.Tensor
        The attention's output
    """
    mask = self.mask
    if window_size is not None:
        n = query.shape[-2]
        # Traced (Dynamo, export), made in the graph: a kept one would be baked
        # into an artifact as a constant (1.6 GB at the published size).
        if torch.compiler.is_compiling():
            mask = _made_mask(n, window_size, query.device)
        else:
            mask = window_mask(n, window_size, query.device)
    return self.attention(
        query, key, value, attn_mask=mask, is_causal=causal, dropout_p=dropout_p
    )


AIFS_WINDOW_MASK = MethodPatch(
    name="forward",
    replacement=sdpa_wrapper_forward,
    # anemoi-models 0.11.2's SDPAAttentionWrapper.forward
    source="342841e9672f84e2",
    why=(
        "the sliding-window mask made through a cache of its own, not kept on "
        "the instance: an ahead-of-time artifact may then serve the processor"
    ),
    submodules="SDPAAttentionWrapper",
    # The published processor's mask is 1.6 GB: none kept past the session.
    release=window_mask.cache_clear,
)
