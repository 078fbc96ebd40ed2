"""SDPA calls as FlexAttention in code traced by Dynamo (the attention choice "flex").

SDPA's math path, traced, computes an attention as two batched matmuls around a
softmax that writes every score; its fused kernels do not take an fp32 additive
mask on tensor cores. FlexAttention compiles the whole call, mask included, into
one Triton kernel that never writes the scores: Aurora's masked window attention
(windows of 144 tokens, heads of 64, TF32) ran 1.7-1.9x faster a call than on the
traced math path (H200, torch 2.11, 2026-12-01,
docs/bench/2026-12-01-h200-fortysecond). :class:`FlexSDPA` routes the calls it
can serve exactly as SDPA defines them, and passes every other call on to SDPA.

Only Dynamo can compile it: AOTInductor's compile of an exported flex attention
fails (pytorch/pytorch#140400), so a region with this choice gets no artifact
(:data:`NO_ARTIFACT`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: Why a region whose attention runs through FlexAttention gets no artifact.
NO_ARTIFACT = (
    "FlexAttention (its attention choice) needs the Dynamo path: AOTInductor cannot "
    "compile it yet (pytorch/pytorch#140400)"
)
# Below a tensor core tile, the Triton kernel's blocks are mostly padding (Aurora's
# Perceiver attends 4 latent levels to 13 pressure levels): SDPA keeps those.
MIN_TOKENS = 16


@torch.library.custom_op("earth2studio_compile::fixed_copy", mutates_args=())
def fixed_copy(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``x`` that Inductor cannot fuse: an external kernel's
    output, so its layout is fixed when FlexAttention's kernel reads it.

    A mask a traced region computes (Aurora's, repeated over the batch) reached
    FlexAttention's lowering as a buffer of flexible layout, which Inductor's
    template cannot index: "convert FlexibleLayout to FixedLayout first" on an
    H200, "All the buffers in the score and mask subgraph should be in
    kernel_group.args.input_buffers" on the CPU (torch 2.11; pytorch/pytorch
    #139836's kind). One copy of the mask a call (Aurora's largest: 149 MB).
    """
    return x.clone(memory_format=torch.contiguous_format)


@fixed_copy.register_fake
def _fixed_copy_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


class FlexSDPA(TorchFunctionMode):
    """While active, ``F.scaled_dot_product_attention`` calls that FlexAttention
    computes as SDPA defines them run through
    :func:`torch.nn.attention.flex_attention.flex_attention`: 4-d inputs of one
    dtype and batch, at least :data:`MIN_TOKENS` queries and keys, heads of a
    power of two from 16, no dropout, not causal, and no mask or a mask
    broadcastable to the scores (additive, or boolean: True attends). Others run
    on SDPA as called.

    Eager FlexAttention is a slow reference implementation: enter it only around
    calls Dynamo compiles (:meth:`~earth2studio_compile.options.CompilePolicy.
    tracing`).
    """

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = _as_flex(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _as_flex(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """The call through FlexAttention, or None where it must stay SDPA's."""
    from torch.nn.attention.flex_attention import flex_attention

    if dropout_p or is_causal:
        return None
    if not _servable(query, key, value, attn_mask, enable_gqa):
        return None
    kwargs: dict[str, Any] = {"scale": scale, "enable_gqa": enable_gqa}
    if attn_mask is None:
        return flex_attention(query, key, value, **kwargs)
    mask = fixed_copy(attn_mask)
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    # A broadcast dimension reads index 0, as SDPA broadcasts the mask.
    full = [dim > 1 for dim in mask.shape]

    def entry(*at: Any) -> Any:
        return mask[tuple(i if f else 0 for i, f in zip(at, full, strict=True))]

    if mask.dtype == torch.bool:

        def keep(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
            return torch.where(entry(b, h, q, kv), score, -math.inf)

        return flex_attention(query, key, value, score_mod=keep, **kwargs)

    def add(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        return score + entry(b, h, q, kv)

    return flex_attention(query, key, value, score_mod=add, **kwargs)


def _servable(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    enable_gqa: bool,
) -> bool:
    tensors = (query, key, value)
    if any(t.dim() != 4 for t in tensors) or len({t.dtype for t in tensors}) > 1:
        return False
    # Batches SDPA broadcasts, and heads shared without enable_gqa: SDPA's own.
    if len({t.shape[0] for t in tensors}) > 1 or key.shape[1] != value.shape[1]:
        return False
    if query.shape[1] != key.shape[1] and not enable_gqa:
        return False
    head = query.shape[-1]
    if head < 16 or head & (head - 1) or {key.shape[-1], value.shape[-1]} != {head}:
        return False
    if min(query.shape[-2], key.shape[-2]) < MIN_TOKENS:
        return False
    if mask is None:
        return True
    shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    if mask.dim() > 4 or (mask.dtype != torch.bool and mask.dtype != query.dtype):
        return False
    padded = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    return all(m in (1, s) for m, s in zip(padded, shape, strict=True))
