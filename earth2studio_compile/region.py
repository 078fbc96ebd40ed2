"""One submodule compiled in place, with fallback to eager at its first failing call.

A region hooks ``nn.Module._compiled_call_impl``, the slot ``nn.Module.compile()``
uses, so parameters, buffers and ``state_dict`` keys are untouched and the model's
own code (coordinate handling, numpy, datetimes) keeps running eagerly around it.
``torch.compile`` is lazy: errors appear at the first call, not at the wrap, so the
region catches them there, re-runs that call eagerly and stays eager.

A region is a small state machine (:class:`RegionState`): *pending* until its first
call picks an executor (:mod:`earth2studio_compile.executors`) from
:data:`~earth2studio_compile.executors.CANDIDATES` and runs it
(:mod:`earth2studio_compile.first_call`, which the region mixes in: the choice, code
kept from an earlier session, a later call handed over; and
:mod:`earth2studio_compile.first_call_ahead`, the first call ahead),
*building* while calls run eagerly as a background build makes its artifact,
*compiled* while the executor runs compiled calls, and *eager* once it has fallen
back, for good (:mod:`earth2studio_compile.fallback`, mixed in too). The call path
(:meth:`CompiledRegion._dispatch` to :meth:`CompiledRegion._run`) is the same for
every compiled executor: :class:`~earth2studio_compile.staging.StagedCall` (the
arguments compiled code sees, and the mutations it makes, handed back), precision,
CUDA-graph step marks and output clones; :class:`~earth2studio_compile.hooks.Hooks`
what the region changes on its module while installed; every call, whatever runs
it, inside :func:`earth2studio_compile.nvtx.quiet` where the entry sets
``quiet_nvtx``. The speed probe (:mod:`earth2studio_compile.probe`) and the first
call's phases (laps of :class:`~earth2studio_compile.metrics.Laps`) only observe.

The region is the only writer of its report: an executor measures each call
(:class:`~earth2studio_compile.measured.Measured`), and the region records it
(:func:`~earth2studio_compile.measured.record`, which also logs what it means).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import (
    accuracy,
    metrics,
    module_state,
    nvtx,
    precision,
    resident,
)
from earth2studio_compile._torch import tree_map
from earth2studio_compile.artifacts import payoff
from earth2studio_compile.executors import (
    RECOMPILE_LIMIT,
    Declined,
    EagerExecutor,
    Executor,
)
from earth2studio_compile.fallback import Fallback
from earth2studio_compile.first_call import RegionState
from earth2studio_compile.first_call_ahead import FirstCallAhead
from earth2studio_compile.hooks import Hooks
from earth2studio_compile.measured import record
from earth2studio_compile.metrics import Laps
from earth2studio_compile.options import CompileOptions
from earth2studio_compile.probe import SpeedProbe, signature
from earth2studio_compile.report import RegionReport, describe, interruption
from earth2studio_compile.spec import ModelSpec
from earth2studio_compile.staging import (
    BatchPadding,
    Call,
    StagedCall,
    clone_tensor,
    no_grad_if_enabled,
)

__all__ = ["RECOMPILE_LIMIT", "CompiledRegion", "RegionState", "SpeedProbe"]


class CompiledRegion(FirstCallAhead, Fallback):
    """A submodule compiled in place for the lifetime of a session.

    Parameters
    ----------
    module : torch.nn.Module
        Submodule to compile (the model's tensor-only core)
    report : RegionReport
        Where the region records what happened
    options : CompileOptions
        The user's ``torch.compile`` arguments
    spec : ModelSpec
        The model table's entry for the owning model (or the generic path's):
        batch padding, opaque and fp32 submodules, CUDA graphs, Inductor options
    precision : str | None, optional
        Precision inside the region's calls (:mod:`earth2studio_compile.precision`),
        by default None (PyTorch's global settings)
    artifacts, owner : Path | None, str | None, optional
        Directory of portable compile-cache bundles (see
        :mod:`earth2studio_compile.cache`; None: off), and the qualified class name
        of the model that owns the region (part of a bundle's key; by default the
        report's model name)
    probe : bool, optional
        Time a few calls compiled and eagerly (:class:`SpeedProbe`), by default True
    warned : set[str] | None, optional
        Models already warned that their table entry refuses the device, shared
        by a session's regions (one WARNING per model); by default the region's own
    siblings : list[CompiledRegion] | None, optional
        The session's regions, this one among them once installed: what a device
        out-of-memory error turns eager (:meth:`Fallback._out_of_memory`); by
        default this region alone
    """

    def __init__(
        self,
        module: torch.nn.Module,
        report: RegionReport,
        options: CompileOptions,
        spec: ModelSpec,
        precision: str | None = None,
        artifacts: Path | None = None,
        owner: str | None = None,
        probe: bool = True,
        warned: set[str] | None = None,
        siblings: list[CompiledRegion] | None = None,
    ) -> None:
        self.module = module
        self.report = report
        self.options = options
        self.spec = spec
        self.precision = precision
        report.precision = precision
        self.artifacts = artifacts
        self.owner = owner or report.model
        self.probe = SpeedProbe(report, enabled=probe)
        # Models already warned that a device is refused (shared by a session's
        # regions: one WARNING per model).
        self._warned = warned if warned is not None else set()
        self._siblings: Sequence[Fallback] = [self] if siblings is None else siblings
        self.probe.judged = self._judged
        self._state = RegionState.PENDING
        self._executor: Executor | None = None
        self._eager_executor = EagerExecutor(module)
        self.padding = BatchPadding(self.spec.pad_batch)
        self.hooks = Hooks(module, report.label, self.spec, precision)
        report.opaque = len(self.hooks.opaque)
        # The tensors its modules held before its first call, and whether a
        # CUDA-graph executor has run a call since (module_state.py).
        self._held: module_state.HeldTensors | None = None
        self._pool_used = False

    @property
    def state(self) -> RegionState:
        """Where the region is; the report's ``status`` follows it."""
        return self._state

    @state.setter
    def state(self, value: RegionState) -> None:
        self._state = value
        self.report.status = value.value

    def install(self) -> None:
        """Route the module's calls through this region."""
        self.hooks.install(self)

    def restore(self) -> None:
        """Put the module back exactly as it was; keep compiled code for the next
        session over it (:mod:`earth2studio_compile.resident`)."""
        self._join_ahead()
        self.hooks.restore(self)
        self._off_the_pool()
        executor, r = self._executor, self.report
        if self._payoff_at is not None and self.steps and r.executor == "dynamo":
            # What compiling cost and saved here, for a later process's first call.
            payoff.remember(self._payoff_at, r, self.steps)
        self._keep_artifact_figures()
        self._launch_judge()
        # A region eager for being slower keeps its executor with the verdict: a
        # later session over the core turns eager without compiling again.
        slower = self._state is RegionState.EAGER and r.slower
        if (
            executor is not None
            and executor.keepable
            and (self._state in (RegionState.COMPILED, RegionState.BUILDING) or slower)
            and self._shelf_key is not None
            and r.interrupted is None
        ):
            self._executor = None
            executor.detach()
            resident.keep(
                self.module, self._shelf_key, executor, r, self.padding.size, self._kept
            )
        self._kept = None
        self._drop_executor()

    # -- the call path -------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Around everything a call runs: tracing, compiled and eager calls, the
        # speed probe's, the fp32 reference, an artifact's verification.
        with nvtx.quiet(self.spec.quiet_nvtx):
            return self._call(args, kwargs)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        beside = self._ahead is not None and not self._ahead.done()
        if self._ahead is not None and not beside:
            self._join_ahead()
        r = self.report
        r.calls += 1
        # A new call: the run went on past any earlier interruption (caught).
        r.interrupted = None
        start = time.perf_counter()
        call = Call.of(args, kwargs)
        if beside:
            try:
                return self._beside_ahead(call)
            except BaseException as err:
                # The first call ahead still holds its executor: nothing to drop.
                r.interrupted = f"at step {r.calls} ({interruption(err)})"
                raise
        if self._state is RegionState.PENDING:
            self._refuse_device(call.device)
        if r.calls == 1 and self._state is RegionState.PENDING:
            self._take_kept(call)
        reference = None
        if (
            self.precision in ("tf32", "bf16")
            and r.calls == 1
            and r.precision_error is None
        ):
            # Inputs and buffers copied before the call, which may update them.
            reference = accuracy.Reference.before(self.module, args, kwargs)
        copied = time.perf_counter() - start
        eager_calls = r.eager_calls
        try:
            try:
                out = self._dispatch(call)
            except torch.OutOfMemoryError as err:
                counted = r.eager_calls > eager_calls
                out = self._out_of_memory(err, call, counted)
        except BaseException as err:
            self._interrupted(err, time.perf_counter() - start)
            raise
        # A precision the first call dropped (it failed eagerly) has no cost.
        if reference is not None and self.precision is not None:
            r.precision_error, seconds = accuracy.measure(
                reference, r.label, self.precision, out, call.device
            )
            r.phases["precision_reference"] = copied + seconds
        return out

    def _dispatch(self, call: Call) -> Any:
        if self._state is RegionState.EAGER:
            return self._eager(call)
        if self._state is RegionState.PENDING:
            return self._first(call)
        if self._executor is None:  # its first call left CUDA graphs
            return self._without_cudagraphs(call)
        n, kind = self.report.calls, None
        assert self._executor is not None
        if (
            not self.probe.done
            and not self._executor.compiling
            and not self.padding.needed(call.batch)
        ):
            kind = self.probe.kind(n, signature(call.args, call.kwargs))
        if kind == "eager":
            try:
                return self.probe.time(
                    "eager", n, call.device, lambda: self._eager_probe(call)
                )
            except torch.OutOfMemoryError as err:
                # The probe's eager call is ours, not the forecast's: FCN3's
                # decoder ran compiled, then its probe's eager call asked for
                # 20.4 GiB beside the CUDA graphs' pools and the whole session
                # turned eager (H200, 2026-12-02). A region that keeps state may
                # have changed it before it ran out: the OOM handler decides.
                if self.report.no_cudagraphs is not None:
                    raise
                return self._probe_out_of_memory(err, call)
        return self._steady(call, timed=kind == "compiled")

    def _probe_out_of_memory(self, err: torch.OutOfMemoryError, call: Call) -> Any:
        """The probe stops without a verdict and the call runs compiled, as the
        calls before it did."""
        why = (
            f"its eager call ran out of device memory beside compiled code at "
            f"step {self.report.calls} ({describe(err)})"
        )
        self.probe.stop(why)
        logger.info(
            f"{self.report.label}: the speed probe stops, {why}; it stays compiled"
        )
        return self._steady(call)

    def _steady(self, call: Call, timed: bool = False) -> Any:
        assert self._executor is not None
        r = self.report
        # The call after the executor's first records the CUDA graph: part of
        # what compiling costs.
        record = (
            r.calls == self._records_at
            and self._executor.cudagraphs
            and r.reused is None
        )
        start = time.perf_counter()
        run = functools.partial(self._run, call)  # timed one of three ways
        try:
            if timed:
                return self.probe.time("compiled", r.calls, call.device, run)
            if not record:
                return run()
            out, r.phases["cudagraph_record"] = metrics.timed(call.device, run)
            return out
        except Declined as declined:
            return self._hand_over(call, str(declined))
        except Exception as err:
            return self._recover(err, call, time.perf_counter() - start)

    def _run(self, call: Call, laps: Laps | None = None) -> Any:
        """One call through the executor: what every compiled executor gets.

        With ``laps``, the executor's first call, and laps for the region's own
        work around it: ``stage`` (staging the arguments, entering the precision
        scope) and ``finish`` (leaving it, casting back, writing back, cloning).
        """
        executor = self._executor
        assert executor is not None
        r = self.report
        pad_to = self.padding.pad_to(call.batch)
        r.padded_calls += pad_to is not None
        inference = torch.is_inference_mode_enabled()
        staged = StagedCall(call.args, inference, pad_to, call.batch)
        recompiles, compiling = r.recompiles, executor.compiling
        if self._held is None:  # before the first compiled call
            self._held = module_state.HeldTensors(self.module)
        self._pool_used |= executor.cudagraphs
        try:
            with no_grad_if_enabled(), precision.scope(self.precision, call.device):
                if laps is not None:
                    laps.lap("stage")
                    out = executor.first_call(staged.args, call.kwargs, laps)
                else:
                    out = executor(*staged.args, **call.kwargs)
        finally:
            # What the call measured counts even when it raised.
            record(self.report, executor.measured, first=laps is not None)
        if compiling and not executor.compiling and laps is None:
            self._built(executor)
        if r.recompiles != recompiles:
            self.probe.compiled_again(r.calls)
        out = precision.restore_dtype(out, self.precision, (call.args, call.kwargs))
        out = staged.finish(out)
        if executor.cudagraphs:
            # CUDA-graph outputs are overwritten by the next replay.
            out = tree_map(clone_tensor, out)
        if laps is not None:
            laps.lap("finish")
        return out

    def _built(self, executor: Executor) -> None:
        """The background build ended at this call: compiled from now on, or
        eager for good (its eager results stand; the report says why)."""
        r = self.report
        if executor.not_compiled is None:
            self.state = RegionState.COMPILED
            self.probe.cudagraphs = executor.cudagraphs
            self.probe.compiled_again(r.calls)
            return
        # No WARNING: nothing failed the caller sees; the summary says why.
        self.state = RegionState.EAGER
        r.reason = executor.not_compiled
        self._drop_executor()

    def _eager(self, call: Call, count: bool = True) -> Any:
        if count:
            self.report.eager_calls += 1
        # A fallback keeps the region's precision: the forecast stays consistent.
        return precision.call(
            self.precision, call.device, self._eager_executor, call.args, call.kwargs
        )

    def _eager_probe(self, call: Call) -> Any:
        # As the compiled calls run (no autograd graph): the output is what they
        # return, and the next compiled call gets the inputs it was compiled for.
        with no_grad_if_enabled():
            return self._eager(call, count=False)

    def _drop_executor(self) -> None:
        if self._executor is not None:
            self._executor.release()
        # Dropping the executor drops its compiled code object and with it every
        # Dynamo cache entry of this region; no process-wide reset is needed.
        self._executor = None
