"""One submodule compiled in place, with fallback to eager at its first failing call.

A region hooks ``nn.Module._compiled_call_impl``, the slot ``nn.Module.compile()``
uses, so parameters, buffers and ``state_dict`` keys are untouched and the model's
own code (coordinate handling, numpy, datetimes) keeps running eagerly around it.
``torch.compile`` is lazy: errors appear at the first call, not at the wrap, so the
region catches them there, re-runs that call eagerly and stays eager.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from loguru import logger
from torch.utils._pytree import tree_flatten, tree_map

from earth2studio_compile.cache import ArtifactCache, cache_state, key_fields
from earth2studio_compile.opaque import OpaqueSubmodule, find_opaque
from earth2studio_compile.options import CompileOptions
from earth2studio_compile.report import RegionReport

_SLOT = "_compiled_call_impl"
# Calls timed once per region to tell whether compiling pays off: compiled calls
# after CUDA graphs' warm-up (call 1) and recording (call 2), then two eager calls.
# Eager calls give the same answer within float tolerance, so probing costs nothing
# but the eager speed of two steps. Rollouts shorter than this are not judged.
_PROBE_COMPILED = (3, 4, 5)
_PROBE_EAGER = (6, 7)
# Compiled slower than eager by more than this is worth a WARNING.
_SLOWER = 1.05
_TORCH_LOGS_HINT = (
    "Set TORCH_LOGS='+dynamo,graph_breaks,recompiles' (and TORCHDYNAMO_VERBOSE=1) "
    "to see more."
)


def _counters() -> tuple[int, int, int]:
    """(graphs compiled, graph breaks, CUDA-graph skips) so far in this process."""
    from torch._dynamo.utils import counters

    return (
        counters["stats"]["unique_graphs"],
        sum(counters["graph_break"].values()),
        counters["inductor"]["cudagraph_skips"],
    )


def _fx_cache() -> tuple[int, int]:
    """(FX-graph cache hits, misses) so far in this process."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


def preflight(options: CompileOptions, device: torch.device) -> str | None:
    """Why Inductor cannot compile on ``device`` here, or None if it can.

    Checked before tracing, so a machine without a C++ compiler (CPU) or Triton
    (CUDA) runs eagerly at once instead of tracing for minutes and then failing.

    Parameters
    ----------
    options : CompileOptions
        Session options; only the Inductor backend is checked
    device : torch.device
        Device of the region's first input

    Returns
    -------
    str | None
        Reason, or None
    """
    if options.backend != "inductor":
        return None
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return (
                "Triton is not installed or cannot use this GPU; Inductor needs it "
                "on CUDA (pip install triton)"
            )
    elif device.type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as err:  # any failure here means Inductor cannot build
            return (
                "no working C++ compiler for Inductor on CPU "
                f"({_describe(err)}); install g++ or set CXX"
            )
    return None


def _first_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    leaves, _ = tree_flatten((args, kwargs))
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return torch.device("cpu")


def _batch_size(args: tuple[Any, ...]) -> int | None:
    """Size of dim 0 shared by every positional tensor argument, if any."""
    sizes = {a.shape[0] for a in args if isinstance(a, torch.Tensor) and a.ndim}
    return sizes.pop() if len(sizes) == 1 else None


def _pad(args: tuple[Any, ...], size: int) -> tuple[Any, ...]:
    # Repeating the first sample (not zeros) keeps padded rows inside the model's
    # valid input range; they are sliced off afterwards.
    def pad(a: Any) -> Any:
        if isinstance(a, torch.Tensor) and a.ndim:
            extra = a[:1].expand(size - a.shape[0], *a.shape[1:])
            return torch.cat([a, extra], dim=0)
        return a

    return tuple(pad(a) for a in args)


def _first_line(err: BaseException) -> str:
    line = next((x.strip() for x in str(err).splitlines() if x.strip()), "")
    return line if len(line) <= 300 else line[:300] + "..."


def _describe(err: BaseException) -> str:
    """``Outer caused by Root: message``: Dynamo wraps the real cause, often twice."""
    root, seen = err, {id(err)}
    while True:
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if inner is None or id(inner) in seen:
            break
        seen.add(id(inner))
        root = inner
    text = f"{type(root).__name__}: {_first_line(root)}".rstrip(": ")
    return text if root is err else f"{type(err).__name__} caused by {text}"


class CompiledRegion:
    """A submodule compiled in place for the lifetime of a session.

    Parameters
    ----------
    module : torch.nn.Module
        Submodule to compile (the model's tensor-only core)
    report : RegionReport
        Where the region records what happened
    options : CompileOptions
        ``torch.compile`` arguments
    pad_batch : bool, optional
        Pad a smaller batch (dim 0) up to the first call's batch instead of
        recompiling. Only for cores whose samples do not interact, by default False
    artifacts : Path | None, optional
        Directory of portable compile-cache bundles (see
        :mod:`earth2studio_compile.cache`); None disables them, by default None
    owner : str, optional
        Qualified class name of the model that owns the region (part of the bundle
        key), by default the report's model name
    opaque : tuple[str, ...], optional
        Class names of submodules called as opaque operators inside the compiled
        graph (see :mod:`earth2studio_compile.opaque`), by default none
    """

    def __init__(
        self,
        module: torch.nn.Module,
        report: RegionReport,
        options: CompileOptions,
        pad_batch: bool = False,
        artifacts: Path | None = None,
        owner: str | None = None,
        opaque: tuple[str, ...] = (),
    ) -> None:
        self.module = module
        self.report = report
        self.options = options
        self.pad_batch = pad_batch
        self.artifacts = artifacts
        self.owner = owner or report.model
        self._compiled: Callable[..., Any] | None = None
        self._cudagraphs = False
        self._batch: int | None = None
        self._installed = False
        self._timings: dict[str, list[float]] = {"compiled": [], "eager": []}
        self._opaque = [
            OpaqueSubmodule(m, f"{report.label}.{path}")
            for path, m in find_opaque(module, opaque)
        ]
        report.opaque = len(self._opaque)

    # -- install / restore -------------------------------------------------------
    def install(self) -> None:
        """Route the module's calls through this region."""
        # Set through __dict__: nn.Module.__setattr__ would be fine for a plain
        # callable too, but this makes the single touched key explicit.
        self.module.__dict__[_SLOT] = self
        for op in self._opaque:
            op.install()
        self._installed = True

    def restore(self) -> None:
        """Put the module back exactly as it was: no slot left in its ``__dict__``."""
        if self._installed:
            if self.module.__dict__.get(_SLOT) is self:
                del self.module.__dict__[_SLOT]
            for op in reversed(self._opaque):
                op.restore()
            self._installed = False
        self._compiled = None

    # -- calls ---------------------------------------------------------------------
    def _eager(self, *args: Any, **kwargs: Any) -> Any:
        self.report.eager_calls += 1
        return self.module._call_impl(*args, **kwargs)

    @contextlib.contextmanager
    def _context(self, warm: bool = False) -> Iterator[None]:
        # Earth2Studio cores run under inference_mode or no_grad; a core called with
        # grad enabled would trace an autograd graph it never uses. no_grad rather
        # than inference_mode keeps outputs usable by later in-place eager code.
        with contextlib.ExitStack() as stack:
            if torch.is_grad_enabled():
                stack.enter_context(torch.no_grad())
            if warm:
                # A loaded bundle leaves nothing to build. Inductor would still start
                # one compile worker per core, and on a warm start they are importing
                # torch while the rollout runs: DLWP's host-bound steps took ~50 ms
                # instead of ~5 ms on a 16-core H100 host until they were gone.
                import torch._inductor.config as inductor_config

                stack.enter_context(inductor_config.patch(compile_threads=1))
            import torch._dynamo.config as dynamo_config

            # Turns Dynamo's silent "recompile limit reached, run eagerly" into an
            # exception at the call that hits it, so it is reported as a storm.
            if hasattr(dynamo_config, "fail_on_recompile_limit_hit"):
                stack.enter_context(
                    dynamo_config.patch(fail_on_recompile_limit_hit=True)
                )
            yield

    def _setup(self, device: torch.device) -> str | None:
        reason = preflight(self.options, device)
        if reason is not None:
            return reason
        self._cudagraphs = self.options.uses_cudagraphs(device)
        self.report.mode = self.options.describe(device)
        self._compiled = torch.compile(
            self.module._call_impl, **self.options.torch_kwargs(device)
        )
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.report.calls += 1
        if self.report.status == "eager":
            return self._eager(*args, **kwargs)
        if self._compiled is None:
            reason = self._setup(_first_device(args, kwargs))
            if reason is not None:
                self._fall_back(reason, cause=None)
                return self._eager(*args, **kwargs)

        if torch.is_inference_mode_enabled():
            # A rollout's first input is usually a normal tensor and every later one
            # an inference tensor; Dynamo guards on the difference and would
            # recompile at step 2. One copy of the first input avoids that.
            args = tuple(
                a.clone() if isinstance(a, torch.Tensor) and not a.is_inference() else a
                for a in args
            )
        valid = _batch_size(args)
        call_args = args
        if self.pad_batch and valid is not None:
            if self._batch is None:
                self._batch = valid
            elif valid < self._batch:
                call_args = _pad(args, self._batch)
                self.report.padded_calls += 1

        first = self.report.status == "pending"
        n = self.report.calls
        if not first and n in _PROBE_EAGER and call_args is args:
            return self._probe_eager(n, args, kwargs)
        probe = not first and n in _PROBE_COMPILED
        if probe:
            self._sync(args, kwargs)
        start = time.perf_counter()
        bundle = self._load_bundle(call_args, kwargs) if first else None
        before, fx_before = _counters(), _fx_cache()
        try:
            with self._context(warm=bundle is not None and self.report.artifact == "loaded"):
                if self._cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                out = self._compiled(*call_args, **kwargs)
                if call_args is not args:
                    out = tree_map(
                        lambda t: t[:valid]
                        if isinstance(t, torch.Tensor) and t.ndim and t.shape[0] == self._batch
                        else t,
                        out,
                    )
                if self._cudagraphs:
                    # CUDA-graph outputs are overwritten by the next replay.
                    out = tree_map(
                        lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out
                    )
        except Exception as err:
            return self._recover(err, args, kwargs)
        if probe:
            self._sync(args, kwargs)
            self._timings["compiled"].append(time.perf_counter() - start)
        if first:
            hits, misses = (a - b for a, b in zip(_fx_cache(), fx_before))
            self.report.cache = cache_state(hits, misses)
            if bundle is not None and (misses or self.report.artifact != "loaded"):
                if bundle.save():
                    ignored = self.report.artifact
                    self.report.artifact = f"{ignored}; re-saved" if ignored else "saved"
        self._account(before, time.perf_counter() - start, first)
        return out

    @staticmethod
    def _sync(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        device = _first_device(args, kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def _probe_eager(self, n: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._sync(args, kwargs)
        start = time.perf_counter()
        out = self.module._call_impl(*args, **kwargs)
        self._sync(args, kwargs)
        self._timings["eager"].append(time.perf_counter() - start)
        if n == _PROBE_EAGER[-1] and self._timings["compiled"]:
            self._judge()
        return out

    def _judge(self) -> None:
        r = self.report
        r.compiled_ms = min(self._timings["compiled"]) * 1e3
        r.eager_ms = min(self._timings["eager"]) * 1e3
        if r.compiled_ms > _SLOWER * r.eager_ms:
            logger.warning(
                f"{r.label} runs slower compiled ({r.compiled_ms:.2f} ms per call) than "
                f"eager ({r.eager_ms:.2f} ms) with {r.mode}: compiling does not pay off "
                "here. Use compile=False, or try another mode with CompileSession."
            )

    def _load_bundle(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ArtifactCache | None:
        if self.artifacts is None or self.options.backend != "inductor":
            return None
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        device = _first_device(args, kwargs)
        try:
            fields = key_fields(
                self.owner, self.report.region, self.module, args, kwargs,
                self.options.cache_text(device), device,
            )
        except Exception as err:  # an odd argument must not stop the compile
            logger.debug(f"No compile cache key for {self.report.label}: {err}")
            return None
        bundle = ArtifactCache(self.artifacts, Path(cache_dir()), fields)
        self.report.artifact = bundle.load()
        return bundle

    # -- bookkeeping ---------------------------------------------------------------
    def _account(self, before: tuple[int, int, int], seconds: float, first: bool) -> None:
        graphs, breaks, skips = (a - b for a, b in zip(_counters(), before))
        r = self.report
        if first:
            r.status = "compiled"
            r.graphs = graphs
            r.compile_seconds += seconds
            logger.debug(f"Compiled {r.label} ({r.mode}) in {seconds:.1f} s")
        elif graphs:
            r.recompiles += 1
            r.compile_seconds += seconds
            logger.info(
                f"{r.label} recompiled ({r.recompiles} so far, {seconds:.1f} s). "
                "Set TORCH_LOGS='recompiles' to see why."
            )
        if breaks:
            new = r.graph_breaks == 0
            r.graph_breaks += breaks
            if new:
                logger.warning(
                    f"{r.label}: {breaks} graph break(s) inside the compiled core; "
                    "it runs as several graphs with eager code between them and may "
                    "gain little. Set TORCH_LOGS='graph_breaks' to see where."
                )
        if skips and self._cudagraphs:
            new = r.cudagraph_skips == 0
            r.cudagraph_skips += skips
            if new:
                logger.warning(
                    f"{r.label}: Inductor skipped CUDA graphs, so mode "
                    f"{r.mode} runs without them. Set TORCH_LOGS='perf_hints' to "
                    "see why."
                )

    def _recover(
        self, err: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        # Re-run eagerly first: if eager fails too, the input or the model is at
        # fault, not the compiler, and the caller gets the eager error unchanged.
        out = self._eager(*args, **kwargs)
        self._fall_back(_describe(err), cause=err)
        return out

    def _fall_back(self, reason: str, cause: BaseException | None) -> None:
        r = self.report
        storm = cause is not None and type(cause).__name__ == "FailOnRecompileLimitHit"
        if storm:
            import torch._dynamo.config as dynamo_config

            reason = (
                f"recompile storm: recompiled until torch._dynamo.config."
                f"recompile_limit ({dynamo_config.recompile_limit}) was reached"
            )
        stage = "at its first call" if r.status == "pending" else f"at call {r.calls}"
        r.status = "eager"
        r.reason = reason
        self._compiled = None
        ran = "ran eagerly" if cause is None else "was re-run eagerly"
        logger.warning(
            f"torch.compile failed for {r.label} {stage}: {reason}. That call {ran} "
            f"and {r.label} stays eager for the rest of the session; no output is "
            f"lost. {_TORCH_LOGS_HINT}"
        )
