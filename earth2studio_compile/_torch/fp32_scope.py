"""A block with fp32 math forced, every precision setting put back afterwards.

:func:`fp32_math` sets the per-backend flags (or, before torch 2.9, the legacy
ones), keeps the legacy flags that Inductor and TunableOp read in agreement, routes
cuDNN's legacy ``allow_tf32`` getter to the per-backend flags while any block is
open, and restores every flag's stored value, also when the block raised.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

from earth2studio_compile._torch.precision_flags import (
    FP32_CPU,
    FP32_CUDA,
    FP32_ROOT,
    INHERIT,
    FlagKey,
    cudnn_tf32_prop,
    fp32_children,
    fp32_flags,
    read_flag,
    stored_children,
    write_flag,
)
from earth2studio_compile._torch.probes import missing


class _Fp32Saved:
    """What :func:`fp32_math` changed, filled in as it changes it."""

    def __init__(self) -> None:
        # The root flag and its value, if it was changed
        self.root: tuple[FlagKey, str] | None = None
        # backend's key -> (its own value, its children's stored values)
        self.backends: dict[FlagKey, tuple[str, list[tuple[FlagKey, str]]]] = {}
        self.matmul_precision: str | None = None
        self.cudnn_tf32: bool | None = None


@contextlib.contextmanager
def fp32_math(cuda: str, cpu: str) -> Iterator[None]:
    """Run a block with fp32 math forced; every precision setting put back after.

    Parameters
    ----------
    cuda : str
        ``"ieee"`` or ``"tf32"``: cuBLAS matmuls and cuDNN convolutions and RNNs
    cpu : str
        ``"ieee"`` or ``"tf32"``: oneDNN matmuls, convolutions and RNNs

    Inside the block the per-backend flags read ``cuda`` and ``cpu``, and the legacy
    matmul flags (``torch.get_float32_matmul_precision``, cuBLAS ``allow_tf32``),
    which Inductor and TunableOp read, agree with them. cuDNN's legacy
    ``allow_tf32`` is not set where per-backend flags exist: its setter pins
    ``conv`` and ``rnn``, which torch 2.14 cannot put back. Its getter, which would
    raise where the per-backend flags now disagree with the legacy value, reads
    what cuDNN's convolutions and RNNs do while the block runs
    (:func:`_patch_cudnn_tf32_getter`). Afterwards every flag, legacy and
    per-backend, stores what it stored before, also when the block raised.
    """
    saved = _Fp32Saved()
    patched = False
    try:
        _force_fp32_math(saved, cuda, cpu)
        patched = _patch_cudnn_tf32_getter()
        yield
    finally:
        if patched:
            _unpatch_cudnn_tf32_getter()
        _restore_fp32_math(saved)


def _force_fp32_math(saved: _Fp32Saved, cuda: str, cpu: str) -> None:
    flags = fp32_flags()
    if not flags:  # torch < 2.9: the legacy flags are all there is
        saved.matmul_precision = torch.get_float32_matmul_precision()
        saved.cudnn_tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = cuda == "tf32"
        torch.backends.cudnn.allow_tf32 = cuda == "tf32"
        return
    root_key = flags[FP32_ROOT][:2]
    root = read_flag(*root_key)
    if root != "none":
        # With the root at "none", each backend's own flag decides for its children.
        saved.root = root_key, root
        write_flag(root_key, "none")
    for backend in fp32_children()[root_key]:
        own = read_flag(*backend)  # what it stores: the root is off
        # Everything in full fp32 first: the legacy matmul precision then reads
        # without raising, whatever the user mixed.
        children = stored_children(backend, then="ieee")
        saved.backends[backend] = (own, children)
        for child, value in children:
            if value not in (INHERIT, "ieee"):
                write_flag(child, "ieee")
    try:
        saved.matmul_precision = torch.get_float32_matmul_precision()
    except RuntimeError:  # a check this PyTorch adds: leave the legacy flag alone
        saved.matmul_precision = None
    if saved.matmul_precision is not None:
        # The legacy precision becomes "high" or "highest"; pins cuda.matmul.
        torch.backends.cuda.matmul.allow_tf32 = cuda == "tf32"
    targets = {flags[FP32_CUDA][:2]: cuda, flags[FP32_CPU][:2]: cpu}
    for backend, (_, children) in saved.backends.items():
        target = targets.get(backend, "ieee")
        if target != "ieee":
            write_flag(backend, target)
            for child, value in children:
                if value != INHERIT:
                    write_flag(child, target)


# cuDNN's legacy ``allow_tf32`` getter checks the per-backend ``conv`` and ``rnn``
# flags against a bool only the legacy setter writes, and raises ("mix of the legacy
# and new APIs") where they disagree. A scope must set ``conv`` and ``rnn`` through
# the per-backend flags (the legacy setter pins them, and torch 2.14's starting
# value cannot be written back), so inside a scope that bool may disagree: fp32 on
# PyTorch's defaults, tf32 after ``allow_tf32 = False``. While any scope is open the
# getter behind ``torch.backends.cudnn.allow_tf32`` (a ``ContextProp`` of torch's
# module object) reads the per-backend flags instead: what the convolutions do, the
# value setting ``allow_tf32`` to it would give. Inductor's convolution templates
# read the flag this way too. Outside every scope torch's own getter is back.
_CUDNN_PATCH = threading.Lock()
_cudnn_patch_depth = 0
_cudnn_original_getter: Callable[[], bool] | None = None


def _scoped_cudnn_tf32() -> bool:
    """cuDNN's TF32 for convolutions and RNNs, read from the per-backend flags."""
    conv = read_flag("cuda", "conv") == "tf32"
    if conv == (read_flag("cuda", "rnn") == "tf32"):
        return conv
    # Convolutions and RNNs differ: no single answer, as PyTorch says.
    assert _cudnn_original_getter is not None
    return _cudnn_original_getter()


def _patch_cudnn_tf32_getter() -> bool:
    """Route ``torch.backends.cudnn.allow_tf32`` reads to the per-backend flags.

    Returns
    -------
    bool
        Whether the getter is wrapped (undo with :func:`_unpatch_cudnn_tf32_getter`);
        False where this PyTorch has no per-backend cuDNN flags (the legacy flag is
        all there is, and the scope sets it) or no getter to wrap
    """
    global _cudnn_patch_depth, _cudnn_original_getter
    if missing("cudnn_tf32_getter") is not None:
        return False
    with _CUDNN_PATCH:
        if _cudnn_patch_depth == 0:
            prop = cudnn_tf32_prop()
            _cudnn_original_getter = prop.getter
            prop.getter = _scoped_cudnn_tf32
        _cudnn_patch_depth += 1
    return True


def _unpatch_cudnn_tf32_getter() -> None:
    """Undo one :func:`_patch_cudnn_tf32_getter`; the last one puts torch's back."""
    global _cudnn_patch_depth, _cudnn_original_getter
    with _CUDNN_PATCH:
        _cudnn_patch_depth -= 1
        if _cudnn_patch_depth == 0:
            cudnn_tf32_prop().getter = _cudnn_original_getter
            _cudnn_original_getter = None


def _restore_fp32_math(saved: _Fp32Saved) -> None:
    if saved.cudnn_tf32 is not None:
        torch.backends.cudnn.allow_tf32 = saved.cudnn_tf32
    if saved.matmul_precision is not None:
        # Pins cuda.matmul and mkldnn.matmul: put back below.
        torch.set_float32_matmul_precision(saved.matmul_precision)
    for backend, (own, children) in saved.backends.items():
        now = read_flag(*backend)
        for child, value in children:
            if value != INHERIT:
                write_flag(child, value)
            elif child[1] == "matmul" or read_flag(*child) != now:
                # A follower pinned meanwhile (by the legacy setter above, or by
                # Dynamo, which writes back cuda.matmul after a compile) follows
                # again. The matmul flags start at "none"; cuDNN's conv and rnn,
                # which on torch 2.14 start at a default no setter writes, are
                # written only if something pinned them.
                write_flag(child, "none")
        write_flag(backend, own)
    if saved.root is not None:
        write_flag(*saved.root)
