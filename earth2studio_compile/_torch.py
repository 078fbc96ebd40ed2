"""The one place that touches PyTorch's compiler internals.

Everything else in the package talks to ``torch.compile`` through this module, so a
PyTorch upgrade that moves an internal name touches one file. Each internal is
reached through a *feature*: probed once, and when it is missing the caller gets a
reason (a fallback to eager, or a figure left out of the report), never a crash and
never a silently wrong report. Public names are used wherever PyTorch has one
(``torch.compiler.list_backends``, ``torch.compiler.cudagraph_mark_step_begin``, ...).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from loguru import logger
from torch.utils._pytree import tree_flatten, tree_map  # noqa: F401  (re-exported)

__all__ = [
    "CountingBackend",
    "FEATURES",
    "call_context",
    "compile_region",
    "cudagraph_skips",
    "fx_cache_counts",
    "inductor_cache_dir",
    "inductor_modes",
    "inductor_options",
    "is_recompile_limit_hit",
    "known_backends",
    "mode_options",
    "missing",
    "preflight",
    "tree_flatten",
    "tree_map",
    "validate_inductor_options",
]

# The slot ``nn.Module.compile()`` fills: ``nn.Module.__call__`` calls it instead of
# ``_call_impl`` when set, so hooking it leaves parameters and forward untouched.
MODULE_SLOT = "_compiled_call_impl"


# -- features --------------------------------------------------------------------------
def _probe_counters() -> None:
    from torch._dynamo.utils import counters  # noqa: F401


def _probe_dynamo_config() -> None:
    import torch._dynamo.config as config

    for name in ("recompile_limit", "fail_on_recompile_limit_hit"):
        if not hasattr(config, name):
            raise AttributeError(f"torch._dynamo.config has no {name}")


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


# What each feature is for; a missing one is named in the reason it causes.
FEATURES: dict[str, tuple[str, Callable[[], None]]] = {
    "counters": ("cache and CUDA-graph figures in the report", _probe_counters),
    "dynamo_config": (
        "per-region recompile limits (storm detection)",
        _probe_dynamo_config,
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


# Names of features tests declare missing (see test_torch_adaptor).
_FORCED_MISSING: set[str] = set()


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
    if name in _FORCED_MISSING:
        return f"{FEATURES[name][0]} is unavailable (declared missing)"
    return _probe(name)


# -- logging ---------------------------------------------------------------------------
class _NoCudaRuntimeNote(logging.Filter):
    """Drops ``torch.utils.cpp_extension``'s "No CUDA runtime is found" warning.

    Torch logs it when it finds a CUDA toolkit directory but no usable GPU, on the
    first import of ``cpp_extension``, which Inductor makes while compiling for the
    CPU. It concerns building CUDA extensions, which a CPU compile never does; it is
    passed on at TRACE.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("No CUDA runtime is found"):
            logger.trace(f"torch: {record.getMessage()}")
            return False
        return True


def quiet_cpp_extension_log() -> None:
    """Install :class:`_NoCudaRuntimeNote` once on torch's ``cpp_extension`` logger."""
    log = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _NoCudaRuntimeNote) for f in log.filters):
        log.addFilter(_NoCudaRuntimeNote())


# -- options ---------------------------------------------------------------------------
def inductor_modes() -> list[str]:
    """Mode strings the installed Inductor accepts (``"default"``, ...)."""
    import torch._inductor

    return list(torch._inductor.list_mode_options().keys())


def mode_options(mode: str, dynamic: bool | None = None) -> dict[str, Any]:
    """The Inductor settings a mode stands for."""
    import torch._inductor

    return dict(torch._inductor.list_mode_options(mode, dynamic))


def cpu_autotune_fixes() -> dict[str, Any]:
    """Inductor options that let a max-autotune mode compile on CPU.

    With ``max_autotune`` on CPU, Inductor may pick its C++ GEMM/BMM template and
    fuse the following pointwise ops into it. On torch 2.14.1 that fusion fails
    for FCN's AFNO core (``InductorError: AssertionError: buf15`` in
    ``cpp_template_kernel.store_pointwise_nodes``, a masked load the template's
    epilogue does not know); pytorch/pytorch#185405 and #180980 are the same family.
    Without epilogue fusion the template is still autotuned and chosen.
    """
    return {"epilogue_fusion": False}


# Autotuning prints its tables ("AUTOTUNE bmm(...)", "Autotune Choices Stats") with
# sys.stderr.write, not through logging; these options turn the printing off, and the
# matching environment variables, when the user set them, win.
_QUIET_AUTOTUNE = {
    "autotune_num_choices_displayed": (
        0,
        "TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED",
    ),
    "max_autotune_report_choices_stats": (
        False,
        "TORCHINDUCTOR_MAX_AUTOTUNE_REPORT_CHOICES_STATS",
    ),
}
QUIET_AUTOTUNE_KEYS = frozenset(_QUIET_AUTOTUNE)


def quiet_autotune_options() -> dict[str, Any]:
    """Inductor options that keep autotuning's tables off the terminal.

    Returns
    -------
    dict[str, Any]
        Only options the installed Inductor knows and whose environment variable
        the user left unset
    """
    known = inductor_options()
    return {
        key: value
        for key, (value, env) in _QUIET_AUTOTUNE.items()
        if key in known and env not in os.environ
    }


def inductor_options() -> set[str]:
    """Names of every Inductor option (``torch._inductor.list_options()``)."""
    import torch._inductor

    return set(torch._inductor.list_options())


def known_backends() -> list[str]:
    """Names ``torch.compile(backend=...)`` accepts, debug backends included."""
    return list(torch.compiler.list_backends(exclude_tags=()))


def validate_inductor_options(
    options: Mapping[str, Any], dynamic: bool | None = None
) -> None:
    """Raise the error Inductor would raise at the first call, now.

    Inductor checks option value types only when its backend is built, which a lazy
    ``torch.compile`` does at the first call. Building it here, per option, names
    the offending key.

    Raises
    ------
    TypeError
        ``options[key]`` has a type Inductor does not accept
    """
    if missing("inductor_wrapper"):
        return
    for key, value in options.items():
        try:
            torch._TorchCompileInductorWrapper(None, {key: value}, dynamic)  # type: ignore[attr-defined]
        except Exception as err:  # Inductor raises RuntimeError for a bad type
            raise TypeError(
                f"options[{key!r}] = {value!r} is not accepted by Inductor ({err}). "
                f"Pass a value of the option's type, e.g. "
                f"torch._inductor.config.{key} = {_current(key)!r}."
            ) from None


def _current(key: str) -> Any:
    import torch._inductor.config as config

    try:
        return config.get_config_copy()[key]
    except Exception:  # only for the message
        return "..."


# -- preflight -------------------------------------------------------------------------
def preflight(backend: Any, device: torch.device) -> str | None:
    """Why Inductor cannot compile on ``device`` here, or None if it can.

    Checked before tracing, so a machine without a C++ compiler (CPU) or Triton
    (CUDA) runs eagerly at once instead of tracing for minutes and then failing.
    """
    if backend != "inductor":
        return None
    reason = missing("inductor_wrapper")
    if reason:
        return reason
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return (
                "Triton is not installed or cannot use this GPU; Inductor needs it "
                "on CUDA (pip install triton)"
            )
    elif device.type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except Exception as err:  # any failure here means Inductor cannot build
            return (
                "no working C++ compiler for Inductor on CPU "
                f"({type(err).__name__}: {err}); install g++ or set CXX"
            )
    return None


# -- compiling a region ----------------------------------------------------------------
class CountingBackend:
    """The backend ``torch.compile`` would build, counting what it does for one region.

    Dynamo's own counters are process-wide: another region's or another thread's
    compile would show up in this region's report. Here every FX graph compiled for
    the region, and every run of compiled code, is counted on the region itself.

    Parameters
    ----------
    backend : str | Callable
        ``"inductor"``, another registered backend name, or a backend callable
    mode : str | None
        Inductor mode
    options : Mapping[str, Any] | None
        Inductor options (or the options a non-Inductor backend takes)
    dynamic : bool | None
        As in :func:`torch.compile`
    """

    def __init__(
        self,
        backend: str | Callable[..., Any],
        mode: str | None,
        options: Mapping[str, Any] | None,
        dynamic: bool | None,
    ) -> None:
        self.graphs = 0
        self.runs = 0
        # Wall seconds inside the backend (AOTAutograd + Inductor, their cache
        # lookups and kernel loading included) and of the first run of compiled
        # code (CUDA-graph warm-up, autotuning, first allocations): the phases of a
        # first call that are not Dynamo's own tracing.
        self.backend_seconds = 0.0
        self.first_run_seconds: float | None = None
        self._kwargs: dict[str, Any] = {}
        if backend == "inductor":
            # Builds Inductor's own wrapper, which validates mode and options.
            self.inner: Any = torch._TorchCompileInductorWrapper(  # type: ignore[attr-defined]
                mode, dict(options) if options else None, dynamic
            )
        else:
            from torch._dynamo.backends.registry import lookup_backend

            self.inner = lookup_backend(backend)
            if options:
                self._kwargs["options"] = dict(options)
        name = backend if isinstance(backend, str) else getattr(backend, "__name__", "")
        self.compiler_name = name or type(backend).__name__

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Any
    ) -> Callable[..., Any]:
        start = time.perf_counter()
        try:
            compiled = self.inner(gm, example_inputs, **self._kwargs)
        finally:
            self.backend_seconds += time.perf_counter() - start
        self.graphs += 1
        counter = self

        # Passed through as called (boxed or not); wraps() carries the markers,
        # such as _boxed_call, that tell Dynamo how to call it.
        @functools.wraps(compiled)
        def run(*args: Any) -> Any:
            counter.runs += 1
            if counter.first_run_seconds is not None:
                return compiled(*args)
            begin = time.perf_counter()
            out = compiled(*args)
            # The first run is slow anyway; syncing makes its kernels count here.
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            counter.first_run_seconds = time.perf_counter() - begin
            return out

        return run

    def __getattr__(self, name: str) -> Any:
        # reset(), get_compiler_config(), ...: whatever Dynamo asks of the backend.
        if name.startswith("__") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _code_name(label: str) -> str:
    name = re.sub(r"\W", "_", label)
    return f"e2sc_region_{name}"


def compile_region(
    module: torch.nn.Module,
    label: str,
    *,
    backend: str | Callable[..., Any],
    fullgraph: bool = False,
    dynamic: bool | None = None,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> tuple[Callable[..., Any], CountingBackend]:
    """``torch.compile`` of ``module``'s call, with a code object of its own.

    Takes :func:`torch.compile`'s own keyword arguments and does what it does with
    them, with the backend wrapped in a :class:`CountingBackend` (returned too).

    Dynamo keeps compiled code, the recompile limit and automatic-dynamic shape
    state per *code object*. ``nn.Module.compile()`` compiles ``Module._call_impl``,
    one code object for every module in the process: twelve compiled blocks of one
    model then count as eleven recompiles of one function, and one region's shapes
    mark another's dynamic. Each region gets its own copy of a tiny entry function
    instead, named after the region (so nothing depends on the order in which
    regions were created).
    """

    def entry(*args: Any, **kwargs: Any) -> Any:
        return module._call_impl(*args, **kwargs)

    name = _code_name(label)
    replace: dict[str, Any] = {"co_name": name}
    if hasattr(entry.__code__, "co_qualname"):
        replace["co_qualname"] = name
    entry.__code__ = entry.__code__.replace(**replace)
    entry.__name__ = entry.__qualname__ = name
    # torch.compile hands `dynamic` to the backend it builds as well.
    counter = CountingBackend(backend, mode, options, dynamic)
    compiled = torch.compile(
        entry, backend=counter, fullgraph=fullgraph, dynamic=dynamic
    )
    return compiled, counter


@contextlib.contextmanager
def call_context(recompile_limit: int | None, single_thread: bool) -> Iterator[None]:
    """Settings that hold only while a region's compiled code is called.

    ``recompile_limit`` caps the region's compiled variants; reaching it raises at
    the call that hits it (instead of Dynamo's silent "run eagerly from now on"),
    so the region reports a storm. ``single_thread`` keeps Inductor from starting a
    pool of compile workers, for calls where a loaded cache leaves nothing to build.
    """
    with contextlib.ExitStack() as stack:
        if not missing("dynamo_config"):
            import torch._dynamo.config as dynamo_config

            patch: dict[str, Any] = {"fail_on_recompile_limit_hit": True}
            if recompile_limit is not None:
                patch["recompile_limit"] = recompile_limit
            stack.enter_context(dynamo_config.patch(**patch))
        if single_thread and not missing("compile_threads"):
            import torch._inductor.config as inductor_config

            stack.enter_context(inductor_config.patch(compile_threads=1))
        yield


def recompile_limit() -> int | None:
    """Dynamo's own ``recompile_limit`` setting, or None if unknown."""
    if missing("dynamo_config"):
        return None
    import torch._dynamo.config as dynamo_config

    return int(dynamo_config.recompile_limit)


def is_recompile_limit_hit(err: BaseException) -> bool:
    """Whether ``err`` is Dynamo refusing to compile past the recompile limit."""
    return type(err).__name__ == "FailOnRecompileLimitHit"


def mark_cudagraph_step() -> None:
    """Tell CUDA graph trees a new step starts: old outputs may be reused."""
    torch.compiler.cudagraph_mark_step_begin()


# -- process-wide counters (figures only) ----------------------------------------------
def fx_cache_counts() -> tuple[int, int]:
    """(FX-graph cache hits, misses) so far in this process; (0, 0) if unknown."""
    if missing("counters"):
        return 0, 0
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"][
        "fxgraph_cache_miss"
    ]


def cudagraph_skips() -> int:
    """Times Inductor skipped CUDA graphs so far in this process; 0 if unknown."""
    if missing("counters"):
        return 0
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


# -- caches ----------------------------------------------------------------------------
def inductor_cache_dir() -> str:
    """Inductor's local cache directory in effect (it creates it if needed)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def default_inductor_cache_dir() -> str | None:
    """Where Inductor puts its cache when ``TORCHINDUCTOR_CACHE_DIR`` is unset."""
    if missing("cache_dir"):
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def forget_local_cache_paths() -> None:
    """Drop Inductor's memoized local cache paths (after the directory moved)."""
    codecache = sys.modules.get("torch._inductor.codecache")
    clear = getattr(
        getattr(getattr(codecache, "CacheBase", None), "get_local_cache_path", None),
        "cache_clear",
        None,
    )
    if clear is not None:
        clear()


# -- opaque submodules -----------------------------------------------------------------
def real_tensors() -> contextlib.AbstractContextManager[Any]:
    """Leave fake-tensor tracing for a block (to run a module on meta tensors)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def reparametrized(
    module: torch.nn.Module, state: dict[str, torch.Tensor]
) -> contextlib.AbstractContextManager[Any]:
    """``module`` with its parameters and buffers swapped for ``state`` in a block.

    ``torch.func.functional_call`` does this for one call; the meta-tensor run
    calls the module's saved ``forward`` instead, so the swap itself is needed.
    """
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, state)
