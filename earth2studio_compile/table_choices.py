"""Compile choices a model table entry makes per device and precision, each measured.

A :class:`~earth2studio_compile.spec.ModelSpec` may name a function instead of a
fixed value for ``inductor_options`` or ``attention_backends``: it is asked with
the device of a region's first input and the region's precision when the region's
policy is resolved (:meth:`~earth2studio_compile.options.CompilePolicy.resolve`).
"""

from __future__ import annotations

import torch

from earth2studio_compile.precision import tf32_under

__all__ = ["aurora_attention_backends", "sfno_inductor_options"]


def aurora_attention_backends(
    device: torch.device, precision: str | None = None
) -> tuple[str, ...]:
    """SDPA backends Aurora's compiled regions are traced with, measured on an H200.

    With TF32 matmuls, PyTorch's eager SDPA picks its fp32 memory-efficient kernel
    for Aurora's masked window attention, which runs on CUDA cores at ~11 TFLOP/s
    (181 ms of a 732 ms step). Traced on SDPA's math path, Inductor computes it as
    two TF32 batched matmuls around a fused softmax: the compiled step took 536 ms,
    against 607 ms compiled with the fused kernel (H200, torch 2.11, 2026-11-30,
    docs/bench/2026-11-30-h200-fortieth). Eager on the math path is slower (798
    ms), so eager calls keep PyTorch's choice. With fp32 matmuls the math path
    would be fp32 GEMMs on CUDA cores, and in bf16 eager has flash attention: both
    keep PyTorch's choice (not measured).

    Parameters
    ----------
    device : torch.device
        Device of the region's first input
    precision : str | None, optional
        The region's precision, by default None: PyTorch's TF32 flags as they are

    Returns
    -------
    tuple[str, ...]
        ``("math",)`` on CUDA with TF32 matmuls, else empty
    """
    matmul_tf32, _ = tf32_under(precision)
    if device.type == "cuda" and precision != "bf16" and matmul_tf32:
        return ("math",)
    return ()


def sfno_inductor_options(
    device: torch.device, precision: str | None = None
) -> dict[str, bool]:
    """Inductor options for SFNO's 1x1-convolution MLPs, measured on an H100.

    Inductor's channels-last layout for the 1x1 convolutions made the step slower
    than eager (0.93x in fp32), so it is off. Running them as matrix multiplies
    helps (1.12x in fp32) only where that keeps their precision: cuDNN and cuBLAS
    must agree on TF32. With PyTorch's defaults (TF32 convolutions, fp32 matmuls)
    it would turn TF32 convolutions into fp32 GEMMs (0.77x). Under bf16, where both
    are bf16, matrix multiplies were slower again: FCN3's block MLP of the same
    form took 11.21 ms so against 6.89 as cuDNN's convolutions (H200, 2026-12-01,
    docs/bench/2026-12-01-h200-fortyfourth; SFNO's own shape not measured).

    Parameters
    ----------
    device : torch.device
        Device of the region's first input
    precision : str | None, optional
        The region's precision, by default None: PyTorch's TF32 flags as they
        are. A region in a precision runs under the flags that precision pins,
        whatever they are when it is resolved: a ``build(precision="tf32")``
        under PyTorch's defaults chose other options than a forecast under TF32
        flags, and missed its artifact and figures (H200, 2026-11-30)

    Returns
    -------
    dict[str, bool]
        Inductor options
    """
    options = {"layout_optimization": False}
    # Read without raising: legacy getters raise for users of the per-backend flags.
    matmul_tf32, conv_tf32 = tf32_under(precision)
    if device.type == "cuda" and precision != "bf16" and conv_tf32 == matmul_tf32:
        options["conv_1x1_as_mm"] = True
    return options
