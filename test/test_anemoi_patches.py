"""anemoi-models' SDPA wrapper patched (earth2studio_compile.anemoi_patches): the
same answer as its own forward, written out here as a stand-in; the installed
class's own source is checked by test/tools/zoo/test_aifs.py where it is there."""

from __future__ import annotations

import torch

from earth2studio_compile.anemoi_patches import (
    AIFS_WINDOW_MASK,
    sdpa_wrapper_forward,
    window_mask,
)


class _Wrapper(torch.nn.Module):
    """anemoi-models 0.11.2's ``SDPAAttentionWrapper``, its mask kept on itself."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = torch.nn.functional.scaled_dot_product_attention
        self.mask: torch.Tensor | None = None

    def forward(self, query, key, value, batch_size, causal=False, window_size=None):
        n = query.shape[-2]
        if window_size is not None and (
            self.mask is None or tuple(self.mask.shape) != (n, n)
        ):
            self.mask = (
                torch.abs(torch.arange(n).unsqueeze(0) - torch.arange(n).unsqueeze(1))
                <= window_size
            )
        return self.attention(query, key, value, attn_mask=self.mask, is_causal=causal)


def test_the_patched_forward_gives_upstreams_answer_bit_for_bit():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 40, 8) for _ in range(3))
    for window in (1, 5, 39):
        want = _Wrapper()(q, k, v, 2, window_size=window)
        got = sdpa_wrapper_forward(_Wrapper(), q, k, v, 2, window_size=window)
        assert torch.equal(got, want), window


def test_without_a_window_the_instances_own_mask_serves_as_upstream():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 4) for _ in range(3))
    upstream, patched = _Wrapper(), _Wrapper()
    upstream.mask = patched.mask = torch.rand(12, 12) > 0.5
    want = upstream(q, k, v, 1)
    assert torch.equal(sdpa_wrapper_forward(patched, q, k, v, 1), want)
    assert torch.equal(
        sdpa_wrapper_forward(_Wrapper(), q, k, v, 1), _Wrapper()(q, k, v, 1)
    )


def test_the_mask_is_made_once_per_arguments_and_the_instance_keeps_none():
    window_mask.cache_clear()
    wrapper = _Wrapper()
    q = torch.randn(1, 1, 16, 4)
    sdpa_wrapper_forward(wrapper, q, q, q, 1, window_size=3)
    sdpa_wrapper_forward(wrapper, q, q, q, 1, window_size=3)
    assert window_mask.cache_info().hits == 1 and window_mask.cache_info().misses == 1
    assert wrapper.mask is None
    assert AIFS_WINDOW_MASK.submodules == "SDPAAttentionWrapper"


def test_the_kept_mask_is_let_go_of_when_the_patches_are_removed():
    """The published processor's mask is 1.6 GB on the GPU: a module-level cache
    would hold it for the life of the process."""
    import dataclasses

    from earth2studio_compile.patches import Patches, source_digest

    patch = dataclasses.replace(
        AIFS_WINDOW_MASK, source=source_digest(_Wrapper.forward), submodules="_Wrapper"
    )
    window_mask.cache_clear()
    wrapper = _Wrapper()
    q = torch.randn(1, 1, 16, 4)
    with Patches([(wrapper, patch)]):
        wrapper(q, q, q, 1, window_size=2)
        assert window_mask.cache_info().currsize == 1 and wrapper.mask is None
    assert window_mask.cache_info().currsize == 0


def test_traced_the_mask_is_made_in_the_graph_not_kept():
    """An eager call keeps the mask; an export after it would have found that real
    tensor and baked it into the artifact (a 1.6 GB constant at AIFS's published
    size): traced, the mask is made in the graph."""

    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wrapper = _Wrapper()

        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return sdpa_wrapper_forward(self.wrapper, q, q, q, 1, window_size=2)

    window_mask.cache_clear()
    q = torch.randn(1, 1, 16, 4)
    eager = Holder()(q)  # keeps the mask
    assert window_mask.cache_info().currsize == 1
    program = torch.export.export(Holder(), (q,), strict=False)
    assert not program.constants, list(program.constants)
    assert torch.equal(program.module()(q), eager)


def test_the_patch_pickles_as_a_background_builds_payload_carries_it():
    """A background build pickles the region's target, its patches with it."""
    import pickle

    assert pickle.loads(pickle.dumps(AIFS_WINDOW_MASK)) == AIFS_WINDOW_MASK
