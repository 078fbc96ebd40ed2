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
buffers taken before the call (:class:`Reference`), and the relative L2 of the
difference goes into the report, with a WARNING above :data:`THRESHOLDS`.

PyTorch's precision flags exist twice, as the legacy ``allow_tf32`` flags and as the
per-backend ``fp32_precision`` flags of torch >= 2.9; a precision works with either,
and leaves both as it found them (:func:`scope`, :func:`snapshot`).
"""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile._torch import tree_flatten, tree_map
from earth2studio_compile.staging import first_device

__all__ = [
    "AUTOCASTS",
    "ENV",
    "ambient_autocast",
    "autocast_of",
    "PRECISIONS",
    "THRESHOLDS",
    "check_precision",
    "env_precision",
    "warn_bad_env",
    "KeepFp32",
    "global_flags",
    "scope",
    "tf32_under",
    "snapshot",
    "tf32_enabled",
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

    Workflows read it at every ``compile=True`` call, where a mistyped value is an
    error before anything runs; ``compile=False`` calls only name it
    (:func:`warn_bad_env`).

    Returns
    -------
    str | None
        ``"fp32"``, ``"tf32"``, ``"bf16"``, or None for PyTorch's own settings

    Raises
    ------
    ValueError
        The variable names no precision; the message suggests the closest one
    """
    raw = os.environ.get(ENV, "")
    value = raw.strip().lower()
    if value in ("", "none", "default"):
        return None
    if value in PRECISIONS:
        return value
    close = difflib.get_close_matches(value, PRECISIONS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"{ENV}={raw!r} is not a precision.{hint} Set it to one of "
        f"{', '.join(PRECISIONS)}, or unset it to keep PyTorch's own settings."
    )


# Bad values already named by warn_bad_env: one WARNING per value, not per call.
_WARNED_ENV: set[str] = set()


def warn_bad_env() -> None:
    """WARN once per bad ``EARTH2STUDIO_COMPILE_PRECISION`` value; never raise.

    For ``compile=False`` calls, which are upstream's workflows whatever the
    environment says, yet should not hide a typo that a later ``compile=True``
    call would stop at.
    """
    try:
        env_precision()
    except ValueError as err:
        raw = os.environ.get(ENV, "")
        if raw in _WARNED_ENV:
            return
        _WARNED_ENV.add(raw)
        logger.warning(
            f"{err} It is ignored here (compile=False runs upstream's workflow "
            "unchanged); a compile=True call stops at it."
        )


@contextlib.contextmanager
def scope(precision: str | None, device: torch.device) -> Iterator[None]:
    """Run a block in ``precision``; every global setting is restored afterwards.

    PyTorch's precision flags are set and put back through
    :func:`earth2studio_compile._torch.fp32_math`, whichever of PyTorch's two APIs
    (the legacy ``allow_tf32`` flags or the per-backend ``fp32_precision`` flags)
    the user set them with: what each flag stores afterwards, not only what it
    reads, is what it stored before, also when the block raises.

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
    # TF32 is a CUDA tensor-core format: oneDNN (CPU) math stays fp32 throughout.
    cuda = "tf32" if precision == "tf32" else "ieee"
    with _torch.fp32_math(cuda=cuda, cpu="ieee"):
        if precision == "bf16":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                yield
        else:
            # An enclosing autocast (the user's) would silently lower "fp32".
            with torch.autocast(device.type, enabled=False):
                yield


@contextlib.contextmanager
def global_flags(precision: str | None) -> Iterator[None]:
    """PyTorch's TF32 flags as a user who computes in ``precision`` sets them, for
    a block that runs under the global flags; every flag is put back afterwards,
    also when the block raises.

    A region whose model refuses a precision runs under PyTorch's global flags,
    and its artifacts and payoff figures are keyed by them: what
    :func:`earth2studio_compile.build` asked for ``"tf32"`` of such a model is
    built under TF32 flags, as a forecast in TF32 sets them (one line, before the
    workflow), and ``"fp32"`` under IEEE fp32.

    Parameters
    ----------
    precision : str | None
        ``"fp32"`` or ``"tf32"``; ``"bf16"`` (an autocast, not a flag) and None
        change nothing
    """
    if precision not in ("fp32", "tf32"):
        yield
        return
    with _torch.fp32_math(cuda="tf32" if precision == "tf32" else "ieee", cpu="ieee"):
        yield


#: The autocasts :func:`ambient_autocast` names.
AUTOCASTS = ("bfloat16", "float16")


def ambient_autocast(device_type: str) -> str | None:
    """The 16-bit autocast a caller has entered around this point, for
    ``device_type``: what a model's own wrapper runs its network under (AIFS's:
    bfloat16), which ``torch.export`` does not see from inside.

    Parameters
    ----------
    device_type : str
        ``"cuda"``, ``"cpu"``, ...

    Returns
    -------
    str | None
        ``"bfloat16"`` or ``"float16"``, None where no 16-bit autocast is on
    """
    if not torch.is_autocast_enabled(device_type):
        return None
    name = str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")
    return name if name in AUTOCASTS else None


def autocast_of(
    autocast: str | None, device: torch.device
) -> contextlib.AbstractContextManager[Any]:
    """The autocast :func:`ambient_autocast` read, entered again: where a region
    its callers run under autocast is exported, verified or timed outside them.

    Parameters
    ----------
    autocast : str | None
        ``"bfloat16"`` or ``"float16"``; None enters nothing
    device : torch.device
        Where the region computes

    Returns
    -------
    contextlib.AbstractContextManager[Any]
        The autocast, or a context that does nothing
    """
    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, autocast))


def tf32_enabled() -> tuple[bool, bool]:
    """Whether CUDA matmuls and cuDNN convolutions may use TF32 now.

    Read the way PyTorch's kernels read it: from the per-backend flags where this
    PyTorch has them (the legacy getters raise when the user mixed the two APIs),
    from the legacy flags otherwise.

    Returns
    -------
    tuple[bool, bool]
        (matmuls, convolutions)
    """
    flags = _torch.fp32_flags()
    if "torch.backends.cuda.matmul" in flags and "torch.backends.cudnn.conv" in flags:
        return (
            _torch.fp32_flag("torch.backends.cuda.matmul") == "tf32",
            _torch.fp32_flag("torch.backends.cudnn.conv") == "tf32",
        )
    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )


def tf32_under(precision: str | None) -> tuple[bool, bool]:
    """The TF32 flags a block in ``precision`` runs under (:func:`scope`), read
    without setting them (another thread may be computing under the flags).

    Parameters
    ----------
    precision : str | None
        One of :data:`PRECISIONS`, or None: PyTorch's flags as they are now

    Returns
    -------
    tuple[bool, bool]
        (matmuls, convolutions), as :func:`tf32_enabled`
    """
    if precision is None:
        return tf32_enabled()
    # scope() pins both: TF32 for "tf32", IEEE fp32 for "fp32" and bf16's fp32 ops.
    tf32 = precision == "tf32"
    return (tf32, tf32)


# Legacy getters, each of which raises once the legacy and per-backend flags disagree.
_LEGACY_GETTERS: dict[str, Callable[[], Any]] = {
    "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
    "torch.backends.cuda.matmul.allow_tf32": lambda: (
        torch.backends.cuda.matmul.allow_tf32
    ),
    "torch.backends.cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
}


def snapshot() -> dict[str, Any]:
    """PyTorch's precision settings: what a session must leave as it found them.

    Reads every flag without raising and changes none. A legacy getter that raises
    (the two APIs disagree) is recorded as ``"raises"``; a per-backend flag both by
    what it stores (:data:`earth2studio_compile._torch.INHERIT` where it follows its
    parent) and by what it reads; autocast per device type.

    Returns
    -------
    dict[str, Any]
        Setting -> value; equal dictionaries mean equal settings
    """
    state: dict[str, Any] = {}
    for name, getter in _LEGACY_GETTERS.items():
        try:
            state[name] = getter()
        except RuntimeError:
            state[name] = "raises"
    for name, value in _torch.stored_fp32_flags().items():
        state[f"{name}.fp32_precision"] = value
        state[f"{name}.fp32_precision reads"] = _torch.fp32_flag(name)
    for device in ("cpu", "cuda"):
        state[f"autocast {device}"] = (
            torch.is_autocast_enabled(device),
            torch.get_autocast_dtype(device),
        )
    return state


def restore_dtype(out: Any, precision: str | None, args: Any) -> Any:
    """Cast what autocast lowered (bf16/fp16 outputs) back to the dtype of ``args``.

    Only ``"bf16"`` lowers outputs; other precisions return ``out`` without looking
    at the arguments, so the common call path pays nothing.

    Parameters
    ----------
    out : Any
        The call's output (a pytree)
    precision : str | None
        The precision the call ran in
    args : Any
        The call's arguments, positional and keyword (a pytree), whose first
        floating tensor gives the dtype

    Returns
    -------
    Any
        ``out``, its bf16/fp16 tensors cast back
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

    Parameters
    ----------
    precision : str | None
        The precision (see :func:`scope`); None: PyTorch's flags as they are
    device : torch.device
        Where the call computes
    fn : Callable[..., Any]
        What is called
    args, kwargs : tuple[Any, ...], dict[str, Any]
        Its arguments

    Returns
    -------
    Any
        ``fn``'s output
    """
    with scope(precision, device):
        out = fn(*args, **kwargs)
    return restore_dtype(out, precision, (args, kwargs))


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
            device = first_device(args, kwargs, self.module).type
            if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
                with torch.autocast(device, enabled=False):
                    return forward(*args, **kwargs)
            return forward(*args, **kwargs)

        # A copy of the module for a background build leaves it out.
        fp32_forward._earth2studio_compile_hook = True  # type: ignore[attr-defined]
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
