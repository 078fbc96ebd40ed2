"""Features: each PyTorch internal the adaptor reaches, probed once.

A feature names what the package uses an internal for. :func:`missing` says why it
cannot be used with the installed PyTorch (the probe failed), so a caller falls back
to eager or leaves a figure out of the report with that reason, and never crashes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from earth2studio_compile._torch.precision_flags import cudnn_tf32_prop, fp32_flags


def _probe_counters() -> None:
    from torch._dynamo.utils import counters  # noqa: F401


def _probe_dynamo_config() -> None:
    import torch._dynamo.config as config

    for name in ("recompile_limit", "fail_on_recompile_limit_hit"):
        if not hasattr(config, name):
            raise AttributeError(f"torch._dynamo.config has no {name}")


def _probe_checkpoint_side_effects() -> None:
    import torch._dynamo.config as config

    if not hasattr(config, "skip_fwd_side_effects_in_bwd_under_checkpoint"):
        raise AttributeError(
            "torch._dynamo.config has no skip_fwd_side_effects_in_bwd_under_checkpoint"
        )


def _probe_inductor_wrapper() -> None:
    if not callable(getattr(torch, "_TorchCompileInductorWrapper", None)):
        raise AttributeError("torch has no _TorchCompileInductorWrapper")


def _probe_compile_threads() -> None:
    import torch._inductor.config as config

    if not hasattr(config, "compile_threads"):
        raise AttributeError("torch._inductor.config has no compile_threads")


def _probe_cache_dir() -> None:
    from torch._inductor.runtime.cache_dir_utils import cache_dir  # noqa: F401


def _probe_cudagraph_step() -> None:
    if not callable(getattr(torch.compiler, "cudagraph_mark_step_begin", None)):
        raise AttributeError("torch.compiler has no cudagraph_mark_step_begin")


def _probe_reparametrize() -> None:
    from torch._subclasses.fake_tensor import unset_fake_temporarily  # noqa: F401
    from torch.nn.utils.stateless import _reparametrize_module  # noqa: F401


def _probe_cudnn_tf32_getter() -> None:
    prop = cudnn_tf32_prop()
    if not callable(getattr(prop, "getter", None)) or not hasattr(prop, "setter"):
        raise AttributeError("torch.backends.cudnn.allow_tf32 has no getter to wrap")
    flags = fp32_flags()
    for name in ("torch.backends.cudnn.conv", "torch.backends.cudnn.rnn"):
        if name not in flags:
            raise AttributeError(f"this PyTorch has no {name}.fp32_precision")


def _probe_aoti_compile() -> None:
    from torch._inductor import aoti_compile_and_package  # noqa: F401

    if not callable(getattr(torch.export, "export", None)):
        raise AttributeError("torch.export has no export")


def _probe_storage_holders() -> None:
    from earth2studio_compile._torch.modules import storage_holders, storage_shared

    t = torch.empty(2)
    alone = storage_holders(t)
    view = t[1:]
    if storage_holders(t) != alone + 1 or not storage_shared(t):
        raise AttributeError("the storage use count does not count views")
    del view
    if storage_shared(t):
        raise AttributeError("the storage use count keeps a dropped view")


def _probe_aoti_loader() -> None:
    loader = torch._C._aoti.AOTIModelPackageLoader
    for name in ("boxed_run", "get_call_spec", "get_constant_fqns", "load_constants"):
        if not hasattr(loader, name):
            raise AttributeError(f"AOTIModelPackageLoader has no {name}")
    from torch.utils._pytree import treespec_loads  # noqa: F401


# What each feature is for; a missing one is named in the reason it causes.
FEATURES: dict[str, tuple[str, Callable[[], None]]] = {
    "counters": ("cache and CUDA-graph figures in the report", _probe_counters),
    "dynamo_config": (
        "per-region recompile limits (storm detection)",
        _probe_dynamo_config,
    ),
    "checkpoint_side_effects": (
        "regions keeping state inside an activation checkpoint, without grad",
        _probe_checkpoint_side_effects,
    ),
    "inductor_wrapper": ("compiling with Inductor", _probe_inductor_wrapper),
    "compile_threads": ("single-threaded warm starts", _probe_compile_threads),
    "cache_dir": ("the portable compile cache", _probe_cache_dir),
    "cudagraph_step": (
        "CUDA graphs with outputs kept across steps",
        _probe_cudagraph_step,
    ),
    "reparametrize": (
        "opaque submodules (meta-tensor shape runs)",
        _probe_reparametrize,
    ),
    "cudnn_tf32_getter": (
        "reading torch.backends.cudnn.allow_tf32 inside a precision scope",
        _probe_cudnn_tf32_getter,
    ),
    "aoti_compile": (
        "building ahead-of-time compiled regions (AOTInductor)",
        _probe_aoti_compile,
    ),
    "aoti_loader": (
        "loading ahead-of-time compiled regions (AOTInductor's package loader)",
        _probe_aoti_loader,
    ),
    "storage_holders": (
        "reusing OverlappedIO's host buffers across steps",
        _probe_storage_holders,
    ),
}


@functools.cache
def _probe(name: str) -> str | None:
    purpose, probe = FEATURES[name]
    try:
        probe()
    except Exception as err:  # any failure means the feature is unusable here
        return (
            f"this PyTorch ({torch.__version__}) lacks what {purpose} needs "
            f"({type(err).__name__}: {err})"
        )
    return None


def missing(name: str) -> str | None:
    """Why feature ``name`` cannot be used with the installed PyTorch, or None.

    Parameters
    ----------
    name : str
        A key of :data:`FEATURES`

    Returns
    -------
    str | None
        Reason, or None when the feature works
    """
    return _probe(name)
