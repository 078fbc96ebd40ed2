"""Reduced precision inside compiled regions: opt-in, scoped, and measured on every run.

A precision applies only while a region's core runs, compiled or eager, and PyTorch's
global settings are restored after each call, also on exceptions:

``"fp32"``
    TF32 off for matmuls and convolutions: full fp32 arithmetic
``"tf32"``
    TF32 on for matmuls and convolutions (tensor cores, 10-bit mantissa inputs)
``"bf16"``
    :func:`torch.autocast` to bfloat16 around the core; TF32 off for what autocast
    leaves in fp32. Submodules the model table lists in ``fp32_modules`` (spectral
    convolutions, say) run outside autocast, in fp32
``None``
    PyTorch's global settings, untouched (the default)

Outputs come back in their input's dtype, so coordinate code and IO see fp32. Users of
the workflows' ``compile=True`` choose a precision with the environment variable
``EARTH2STUDIO_COMPILE_PRECISION``.

The cost in accuracy is measured, not assumed: once per region, the first reduced-
precision call is repeated in fp32 eager (TF32 off) on copies of its inputs and
buffers, and the relative L2 of the difference goes into the report, with a WARNING
above :data:`THRESHOLDS`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile._torch import tree_flatten, tree_map
from earth2studio_compile.metrics import rel_l2

__all__ = [
    "ENV",
    "PRECISIONS",
    "THRESHOLDS",
    "check_precision",
    "env_precision",
    "KeepFp32",
    "reference_error",
    "scope",
]

PRECISIONS = ("fp32", "tf32", "bf16")
ENV = "EARTH2STUDIO_COMPILE_PRECISION"
# Relative L2 after one call above which a region's precision earns a WARNING: the
# targets measured on an H100 for FCN, DLWP and an SFNO-class model (TF32 4e-4 to
# 1.8e-3, bf16 4e-3 to 1e-2, docs/performance.md) with headroom for one step.
THRESHOLDS = {"fp32": 1e-4, "tf32": 3e-3, "bf16": 3e-2}


def check_precision(value: Any, name: str = "precision") -> str | None:
    """Validate a precision choice.

    Parameters
    ----------
    value : Any
        ``None`` or one of :data:`PRECISIONS`
    name : str, optional
        Where it came from, for the error

    Returns
    -------
    str | None
        The precision

    Raises
    ------
    ValueError
        Anything else, naming the choices
    """
    if value is None or (isinstance(value, str) and value in PRECISIONS):
        return value
    raise ValueError(
        f"{name} must be one of {list(PRECISIONS)} or None (PyTorch's global "
        f"settings), got {value!r}."
    )


def env_precision() -> str | None:
    """The precision ``EARTH2STUDIO_COMPILE_PRECISION`` asks for (unset or empty: None).

    Raises
    ------
    ValueError
        The variable names no precision
    """
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "none", "default"):
        return None
    return check_precision(value, f"{ENV}={value!r}")


@contextlib.contextmanager
def scope(precision: str | None, device: torch.device) -> Iterator[None]:
    """Run a block in ``precision``; every global setting is restored afterwards.

    Parameters
    ----------
    precision : str | None
        One of :data:`PRECISIONS`, or None for no change
    device : torch.device
        Device the block computes on (the autocast device type)
    """
    if precision is None:
        yield
        return
    matmul, cudnn = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    tf32 = precision == "tf32"
    try:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if precision == "bf16":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                yield
        else:
            # An enclosing autocast (the user's) would silently lower "fp32".
            with torch.autocast(device.type, enabled=False):
                yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def restore_dtype(out: Any, precision: str | None, args: Any) -> Any:
    """Cast what autocast lowered (bf16/fp16 outputs) back to the dtype of ``args``.

    Only ``"bf16"`` lowers outputs; other precisions return ``out`` without looking
    at the arguments, so the common call path pays nothing.
    """
    if precision != "bf16":
        return out
    dtype = input_dtype(args)
    low = (torch.bfloat16, torch.float16)
    if dtype is None or dtype in low:
        return out
    return tree_map(
        lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype in low else t,
        out,
    )


def input_dtype(args: Any) -> torch.dtype | None:
    """The dtype of the first floating-point tensor among ``args``."""
    leaves, _ = tree_flatten(args)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return leaf.dtype
    return None


def call(
    precision: str | None,
    device: torch.device,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``fn(*args, **kwargs)`` eagerly in ``precision``, outputs in the inputs' dtype.

    What a region does around an eager call (after a fallback, in the speed probe);
    the benchmark's eager rows use it too.
    """
    with scope(precision, device):
        out = fn(*args, **kwargs)
    return restore_dtype(out, precision, args)


class KeepFp32:
    """Run a submodule in fp32, outside autocast, while a region computes in bf16.

    Overrides ``forward`` on the instance, like
    :class:`~earth2studio_compile.opaque.OpaqueSubmodule`, and puts it back exactly.

    Parameters
    ----------
    module : torch.nn.Module
        The submodule (a spectral convolution, say)
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._saved: tuple[bool, Any] | None = None

    def install(self) -> None:
        """Wrap the submodule's ``forward``."""
        if self._saved is not None:
            return
        d = self.module.__dict__
        self._saved = ("forward" in d, d.get("forward"))
        forward = self.module.forward

        def fp32_forward(*args: Any, **kwargs: Any) -> Any:
            # Installed only for bf16 sessions: inputs autocast lowered come back
            # to fp32 (also on meta tensors, for the opaque operators' shape runs).
            args, kwargs = tree_map(_to_fp32, (args, kwargs))
            device = _device_type(args)
            if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
                with torch.autocast(device, enabled=False):
                    return forward(*args, **kwargs)
            return forward(*args, **kwargs)

        d["forward"] = fp32_forward

    def restore(self) -> None:
        """Put ``forward`` back as it was."""
        if self._saved is None:
            return
        had, value = self._saved
        if had:
            self.module.__dict__["forward"] = value
        else:
            self.module.__dict__.pop("forward", None)
        self._saved = None


def _to_fp32(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16):
        return t.float()
    return t


def _device_type(args: Any) -> str:
    leaves, _ = tree_flatten(args)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            return leaf.device.type
    return "cpu"


def reference_error(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    device: torch.device,
) -> float | None:
    """Relative L2 of ``out`` against the same call in fp32 eager, TF32 off.

    The reference runs on copies of the arguments and of the module's buffers, and
    through ``_call_impl`` (not the region's slot), so a core that updates its
    inputs or buffers in place is not updated twice.

    Returns
    -------
    float | None
        The largest relative L2 over the floating outputs; None if there are none
    """
    copies = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, args)
    kw = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, kwargs)
    state = {
        **dict(module.named_parameters()),
        **{k: b.clone() for k, b in module.named_buffers()},
    }
    with torch.no_grad(), scope("fp32", device), _torch.reparametrized(module, state):
        ref = module._call_impl(*copies, **kw)
    got = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    want = [t for t in tree_flatten(ref)[0] if isinstance(t, torch.Tensor)]
    errors = [
        rel_l2(g.float(), w.float())
        for g, w in zip(got, want)
        if w.is_floating_point() and g.shape == w.shape
    ]
    return max(errors) if errors else None


def log_error(label: str, precision: str, error: float | None) -> None:
    """WARN when a precision cost more accuracy than its documented threshold."""
    if error is None:
        return
    limit = THRESHOLDS[precision]
    if error > limit:
        logger.warning(
            f"{label} in {precision}: rel. L2 {error:.1e} against fp32 eager after one "
            f"call, above the {limit:.0e} expected for {precision}. Check the "
            f"forecast, or use precision='fp32' (unset {ENV})."
        )
