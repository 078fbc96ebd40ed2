"""The one place that touches PyTorch's compiler internals.

Everything else in the package talks to ``torch.compile`` through this package, so a
PyTorch upgrade that moves an internal name touches it alone. Each internal is
reached through a *feature*: probed once, and when it is missing the caller gets a
reason (a fallback to eager, or a figure left out of the report), never a crash and
never a silently wrong report. Public names are used wherever PyTorch has one
(``torch.compiler.list_backends``, ``torch.compiler.cudagraph_mark_step_begin``, ...).

Callers import the names below from here (``_torch.missing(...)``); the modules
behind them, one concern each:

- ``probes``: the features, their probes and :func:`missing`
- ``modules``: private attributes of modules and tensors (a storage's holders);
  meta-tensor runs
- ``pytree``: flattening nested inputs and outputs, pytree specs
- ``dynamo``: compiling a region (:func:`compile_region`), per-call settings
- ``inductor``: Inductor's modes and options checked up front, preflight, logs
- ``caches``: Inductor's local cache directory and FX-graph cache counts
- ``cudagraphs``: CUDA graph trees' steps and skips
- ``precision_flags``: the fp32 precision flags, read and stored values
- ``flex``: SDPA calls as FlexAttention in traced code (:class:`FlexSDPA`)
- ``fp32_scope``: :func:`fp32_math`, a block with fp32 math forced and put back
- ``aoti``: AOTInductor's compile and package loader
- ``convolutions``: an artifact's convolutions, recorded and replayed to warm cuDNN
"""

from __future__ import annotations

from earth2studio_compile._torch.aoti import aoti_compile, aoti_loader
from earth2studio_compile._torch.caches import (
    default_inductor_cache_dir,
    forget_local_cache_paths,
    fx_cache_counts,
    inductor_cache_dir,
)
from earth2studio_compile._torch.convolutions import (
    read_convolutions,
    record_convolutions,
    warm_convolutions,
)
from earth2studio_compile._torch.cudagraphs import cudagraph_skips, mark_cudagraph_step
from earth2studio_compile._torch.dynamo import (
    CountingBackend,
    call_context,
    compile_region,
    is_recompile_limit_hit,
    known_backends,
    recompile_limit,
)
from earth2studio_compile._torch.flex import FlexSDPA
from earth2studio_compile._torch.fp32_scope import fp32_math
from earth2studio_compile._torch.inductor import (
    QUIET_AUTOTUNE_KEYS,
    cpu_autotune_fixes,
    inductor_modes,
    inductor_options,
    mode_options,
    preflight,
    quiet_autotune_options,
    quiet_cpp_extension_log,
    validate_inductor_options,
)
from earth2studio_compile._torch.modules import (
    MODULE_SLOT,
    call_module,
    held_tensors,
    is_optimized_module,
    real_tensors,
    reparametrized,
    set_held_tensor,
    storage_shared,
    tensor_version,
)
from earth2studio_compile._torch.precision_flags import (
    FP32_CPU,
    FP32_CUDA,
    FP32_ROOT,
    INHERIT,
    fp32_flag,
    fp32_flags,
    stored_fp32_flags,
)
from earth2studio_compile._torch.probes import FEATURES, missing
from earth2studio_compile._torch.probes import (
    _probe as _probe,  # tests clear its cache after faking a missing feature
)
from earth2studio_compile._torch.pytree import (
    tree_flatten,
    tree_map,
    tree_unflatten,
    treespec_dumps,
    treespec_loads,
)

__all__ = [
    "FEATURES",
    "FP32_CPU",
    "FP32_CUDA",
    "FP32_ROOT",
    "INHERIT",
    "MODULE_SLOT",
    "QUIET_AUTOTUNE_KEYS",
    "CountingBackend",
    "FlexSDPA",
    "aoti_compile",
    "aoti_loader",
    "call_context",
    "call_module",
    "compile_region",
    "cpu_autotune_fixes",
    "cudagraph_skips",
    "default_inductor_cache_dir",
    "forget_local_cache_paths",
    "fp32_flag",
    "fp32_flags",
    "fp32_math",
    "fx_cache_counts",
    "held_tensors",
    "inductor_cache_dir",
    "inductor_modes",
    "inductor_options",
    "is_optimized_module",
    "is_recompile_limit_hit",
    "known_backends",
    "mark_cudagraph_step",
    "missing",
    "mode_options",
    "preflight",
    "quiet_autotune_options",
    "quiet_cpp_extension_log",
    "read_convolutions",
    "real_tensors",
    "recompile_limit",
    "record_convolutions",
    "reparametrized",
    "set_held_tensor",
    "storage_shared",
    "stored_fp32_flags",
    "tensor_version",
    "tree_flatten",
    "tree_map",
    "tree_unflatten",
    "treespec_dumps",
    "treespec_loads",
    "validate_inductor_options",
    "warm_convolutions",
]
