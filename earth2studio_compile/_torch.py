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
import threading
import time
import weakref
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


def call_module(module: torch.nn.Module, args: Any, kwargs: Any) -> Any:
    """The module's own call (hooks included), past a region in :data:`MODULE_SLOT`."""
    return module._call_impl(*args, **kwargs)


def tensor_version(t: torch.Tensor) -> int:
    """The tensor's in-place version counter: it changes when the tensor is mutated
    (not kept by inference tensors, which raise)."""
    return t._version


def is_optimized_module(module: torch.nn.Module) -> bool:
    """Already wrapped by ``torch.compile(module)`` (an ``OptimizedModule``)."""
    return hasattr(module, "_orig_mod") and hasattr(module, "dynamo_ctx")


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

    # Weakly: compiled code kept between sessions (earth2studio_compile.resident)
    # must not keep a model alive that its user dropped.
    ref = weakref.ref(module)

    def entry(*args: Any, **kwargs: Any) -> Any:
        return ref()._call_impl(*args, **kwargs)  # type: ignore[union-attr]

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


# -- fp32 precision flags --------------------------------------------------------------
# PyTorch >= 2.9 keeps the precision of fp32 matmuls, convolutions and RNNs twice: in
# the legacy flags (``torch.backends.cuda.matmul.allow_tf32``,
# ``torch.backends.cudnn.allow_tf32``, ``torch.set_float32_matmul_precision``) and in a
# tree of per-backend ``fp32_precision`` flags: ``torch.backends`` above
# ``torch.backends.cudnn`` (all of CUDA) and ``torch.backends.mkldnn``, each above its
# ``matmul``, ``conv`` and ``rnn``. Measured on torch 2.11 and 2.14.1:
# - a legacy getter raises ("mix of the legacy and new APIs") once the two disagree,
#   e.g. after ``torch.backends.cuda.matmul.fp32_precision = "tf32"``;
# - a per-backend getter returns the inherited value: a flag left at "none" follows its
#   parent, one set explicitly does not, and reading cannot tell the two apart;
# - the legacy setters write per-backend flags explicitly (``allow_tf32 = False`` pins
#   ``cuda.matmul`` at "ieee"), and so does Dynamo when it finishes a compile (it
#   writes back the value it read for ``cuda.matmul``);
# - torch 2.14 starts cuDNN's ``conv`` and ``rnn`` at an internal default that reads
#   "tf32", follows a parent once one is set, and that no setter writes back
#   ("default" is refused); torch 2.11 starts them at an explicit "tf32".
# So which flags follow their parent is probed (the parent set to "ieee", then "tf32"),
# precision is forced through the parents wherever the children follow them, and the
# flags' stored values, not their readings, are put back.
_FP32_TREE = (
    # (public object, backend, op, parent)
    ("torch.backends", "generic", "all", None),
    ("torch.backends.cudnn", "cuda", "all", "torch.backends"),
    ("torch.backends.cuda.matmul", "cuda", "matmul", "torch.backends.cudnn"),
    ("torch.backends.cudnn.conv", "cuda", "conv", "torch.backends.cudnn"),
    ("torch.backends.cudnn.rnn", "cuda", "rnn", "torch.backends.cudnn"),
    ("torch.backends.mkldnn", "mkldnn", "all", "torch.backends"),
    ("torch.backends.mkldnn.matmul", "mkldnn", "matmul", "torch.backends.mkldnn"),
    ("torch.backends.mkldnn.conv", "mkldnn", "conv", "torch.backends.mkldnn"),
    ("torch.backends.mkldnn.rnn", "mkldnn", "rnn", "torch.backends.mkldnn"),
)
FP32_ROOT = "torch.backends"
FP32_CUDA = "torch.backends.cudnn"
FP32_CPU = "torch.backends.mkldnn"
INHERIT = "inherit"
"""Stored value of a per-backend flag that follows its parent."""


# The functions behind the public attributes: a precision scope reads and writes the
# flags some 40 times per call, and the attributes cost 3-8 us a read (2-core CPU).
_FP32_GET: Callable[[str, str], str] | None = getattr(
    torch._C, "_get_fp32_precision_getter", None
)
_FP32_SET: Callable[[str, str, str], None] | None = getattr(
    torch._C, "_set_fp32_precision_setter", None
)
_Key = tuple[str, str]  # (backend, op), the flag's C++ key


@functools.cache
def fp32_flags() -> dict[str, tuple[str, str, str | None]]:
    """The per-backend fp32 precision flags of this PyTorch, parents first.

    Returns
    -------
    dict[str, tuple[str, str, str | None]]
        Public name -> (backend, op, parent's name); empty before torch 2.9, which
        has only the legacy flags
    """
    if _FP32_GET is None or _FP32_SET is None:
        return {}
    found: dict[str, tuple[str, str, str | None]] = {}
    for name, backend, op, parent in _FP32_TREE:
        if parent is not None and parent not in found:
            continue
        try:
            if isinstance(_FP32_GET(backend, op), str):
                found[name] = (backend, op, parent)
        except Exception:  # this PyTorch does not know the pair
            continue
    return found


def fp32_flag(name: str) -> str:
    """What per-backend flag ``name`` reads now (an inherited value resolved)."""
    backend, op, _ = fp32_flags()[name]
    return _get(backend, op)


def _get(backend: str, op: str) -> str:
    assert _FP32_GET is not None
    return str(_FP32_GET(backend, op))


def _set(key: _Key, value: str) -> None:
    assert _FP32_SET is not None
    _FP32_SET(key[0], key[1], value)


@functools.cache
def _fp32_children() -> dict[_Key, tuple[_Key, ...]]:
    """Each per-backend flag's key -> its children's keys."""
    flags = fp32_flags()
    return {
        flags[name][:2]: tuple(f[:2] for f in flags.values() if f[2] == name)
        for name in flags
    }


def _stored_children(parent: _Key, then: str) -> list[tuple[_Key, str]]:
    """Stored values of ``parent``'s children: their own, or :data:`INHERIT`.

    Sets ``parent`` to "ieee" and to "tf32" to see which children follow it, then
    to ``then``.
    """
    children = _fp32_children()[parent]
    try:
        _set(parent, "ieee")
        first = [_get(*c) for c in children]
        _set(parent, "tf32")
        second = [_get(*c) for c in children]
    finally:
        _set(parent, then)
    return [
        (c, INHERIT if (a, b) == ("ieee", "tf32") else a)
        for c, a, b in zip(children, first, second)
    ]


def stored_fp32_flags() -> dict[str, str]:
    """Every per-backend flag's stored value; :data:`INHERIT` where it follows.

    Reads without raising and leaves every flag as it found it. Empty before
    torch 2.9.
    """
    flags = fp32_flags()
    if not flags:
        return {}
    names = {f[:2]: name for name, f in flags.items()}
    root_key = flags[FP32_ROOT][:2]
    root = _get(*root_key)  # no parent: what it reads is what it stores
    stored = {root_key: root}
    stored.update(_stored_children(root_key, then=root))
    for backend in _fp32_children()[root_key]:
        own = stored[backend]
        stored.update(_stored_children(backend, "none" if own == INHERIT else own))
    return {names[key]: value for key, value in stored.items()}


class _Fp32Saved:
    """What :func:`fp32_math` changed, filled in as it changes it."""

    def __init__(self) -> None:
        self.root: tuple[_Key, str] | None = None  # the root flag, if it was changed
        # backend's key -> (its own value, its children's stored values)
        self.backends: dict[_Key, tuple[str, list[tuple[_Key, str]]]] = {}
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
    root = _get(*root_key)
    if root != "none":
        # With the root at "none", each backend's own flag decides for its children.
        saved.root = root_key, root
        _set(root_key, "none")
    for backend in _fp32_children()[root_key]:
        own = _get(*backend)  # what it stores: the root is off
        # Everything in full fp32 first: the legacy matmul precision then reads
        # without raising, whatever the user mixed.
        children = _stored_children(backend, then="ieee")
        saved.backends[backend] = (own, children)
        for child, value in children:
            if value not in (INHERIT, "ieee"):
                _set(child, "ieee")
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
            _set(backend, target)
            for child, value in children:
                if value != INHERIT:
                    _set(child, target)


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


def _cudnn_tf32_prop() -> Any:
    """The descriptor behind ``torch.backends.cudnn.allow_tf32``."""
    return vars(type(torch.backends.cudnn))["allow_tf32"]


def _probe_cudnn_tf32_getter() -> None:
    prop = _cudnn_tf32_prop()
    if not callable(getattr(prop, "getter", None)) or not hasattr(prop, "setter"):
        raise AttributeError("torch.backends.cudnn.allow_tf32 has no getter to wrap")
    flags = fp32_flags()
    for name in ("torch.backends.cudnn.conv", "torch.backends.cudnn.rnn"):
        if name not in flags:
            raise AttributeError(f"this PyTorch has no {name}.fp32_precision")


def _scoped_cudnn_tf32() -> bool:
    """cuDNN's TF32 for convolutions and RNNs, read from the per-backend flags."""
    conv = _get("cuda", "conv") == "tf32"
    if conv == (_get("cuda", "rnn") == "tf32"):
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
            prop = _cudnn_tf32_prop()
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
            _cudnn_tf32_prop().getter = _cudnn_original_getter
            _cudnn_original_getter = None


def _restore_fp32_math(saved: _Fp32Saved) -> None:
    if saved.cudnn_tf32 is not None:
        torch.backends.cudnn.allow_tf32 = saved.cudnn_tf32
    if saved.matmul_precision is not None:
        # Pins cuda.matmul and mkldnn.matmul: put back below.
        torch.set_float32_matmul_precision(saved.matmul_precision)
    for backend, (own, children) in saved.backends.items():
        now = _get(*backend)
        for child, value in children:
            if value != INHERIT:
                _set(child, value)
            elif child[1] == "matmul" or _get(*child) != now:
                # A follower pinned meanwhile (by the legacy setter above, or by
                # Dynamo, which writes back cuda.matmul after a compile) follows
                # again. The matmul flags start at "none"; cuDNN's conv and rnn,
                # which on torch 2.14 start at a default no setter writes, are
                # written only if something pinned them.
                _set(child, "none")
        _set(backend, own)
    if saved.root is not None:
        _set(*saved.root)


# -- ahead-of-time compiled regions (AOTInductor) --------------------------------------
def _probe_aoti_compile() -> None:
    from torch._inductor import aoti_compile_and_package  # noqa: F401

    if not callable(getattr(torch.export, "export", None)):
        raise AttributeError("torch.export has no export")


def _probe_aoti_loader() -> None:
    loader = torch._C._aoti.AOTIModelPackageLoader
    for name in ("boxed_run", "get_call_spec", "get_constant_fqns", "load_constants"):
        if not hasattr(loader, name):
            raise AttributeError(f"AOTIModelPackageLoader has no {name}")
    from torch.utils._pytree import treespec_loads  # noqa: F401


FEATURES["cudnn_tf32_getter"] = (
    "reading torch.backends.cudnn.allow_tf32 inside a precision scope",
    _probe_cudnn_tf32_getter,
)
FEATURES["aoti_compile"] = (
    "building ahead-of-time compiled regions (AOTInductor)",
    _probe_aoti_compile,
)
FEATURES["aoti_loader"] = (
    "loading ahead-of-time compiled regions (AOTInductor's package loader)",
    _probe_aoti_loader,
)


def aoti_compile(program: Any, path: str, configs: Mapping[str, Any]) -> str:
    """``torch._inductor.aoti_compile_and_package`` of an exported program.

    Parameters
    ----------
    program : torch.export.ExportedProgram
        The exported region
    path : str
        Where the ``.pt2`` package goes
    configs : Mapping[str, Any]
        Inductor settings for the compile

    Returns
    -------
    str
        The package's path
    """
    from torch._inductor import aoti_compile_and_package

    return aoti_compile_and_package(
        program, package_path=path, inductor_configs=dict(configs)
    )


def aoti_loader(path: str, device_index: int) -> Any:
    """AOTInductor's package loader for ``path``, without ``aoti_load_package``.

    ``torch._inductor.aoti_load_package`` goes through ``load_pt2``, which imports
    Inductor's compile machinery and probes the CPU's vector ISA by compiling test
    programs (5.8 s on a 2-core CPU, 13-58 s on an H100 host with an empty Inductor
    cache; pytorch issue #191715). The loader itself only unpacks and ``dlopen``s
    the compiled library (~0.01 s on CPU). ``run_single_threaded``: the runner
    skips its own thread synchronisation, which CUDA-graph capture needs; a region
    calls it from one thread.

    Parameters
    ----------
    path : str
        The ``.pt2`` package
    device_index : int
        CUDA device index (-1: the current device)

    Returns
    -------
    torch._C._aoti.AOTIModelPackageLoader
        The loaded model
    """
    return torch._C._aoti.AOTIModelPackageLoader(path, "model", True, 1, device_index)


def treespec_loads(text: str) -> Any:
    """A pytree spec from its serialised form (the package's call spec)."""
    from torch.utils._pytree import treespec_loads as loads

    return loads(text)


def tree_unflatten(leaves: list[Any], spec: Any) -> Any:
    """The pytree ``spec`` describes, filled with ``leaves``."""
    from torch.utils._pytree import tree_unflatten as unflatten

    return unflatten(leaves, spec)
