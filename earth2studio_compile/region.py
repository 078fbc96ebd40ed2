"""One submodule compiled in place, with fallback to eager at its first failing call.

A region hooks ``nn.Module._compiled_call_impl``, the slot ``nn.Module.compile()``
uses, so parameters, buffers and ``state_dict`` keys are untouched and the model's
own code (coordinate handling, numpy, datetimes) keeps running eagerly around it.
``torch.compile`` is lazy: errors appear at the first call, not at the wrap, so the
region catches them there, re-runs that call eagerly and stays eager.

A call goes through three states: *pending* (nothing compiled yet: set up, maybe
load a cache bundle, compile), *compiled* (run compiled code; count recompiles), and
*eager* (fallen back, for good). The collaborators each do one job:
:class:`StagedCall` (the arguments compiled code sees, and the mutations it makes,
handed back), :class:`SpeedProbe` (does compiling pay off?) and the bundle layer of
:mod:`earth2studio_compile.cache`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch, precision
from earth2studio_compile._torch import MODULE_SLOT, tree_flatten, tree_map
from earth2studio_compile.cache import RegionBundle, cache_state, local_cache_source
from earth2studio_compile.metrics import synchronize
from earth2studio_compile.opaque import OpaqueSubmodule, find_opaque
from earth2studio_compile.options import CompileOptions, CompilePolicy, TableOptions
from earth2studio_compile.precision import KeepFp32
from earth2studio_compile.report import RegionReport

# Compiled variants a region may hold before it is declared a storm. Legitimate
# shape changes settle quickly: a smaller last ensemble batch needs 2 variants, many
# batch sizes 3 (static, dynamic, and batch 1, which Dynamo specializes), batch and
# grid changing together 4 (measured on CPU with torch 2.14, see docs/user-guide.md,
# "Recompile storms"). A storm is caught at its 4th recompile instead of Dynamo's 8th.
RECOMPILE_LIMIT = 4
_TORCH_LOGS_HINT = (
    "Set TORCH_LOGS='+dynamo,graph_breaks,recompiles' (and TORCHDYNAMO_VERBOSE=1) "
    "to see more."
)


def _first_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    leaves, _ = tree_flatten((args, kwargs))
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return torch.device("cpu")


def _no_grad() -> contextlib.AbstractContextManager[Any]:
    # Earth2Studio cores run under inference_mode or no_grad; a core called with
    # grad enabled would trace an autograd graph it never uses. no_grad rather
    # than inference_mode keeps outputs usable by later in-place eager code.
    return torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext()


def _first_line(err: BaseException) -> str:
    line = next((x.strip() for x in str(err).splitlines() if x.strip()), "")
    return line if len(line) <= 300 else line[:300] + "..."


def describe(err: BaseException) -> str:
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


class StagedCall:
    """The positional arguments compiled code is given, and the way back.

    Compiled code sometimes needs other tensors than the caller's: a copy of a
    normal tensor under inference mode (the first step's input; every later one is
    an inference tensor, and Dynamo would recompile on the difference), or a batch
    padded to the compiled size. Whatever is copied, the caller must see exactly
    what eager would do: in-place updates to a copy (a stateful core updating its
    state argument) are written back to the caller's tensor, and an output that *is*
    a copy is replaced by the caller's tensor.

    Parameters
    ----------
    args : tuple[Any, ...]
        The caller's positional arguments
    copy_normal : bool
        Copy tensors that are not inference tensors (the call runs in inference mode)
    pad_to : int | None
        Pad every positional tensor's dim 0 up to this size (repeating the first
        sample keeps padded rows inside the model's valid input range)
    """

    def __init__(
        self, args: tuple[Any, ...], copy_normal: bool, pad_to: int | None = None
    ) -> None:
        self.originals = args
        self.pad_to = pad_to
        work: list[Any] = []
        for a in args:
            w = a
            if isinstance(a, torch.Tensor):
                if copy_normal and not a.is_inference():
                    w = a.clone()
                if pad_to is not None and a.ndim and a.shape[0] < pad_to:
                    extra = w[:1].expand(pad_to - a.shape[0], *a.shape[1:])
                    w = torch.cat([w, extra], dim=0)
            work.append(w)
        self.args = tuple(work)
        # Inference tensors (copies made in inference mode) keep no version counter:
        # for those, a changed value is what tells a mutation.
        self._versions = [
            None if w is a else (-1 if w.is_inference() else w._version)
            for a, w in zip(args, self.args)
        ]

    @property
    def padded(self) -> bool:
        """Whether any argument was padded."""
        return self.pad_to is not None and any(
            isinstance(a, torch.Tensor) and a.ndim and a.shape[0] < self.pad_to
            for a in self.originals
        )

    def finish(self, out: Any) -> Any:
        """Hand mutations of copies back to the caller's tensors; map outputs back."""
        for a, w, version in zip(self.originals, self.args, self._versions):
            if version is None:
                continue
            src = w[: a.shape[0]] if w.shape != a.shape else w
            if version >= 0 and w._version == version:
                continue
            if version < 0 and torch.equal(src, a):
                continue
            with torch.no_grad():
                a.copy_(src)
        copies = {id(w): a for a, w in zip(self.originals, self.args) if w is not a}
        if not copies:
            return out
        return tree_map(
            lambda t: copies.get(id(t), t) if isinstance(t, torch.Tensor) else t, out
        )


class SpeedProbe:
    """Times a few calls once per region to tell whether compiling pays off.

    Compiled calls after CUDA graphs' warm-up (call 1) and recording (call 2), then
    two eager calls. Eager calls give the same answer within float tolerance, so
    probing costs nothing but the eager speed of two steps. Rollouts shorter than
    this are not judged.
    """

    COMPILED = (3, 4, 5)
    EAGER = (6, 7)
    # Compiled slower than eager by more than this is worth a WARNING.
    SLOWER = 1.05

    def __init__(self, report: RegionReport, enabled: bool = True) -> None:
        self.report = report
        self.enabled = enabled
        self.timings: dict[str, list[float]] = {"compiled": [], "eager": []}

    def wants_eager(self, call: int) -> bool:
        """Whether call number ``call`` is one of the eager probes."""
        return self.enabled and call in self.EAGER

    def times_compiled(self, call: int) -> bool:
        """Whether call number ``call`` is one of the timed compiled calls."""
        return self.enabled and call in self.COMPILED

    def record(self, kind: str, seconds: float, call: int) -> None:
        """Add one timing; judge after the last eager probe."""
        self.timings[kind].append(seconds)
        if kind == "eager" and call == self.EAGER[-1] and self.timings["compiled"]:
            self._judge()

    def _judge(self) -> None:
        r = self.report
        r.compiled_ms = min(self.timings["compiled"]) * 1e3
        r.eager_ms = min(self.timings["eager"]) * 1e3
        if r.compiled_ms > self.SLOWER * r.eager_ms:
            logger.warning(
                f"{r.label} runs slower compiled ({r.compiled_ms:.2f} ms per call) "
                f"than eager ({r.eager_ms:.2f} ms) with {r.mode}: compiling does not "
                "pay off "
                "here. Use compile=False, or try another mode with CompileSession."
            )


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
    table_cudagraphs, table_options : bool, Mapping | Callable | None, optional
        The model table's choices (:attr:`ModelSpec.cudagraphs`,
        :attr:`ModelSpec.inductor_options`), resolved with ``options`` into one
        :class:`~earth2studio_compile.options.CompilePolicy` at the first call
    precision : str | None, optional
        Precision inside the region's calls (:mod:`earth2studio_compile.precision`),
        by default None (PyTorch's global settings)
    fp32_modules : tuple[str, ...], optional
        Class names of submodules kept in fp32 outside autocast under ``"bf16"``
    probe : bool, optional
        Time a few calls compiled and eagerly (:class:`SpeedProbe`), by default True
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
        table_cudagraphs: bool = True,
        table_options: TableOptions = None,
        precision: str | None = None,
        fp32_modules: tuple[str, ...] = (),
        probe: bool = True,
    ) -> None:
        self.module = module
        self.report = report
        self.options = options
        self.table_cudagraphs = table_cudagraphs
        self.table_options = table_options
        self.precision = precision
        report.precision = precision
        self.pad_batch = pad_batch
        self.bundle = (
            RegionBundle(artifacts, owner or report.model, report.region, module)
            if artifacts is not None and options.backend == "inductor"
            else None
        )
        self.probe = SpeedProbe(report, enabled=probe)
        self.policy: CompilePolicy | None = None
        self._compiled: Callable[..., Any] | None = None
        self._backend: _torch.CountingBackend | None = None
        self._batch: int | None = None
        self._installed = False
        self._opaque = [
            OpaqueSubmodule(m, f"{report.label}.{path}")
            for path, m in find_opaque(module, opaque)
        ]
        report.opaque = len(self._opaque)
        self._fp32 = (
            [KeepFp32(m) for _, m in find_opaque(module, fp32_modules)]
            if precision == "bf16"
            else []
        )

    # -- install / restore -------------------------------------------------------
    def install(self) -> None:
        """Route the module's calls through this region."""
        # Set through __dict__: nn.Module.__setattr__ would be fine for a plain
        # callable too, but this makes the single touched key explicit.
        self.module.__dict__[MODULE_SLOT] = self
        self._installed = True
        # fp32 wrappers first: an opaque operator then calls the wrapped forward.
        for wrapper in self._fp32:
            wrapper.install()
        for op in self._opaque:
            op.install()

    def restore(self) -> None:
        """Put the module back exactly as it was: no slot left in its ``__dict__``."""
        if self._installed:
            if self.module.__dict__.get(MODULE_SLOT) is self:
                del self.module.__dict__[MODULE_SLOT]
            for op in reversed(self._opaque):
                op.restore()
            for wrapper in reversed(self._fp32):
                wrapper.restore()
            self._installed = False
        # Dropping the compiled function drops its code object and with it every
        # Dynamo cache entry of this region; no process-wide reset is needed.
        self._compiled = None
        self._backend = None

    # -- calls ---------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        r = self.report
        r.calls += 1
        reference = None
        if self.precision in ("tf32", "bf16") and r.calls == 1:
            # Inputs and buffers copied before the call, which may update them.
            reference = precision.Reference.before(self.module, args, kwargs)
        out = self._dispatch(args, kwargs)
        if reference is not None:
            start = time.perf_counter()
            self._measure_precision(reference, _first_device(args, kwargs), out)
            r.phases["precision_reference"] = time.perf_counter() - start
        return out

    def _dispatch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        r = self.report
        if r.status == "eager":
            return self._eager(args, kwargs)
        if self._compiled is None:
            try:
                reason = self._setup(_first_device(args, kwargs))
            except Exception as err:  # nothing on the compile path may end a forecast
                reason = f"setting up torch.compile failed ({describe(err)})"
            if reason is not None:
                self._fall_back(reason, cause=None)
                return self._eager(args, kwargs)
        if (
            r.status == "compiled"
            and self.probe.wants_eager(r.calls)
            and not self._needs_padding(args)
        ):
            return self._probe_eager(args, kwargs)
        return self._compiled_call(args, kwargs)

    def _compiled_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        r = self.report
        assert self._backend is not None and self._compiled is not None
        backend, compiled = self._backend, self._compiled
        first = r.status == "pending"
        device = _first_device(args, kwargs)
        timed = not first and self.probe.times_compiled(r.calls)
        start = time.perf_counter()
        graphs, runs = backend.graphs, backend.runs
        backend_seconds = backend.backend_seconds
        try:
            staged = self._stage(args)
            warm = False
            if first and self.bundle is not None and self.policy is not None:
                # Autocast changes the compiled graph: bf16 and fp32 bundles differ.
                r.artifact = self.bundle.load(
                    staged.args,
                    kwargs,
                    device,
                    f"{self.policy.cache_text}|precision={self.precision}",
                )
                r.phases["bundle_load"] = time.perf_counter() - start
                warm = r.artifact == "loaded"
            skips, fx = _torch.cudagraph_skips(), _torch.fx_cache_counts()
            if timed:
                synchronize(device)
                start = time.perf_counter()
            with (
                _no_grad(),
                precision.scope(self.precision, device),
                _torch.call_context(self._recompile_limit(), warm),
            ):
                if self._cudagraphs:
                    _torch.mark_cudagraph_step()
                out = compiled(*staged.args, **kwargs)
            out = precision.restore_dtype(out, self.precision, args)
            out = staged.finish(self._unpad(out, staged))
            if self._cudagraphs:
                # CUDA-graph outputs are overwritten by the next replay.
                out = tree_map(
                    lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out
                )
        except Exception as err:
            return self._recover(err, args, kwargs, time.perf_counter() - start)
        if first or (r.calls == 2 and self._cudagraphs):
            # The first call compiles and the second records the CUDA graph: both
            # are part of what compiling costs, so both are timed to the end.
            synchronize(device)
        seconds = time.perf_counter() - start
        if timed:
            synchronize(device)
            self.probe.record("compiled", time.perf_counter() - start, r.calls)
        if r.calls == 2 and self._cudagraphs and r.status == "compiled":
            r.phases["cudagraph_record"] = seconds
        if first:
            self._first_phases(seconds, backend.backend_seconds - backend_seconds)
            if backend.runs == runs:
                # Dynamo ran the frame without compiled code (nothing to trace, a
                # skipped frame, a "force_eager" stance): not compiled, so say so.
                r.compile_seconds += seconds
                r.phases["before_fallback"] = seconds
                self._fall_back(
                    "torch.compile ran no compiled code for it (Dynamo produced no "
                    "graph or skipped the frame)",
                    cause=None,
                )
                return out
            hits, misses = (a - b for a, b in zip(_torch.fx_cache_counts(), fx))
            r.cache = cache_state(hits, misses)
            if r.cache is not None:
                r.cache_source = local_cache_source(_torch.inductor_cache_dir())
            if self.bundle is not None:
                saving = time.perf_counter()
                r.artifact = self.bundle.finish(misses, r.artifact)
                r.phases["bundle_save"] = time.perf_counter() - saving
                seconds += r.phases["bundle_save"]
        self._account(
            backend.graphs - graphs, seconds, first, _torch.cudagraph_skips() - skips
        )
        return out

    def _first_phases(self, seconds: float, backend: float) -> None:
        """Split the first call's wall time into what each part of compiling took."""
        phases = self.report.phases
        assert self._backend is not None
        phases["backend"] = backend
        phases["first_run"] = self._backend.first_run_seconds or 0.0
        # What is left is Dynamo's: tracing the bytecode, propagating fake tensors,
        # building guards (and staging the arguments, which costs next to nothing).
        phases["dynamo"] = max(
            0.0,
            seconds
            - phases.get("bundle_load", 0.0)
            - phases["backend"]
            - phases["first_run"],
        )

    def _needs_padding(self, args: tuple[Any, ...]) -> bool:
        valid = _batch_size(args)
        return (
            self.pad_batch
            and self._batch is not None
            and valid not in (None, self._batch)
        )

    def _stage(self, args: tuple[Any, ...]) -> StagedCall:
        pad_to = None
        if self.pad_batch:
            valid = _batch_size(args)
            if valid is not None:
                if self._batch is None:
                    self._batch = valid
                elif valid < self._batch:
                    pad_to = self._batch
                    self.report.padded_calls += 1
        return StagedCall(args, torch.is_inference_mode_enabled(), pad_to)

    def _unpad(self, out: Any, staged: StagedCall) -> Any:
        if staged.pad_to is None:
            return out
        valid = _batch_size(staged.originals)
        return tree_map(
            lambda t: (
                t[:valid]
                if isinstance(t, torch.Tensor)
                and t.ndim
                and t.shape[0] == staged.pad_to
                else t
            ),
            out,
        )

    def _eager(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.report.eager_calls += 1
        return self._run_eager(args, kwargs)

    def _run_eager(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # A fallback keeps the region's precision: the forecast stays consistent.
        device = _first_device(args, kwargs)
        return precision.call(
            self.precision, device, self.module._call_impl, args, kwargs
        )

    def _measure_precision(
        self, reference: precision.Reference, device: torch.device, out: Any
    ) -> None:
        r = self.report
        assert self.precision is not None
        try:
            r.precision_error = reference.error(out, device)
        except Exception as err:  # a measurement must not end a forecast
            logger.debug(f"No fp32 reference for {r.label}: {describe(err)}")
            return
        precision.log_error(r.label, self.precision, r.precision_error)

    def _probe_eager(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        device = _first_device(args, kwargs)
        synchronize(device)
        start = time.perf_counter()
        out = self._run_eager(args, kwargs)
        synchronize(device)
        self.probe.record("eager", time.perf_counter() - start, self.report.calls)
        return out

    def _setup(self, device: torch.device) -> str | None:
        """Build the compiled function; a reason instead when it cannot be built."""
        reason = _torch.preflight(self.options.backend, device)
        if reason is not None:
            return reason
        if self._opaque and _torch.missing("reparametrize"):
            return _torch.missing("reparametrize")
        policy = CompilePolicy.resolve(
            self.options, device, self.table_cudagraphs, self.table_options
        )
        if policy.cudagraphs and _torch.missing("cudagraph_step"):
            return _torch.missing("cudagraph_step")
        self.policy = policy
        self.report.mode = policy.label
        self._backend = _torch.CountingBackend(
            policy.backend, policy.mode, policy.options, policy.dynamic
        )
        self._compiled = _torch.compile_region(
            self.module,
            self.report.label,
            self._backend,
            fullgraph=policy.fullgraph,
            dynamic=policy.dynamic,
        )
        return None

    @property
    def _cudagraphs(self) -> bool:
        return self.policy is not None and self.policy.cudagraphs

    @staticmethod
    def _recompile_limit() -> int:
        # A user who lowered Dynamo's own limit keeps the lower one.
        return min(RECOMPILE_LIMIT, _torch.recompile_limit() or RECOMPILE_LIMIT)

    # -- bookkeeping ---------------------------------------------------------------
    def _account(self, graphs: int, seconds: float, first: bool, skips: int) -> None:
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
        # Each graph beyond the first of one compile is a graph break.
        breaks = max(graphs - 1, 0)
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
        self,
        err: Exception,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        seconds: float,
    ) -> Any:
        # Re-run eagerly first: if eager fails too, the input or the model is at
        # fault, not the compiler, and the caller gets the eager error unchanged.
        out = self._eager(args, kwargs)
        if self.report.status == "pending" or _torch.is_recompile_limit_hit(err):
            self.report.compile_seconds += seconds
            self.report.phases["before_fallback"] = seconds
        self._fall_back(describe(err), cause=err)
        return out

    def _fall_back(self, reason: str, cause: BaseException | None) -> None:
        r = self.report
        if cause is not None and _torch.is_recompile_limit_hit(cause):
            reason = (
                f"recompile storm: {self._recompile_limit()} compiled variants "
                "and still recompiling"
            )
        elif r.status == "pending" and r.artifact == "loaded" and self.bundle:
            reason += f" (after loading the compile cache bundle {self.bundle.path})"
        stage = "at its first call" if r.status == "pending" else f"at call {r.calls}"
        if r.phases.get("before_fallback"):
            stage += f" after {r.phases['before_fallback']:.1f} s"
        r.status = "eager"
        r.reason = reason
        if self.bundle is not None:
            self.bundle.release()  # processes waiting for this compile take over
        self._compiled = None
        self._backend = None
        what = (
            "That call ran eagerly" if cause is None else "That call was re-run eagerly"
        )
        logger.warning(
            f"torch.compile failed for {r.label} {stage}: {reason}. {what} "
            f"and {r.label} stays eager for the rest of the session; no output is "
            f"lost. {_TORCH_LOGS_HINT}"
        )


def _batch_size(args: tuple[Any, ...]) -> int | None:
    """Size of dim 0 shared by every positional tensor argument, if any."""
    sizes = {a.shape[0] for a in args if isinstance(a, torch.Tensor) and a.ndim}
    return sizes.pop() if len(sizes) == 1 else None
