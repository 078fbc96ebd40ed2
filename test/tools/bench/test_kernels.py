"""Kernel families of a profile (earth2studio_compile.tools.bench.kernels)."""

from __future__ import annotations

import pytest

from earth2studio_compile.tools.bench.kernels import _family


@pytest.mark.parametrize(
    "kernel, family",
    [
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", "gemm"),
        ("ampere_sgemm_128x64_tn", "gemm"),
        ("regular_fft_factor<...>", "fft"),
        ("cudnn::winograd_nonfused::winogradForwardData4x4", "conv"),
        ("triton_poi_fused_add_gelu_0", "triton"),
        ("Memcpy DtoD (Device -> Device)", "copy"),
        (
            "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>",
            "other",
        ),
    ],
)
def test_kernel_families(kernel, family):
    assert _family(kernel) == family
