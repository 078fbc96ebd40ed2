"""Compiling a region with Dynamo: its own code object, a counting backend.

:func:`compile_region` is ``torch.compile`` of one module's call, with the backend
wrapped in a :class:`CountingBackend` that counts the region's graphs and runs;
:func:`call_context` holds the per-call Dynamo and Inductor settings (recompile
limit, compile threads) while a region's compiled code runs; :func:`known_backends`
lists the backends it accepts.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from earth2studio_compile._torch.probes import missing


def known_backends() -> list[str]:
    """Names ``torch.compile(backend=...)`` accepts, debug backends included."""
    return list(torch.compiler.list_backends(exclude_tags=()))


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

    Parameters
    ----------
    module : torch.nn.Module
        The region's core; held weakly by the compiled entry
    label : str
        The region's name, given to the entry function's code object
    backend, fullgraph, dynamic, mode, options
        :func:`torch.compile`'s arguments of those names

    Returns
    -------
    tuple[Callable[..., Any], CountingBackend]
        The compiled entry (call it with the module's arguments) and its counting
        backend
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
    A call without grad may keep state inside an activation checkpoint.

    Parameters
    ----------
    recompile_limit : int | None
        Compiled variants the region may hold; None leaves Dynamo's limit
    single_thread : bool
        Compile in this thread, without a worker pool
    """
    with contextlib.ExitStack() as stack:
        if not missing("dynamo_config"):
            import torch._dynamo.config as dynamo_config

            patch: dict[str, Any] = {"fail_on_recompile_limit_hit": True}
            if recompile_limit is not None:
                patch["recompile_limit"] = recompile_limit
            # Dynamo refuses a side effect inside an activation checkpoint (a
            # module keeping a tensor at its first call: anemoi's attention mask in
            # AIFS's processor), since the backward's recompute would replay it.
            # Without grad there is no backward, and grad mode is in the guards.
            if not torch.is_grad_enabled() and not missing("checkpoint_side_effects"):
                patch["skip_fwd_side_effects_in_bwd_under_checkpoint"] = True
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
