"""SDPA calls as FlexAttention in traced code (earth2studio_compile._torch.flex):
the calls it serves give SDPA's answer, every other call stays SDPA's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from earth2studio_compile._torch import FlexSDPA

# Windows of 2 x 3 x 4 tokens and heads of 16: Aurora's attention, small.
WINDOWS, HEADS, TOKENS, DIM = 3, 2, 24, 16


def attend(q, k, v, mask=None, **kwargs):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)


def traced(fn, *args, **kwargs) -> tuple[torch.Tensor, bool]:
    """``fn`` compiled under FlexSDPA on the eager-running aot backend (the
    FlexAttention operator computed by its reference), and whether its graph
    holds FlexAttention."""
    seen: list[bool] = []

    def backend(gm, example_inputs):
        seen.append("flex_attention" in str(gm.graph))
        return torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(
            gm, example_inputs
        )

    torch._dynamo.reset()
    with FlexSDPA(), torch.no_grad():
        out = torch.compile(fn, backend=backend, dynamic=False)(*args, **kwargs)
    return out, any(seen)


def qkv(heads: int = HEADS, tokens: int = TOKENS, dim: int = DIM):
    gen = torch.Generator().manual_seed(0)
    shape = (WINDOWS, heads, tokens, dim)
    return tuple(torch.randn(shape, generator=gen) for _ in range(3))


def shifted(*shape: int) -> torch.Tensor:
    """An additive mask as Swin's: 0 within a sub-region, -100 across."""
    gen = torch.Generator().manual_seed(1)
    return (torch.rand(shape, generator=gen) > 0.7).float() * -100.0


@pytest.mark.parametrize(
    "mask, kwargs",
    [
        (None, {}),
        (shifted(WINDOWS, 1, TOKENS, TOKENS), {}),  # Aurora's: one per window
        (shifted(1, HEADS, TOKENS, TOKENS), {}),  # one per head
        (shifted(TOKENS, TOKENS), {"scale": 0.5}),
        (torch.rand(TOKENS, TOKENS) > 0.3, {}),  # boolean: True attends
    ],
    ids=["none", "per-window", "per-head", "2-d-scaled", "boolean"],
)
def test_a_call_it_serves_gives_sdpas_answer(mask, kwargs):
    q, k, v = qkv()
    if mask is not None and mask.dtype == torch.bool:
        mask[:, 0] = True  # no row without a key: SDPA's answer there is NaN
    expected = attend(q, k, v, mask, **kwargs)
    out, flex = traced(attend, q, k, v, mask, **kwargs)
    assert flex
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def bf16(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.bfloat16() for t in tensors)


@pytest.mark.parametrize(
    "inputs, kwargs",
    [
        (qkv(tokens=8), {}),  # fewer tokens than a tensor core tile
        (qkv(dim=24), {}),  # a head that is no power of two
        (qkv(), {"is_causal": True}),
        ((*bf16(*qkv()), shifted(WINDOWS, 1, TOKENS, TOKENS)), {}),  # fp32 mask
        ((qkv()[0], *(t[:1] for t in qkv()[1:])), {}),  # keys broadcast over windows
    ],
    ids=["few-tokens", "head-24", "causal", "mask-dtype", "broadcast-batch"],
)
def test_a_call_it_cannot_serve_stays_sdpa(inputs, kwargs):
    expected = attend(*inputs, **kwargs)
    out, flex = traced(attend, *inputs, **kwargs)
    assert not flex
    torch.testing.assert_close(out, expected)


def test_a_mask_that_does_not_broadcast_is_sdpas_error_as_without_it():
    mask = shifted(2, 1, TOKENS, TOKENS)
    with pytest.raises(RuntimeError, match="broadcast|size|shape"):
        attend(*qkv(), mask)
    # Dynamo's error around SDPA's: the call was handed on, not made FlexAttention.
    with pytest.raises(Exception, match="broadcast"):
        traced(attend, *qkv(), mask)


# Inductor's lowering, on the devices it is chosen for (CUDA) and on an AVX-512
# CPU: its CPU template computed masks a region builds into NaNs or answers 28%
# off on an AVX2 CPU (torch 2.11, CI, 2026-12-01), where the library keeps SDPA
# (options.FLEX_DEVICES).
DEVICES = [
    pytest.param("cuda", marks=pytest.mark.gpu),
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            torch.backends.cpu.get_cpu_capability() != "AVX512",
            reason="Inductor's CPU FlexAttention is wrong without AVX-512 (torch 2.11)",
        ),
    ),
]
# Triton's fp32 tiles sum in another order than SDPA's CUDA kernels.
TOLERANCE = {"cpu": 1e-5, "cuda": 1e-4}


@pytest.mark.parametrize("device", DEVICES)
def test_inductor_compiles_it_to_sdpas_answer_and_the_mode_ends_with_its_block(
    device,
):
    q, k, v = (t.to(device) for t in qkv())
    mask = shifted(WINDOWS, 1, TOKENS, TOKENS).to(device)
    torch._dynamo.reset()
    compiled = torch.compile(attend, dynamic=False)
    with FlexSDPA(), torch.no_grad():
        out = compiled(q, k, v, mask)
    tol = TOLERANCE[device]
    torch.testing.assert_close(out, attend(q, k, v, mask), rtol=tol, atol=tol)
    assert torch._C._len_torch_function_stack() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_mask_the_traced_code_computes_compiles_to_sdpas_answer(device):
    """Regression: Aurora's mask, repeated over the batch inside the region,
    reached FlexAttention's lowering as a buffer of flexible layout, and Inductor
    failed ("convert FlexibleLayout to FixedLayout first" on an H200, "All the
    buffers in the score and mask subgraph should be in kernel_group.args.
    input_buffers" here): every Swin stage fell back to eager (2026-12-01)."""
    base = shifted(WINDOWS, TOKENS, TOKENS).to(device)

    def repeated(q, k, v, base):
        times = q.shape[0] // base.shape[0]
        mask = base.unsqueeze(1).unsqueeze(0).repeat(times, 1, 1, 1, 1)
        return attend(q, k, v, mask.reshape(-1, 1, TOKENS, TOKENS))

    # Two samples of three windows.
    q, k, v = (torch.cat([t, t]).to(device) for t in qkv())
    torch._dynamo.reset()
    compiled = torch.compile(repeated, dynamic=False)
    with FlexSDPA(), torch.no_grad():
        out = compiled(q, k, v, base)
    tol = TOLERANCE[device]
    torch.testing.assert_close(out, repeated(q, k, v, base), rtol=tol, atol=tol)
