"""One submodule compiled in place, with fallback to eager at its first failing call.

A region hooks ``nn.Module._compiled_call_impl``, the slot ``nn.Module.compile()``
uses, so parameters, buffers and ``state_dict`` keys are untouched and the model's
own code (coordinate handling, numpy, datetimes) keeps running eagerly around it.
``torch.compile`` is lazy: errors appear at the first call, not at the wrap, so the
region catches them there, re-runs that call eagerly and stays eager.

A region is a small state machine (:class:`RegionState`): *pending* until its first
call picks an executor (:mod:`earth2studio_compile.executors`) from
:data:`~earth2studio_compile.executors.CANDIDATES` and runs it, *building* while
calls run eagerly as a background build makes its artifact, *compiled* while the
executor runs compiled calls, and *eager* once it has fallen back, for good. The
call path
(:meth:`CompiledRegion._dispatch` to :meth:`CompiledRegion._run`) is the same for
every compiled executor: :class:`~earth2studio_compile.staging.StagedCall` (the
arguments compiled code sees, and the mutations it makes, handed back), precision,
CUDA-graph step marks and output clones; :class:`~earth2studio_compile.hooks.Hooks`
what the region changes on its module while installed. The speed probe
(:mod:`earth2studio_compile.probe`) and the first call's phases (laps of
:class:`~earth2studio_compile.metrics.Laps`) only observe.

The region is the only writer of its report: an executor measures each call
(:class:`~earth2studio_compile.measured.Measured`), and the region records it
(:func:`~earth2studio_compile.measured.record`, which also logs what it means).
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable
from concurrent.futures import Executor as Pool
from concurrent.futures import Future, wait
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch, accuracy, metrics, precision, resident
from earth2studio_compile._torch import tree_map
from earth2studio_compile.artifacts import hints
from earth2studio_compile.executors import (
    RECOMPILE_LIMIT,
    AotExecutor,
    Declined,
    EagerExecutor,
    Executor,
    Target,
    offers,
    recompile_limit,
)
from earth2studio_compile.hooks import Hooks
from earth2studio_compile.measured import record, warn_fallback
from earth2studio_compile.metrics import Laps, synchronize
from earth2studio_compile.models import ModelSpec
from earth2studio_compile.options import CompileOptions
from earth2studio_compile.probe import SpeedProbe, signature
from earth2studio_compile.report import RegionReport, describe, interruption
from earth2studio_compile.staging import (
    BatchPadding,
    Call,
    StagedCall,
    clone_tensor,
    no_grad_if_enabled,
)

__all__ = ["RECOMPILE_LIMIT", "CompiledRegion", "RegionState", "SpeedProbe"]

#: Executors whose first call leaves an artifact for its inputs, now or once built.
HINTED = ("aot", "background")


class RegionState(enum.Enum):
    """Where a region is; its value is the report's ``status``."""

    PENDING = "pending"
    #: Eager calls while the region's artifact builds in the background.
    BUILDING = "building"
    COMPILED = "compiled"
    EAGER = "eager"


class CompiledRegion:
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
        self._state = RegionState.PENDING
        self._executor: Executor | None = None
        self._eager_executor = EagerExecutor(module)
        self.padding = BatchPadding(self.spec.pad_batch)
        self.hooks = Hooks(module, report.label, self.spec, precision)
        report.opaque = len(self.hooks.opaque)
        # The first call's RegionTarget.resident_key(): where the executor is kept.
        self._shelf_key: str | None = None
        self._kept: resident.Kept | None = None
        # The first call started ahead of the workflow's (:meth:`ahead`).
        self._ahead: Future[bool] | None = None

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
        executor, r = self._executor, self.report
        if (
            executor is not None
            and executor.keepable
            and self._state in (RegionState.COMPILED, RegionState.BUILDING)
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
        if self._ahead is not None:
            self._join_ahead()
        r = self.report
        r.calls += 1
        # A new call: the run went on past any earlier interruption (caught).
        r.interrupted = None
        start = time.perf_counter()
        call = Call.of(args, kwargs)
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
        try:
            out = self._dispatch(call)
        except BaseException as err:
            self._interrupted(err, time.perf_counter() - start)
            raise
        if reference is not None:
            name = self.precision
            assert name is not None
            r.precision_error, seconds = accuracy.measure(
                reference, r.label, name, out, call.device
            )
            r.phases["precision_reference"] = copied + seconds
        return out

    def _dispatch(self, call: Call) -> Any:
        if self._state is RegionState.EAGER:
            return self._eager(call)
        if self._state is RegionState.PENDING:
            return self._first(call)
        n, kind = self.report.calls, None
        assert self._executor is not None
        if (
            not self.probe.done
            and not self._executor.compiling
            and not self.padding.needed(call.batch)
        ):
            kind = self.probe.kind(n, signature(call.args, call.kwargs))
        if kind == "eager":
            return self.probe.time(
                "eager", n, call.device, lambda: self._eager_probe(call)
            )
        return self._steady(call, timed=kind == "compiled")

    def _first(self, call: Call) -> Any:
        """Run the first call on the first candidate that takes it.

        Its wall time is cut into laps (:class:`~earth2studio_compile.metrics.Laps`):
        ``setup`` (building the candidates), ``declined`` (candidates that gave
        way), ``stage``, the executor's own phases, and ``finish``.
        """
        # Known before any executor takes the region: a fallback's summary needs it.
        self.report.device = call.device.type
        out = self._choose(call, Laps(), self._compiled)
        if self._executor is not None and self._executor.name in HINTED:
            # Its artifact exists or is being built: a later process's guess.
            target = _target(self, call.device)
            hints.remember(target, self._root, call.args, call.kwargs)
        return out

    # -- the first call, ahead of the workflow's ----------------------------------
    def ahead(self, pool: Pool) -> None:
        """Start the first call on ``pool``, before the workflow reaches the region,
        on made-up inputs shaped like the last first call's (:mod:`.artifacts.hints`)
        and only on an ahead-of-time artifact already on disk for them: load it,
        run it, verify it against eager. The workflow's first call waits for it
        (``ahead_wait`` in the report's phases) and finds the region compiled, or
        still pending if it declined (another shape, no artifact: nothing is
        compiled there). Only for regions that change no global setting
        (``precision`` None, no fp32 submodules), since the workflow runs beside.

        Parameters
        ----------
        pool : concurrent.futures.Executor
            Where the call runs
        """
        if (
            self._state is RegionState.PENDING
            and not self.report.calls
            and self._ahead is None
            and self.precision is None
            and not self.spec.fp32_modules
            and self._root is not None
        ):
            self._ahead = pool.submit(self._first_ahead)

    @property
    def _root(self) -> Path | None:
        return self.artifacts.parent if self.artifacts is not None else None

    def _first_ahead(self) -> bool:
        weights = [*self.module.parameters(), *self.module.buffers()]
        if not weights:
            return False
        device = weights[0].device
        target = _target(self, device)
        hint = hints.recall(target, self._root)
        if hint is None:
            return False
        args, kwargs, inference = hint
        call = Call.of(args, kwargs)
        self._take_kept(call)  # compiled earlier in this process: nothing to load
        chosen = AotExecutor.build(target)
        if self._state is not RegionState.PENDING or isinstance(chosen, str):
            return False
        self.report.device = device.type
        laps = Laps()
        # This thread's current CUDA device is the first one, not the caller's.
        on = torch.cuda.device(device) if device.type == "cuda" else nullcontext()
        try:
            with on, torch.inference_mode(inference):
                out = self._attempt(call, chosen, target, laps)
        except Exception as err:  # the workflow's first call tries again
            logger.debug(f"{self.report.label}: no first call ahead ({describe(err)})")
            self._executor = None
            return False
        self._compiled(chosen, out, laps)
        return True

    def _join_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        start = time.perf_counter()
        wait([ahead])
        if ahead.exception() is not None:
            logger.debug(
                f"{self.report.label}: first call ahead: {ahead.exception()!r}"
            )
        elif ahead.result():
            self.report.phases["ahead_wait"] = time.perf_counter() - start

    def _choose(
        self, call: Call, laps: Laps, chosen_by: Callable[[Executor, Any, Laps], Any]
    ) -> Any:
        """Run ``call`` on the first candidate that takes it; ``chosen_by`` accounts
        for the call. When none takes it, the region falls back to eager."""
        reason = "no executor was offered"
        try:
            target = _target(self, call.device)
            candidates = offers(target)
        except Exception as err:  # nothing on the compile path may end a forecast
            candidates = iter(())
            reason = f"setting up torch.compile failed ({describe(err)})"
        for chosen in candidates:
            if isinstance(chosen, str):
                reason = chosen
                continue
            try:
                out = self._attempt(call, chosen, target, laps)
            except Declined as declined:
                # Nothing was handed back: the next candidate runs the same call.
                laps.lap("declined")
                reason = str(declined)
                self.report.declined.append(f"{chosen.name}: {reason}")
                continue
            except Exception as err:
                return self._recover(err, call, laps.clock() - laps.start)
            return chosen_by(chosen, out, laps)
        self._executor = None
        self._fall_back(reason, cause=None)
        return self._eager(call)

    def _attempt(self, call: Call, chosen: Executor, target: Target, laps: Laps) -> Any:
        """``chosen``'s first call of ``call``, its laps merged into ``laps`` once it
        has run, its kernels included; whatever it raises goes to the caller."""
        laps.lap("setup")
        self._executor = chosen
        self.report.mode = target.policy.label
        attempt = laps.child()
        out = self._run(call, attempt)
        synchronize(call.device)  # the first call's kernels count here
        attempt.lap("finish")
        laps.merge(attempt)
        return out

    def _hand_over(self, call: Call, reason: str) -> Any:
        """A later call its executor cannot take (an artifact built for other
        inputs): the candidates are tried again for it, as a recompile, rather
        than the region turning eager."""
        assert self._executor is not None
        self.report.declined.append(f"{self._executor.name}: {reason}")
        self._drop_executor()
        return self._choose(call, Laps(), self._recompiled)

    def _recompiled(self, chosen: Executor, out: Any, laps: Laps) -> Any:
        """Account for a later call that a newly chosen executor compiled."""
        r = self.report
        seconds = laps.seconds
        r.recompiles += 1
        r.compile_seconds += seconds
        r.executor = chosen.name
        self.probe.cudagraphs = chosen.cudagraphs
        self.probe.compiled_again(r.calls)
        if chosen.not_compiled is not None:
            self._fall_back(chosen.not_compiled, cause=None, spent=seconds)
            return out
        logger.info(
            f"{r.label} compiled again at step {r.calls} for inputs its earlier code "
            f"was not built for ({chosen.name}, {seconds:.1f} s): {r.declined[-1]}"
        )
        return out

    def _take_kept(self, call: Call) -> None:
        """Run code an earlier session compiled for this module, if it fits."""
        try:
            self._shelf_key = _target(self, call.device).resident_key()
        except Exception:  # _first reports why the target cannot be built
            return
        kept = resident.take(self.module, self._shelf_key)
        if kept is None:
            return
        r = self.report
        self._kept = kept
        self._executor = kept.executor
        for name, value in kept.figures.items():
            if self.probe.enabled or name not in resident.SPEED:
                setattr(r, name, value)
        r.device = call.device.type
        r.reused = (
            f"compiled earlier in this process (first call "
            f"{kept.first_seconds:.1f} s), session {kept.sessions + 1}"
        )
        self.padding.size = kept.padding
        self.probe.cudagraphs = kept.executor.cudagraphs
        self.state = (
            RegionState.BUILDING if kept.executor.compiling else RegionState.COMPILED
        )

    def _compiled(self, chosen: Executor, out: Any, laps: Laps) -> Any:
        """Account for a first call that ran on ``chosen``."""
        r = self.report
        seconds = laps.seconds
        r.compile_seconds += seconds
        r.phases.update(laps.phases)
        r.executor = chosen.name
        if chosen.not_compiled is not None:
            r.phases["before_fallback"] = seconds
            self._fall_back(chosen.not_compiled, cause=None, spent=seconds)
            return out
        self.state = RegionState.BUILDING if chosen.compiling else RegionState.COMPILED
        self.probe.cudagraphs = chosen.cudagraphs
        logger.trace(f"Compiled {r.label} ({chosen.name}, {r.mode}) in {seconds:.1f} s")
        return out

    def _steady(self, call: Call, timed: bool = False) -> Any:
        assert self._executor is not None
        r = self.report
        # The second call records the CUDA graph: part of what compiling costs.
        record = r.calls == 2 and self._executor.cudagraphs and r.reused is None
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
        out = precision.restore_dtype(out, self.precision, call.args)
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

    # -- observing and falling back ----------------------------------------------
    def _interrupted(self, err: BaseException, seconds: float) -> None:
        """Note that a call ended by ``err`` (Ctrl-C, an error eager raises too)."""
        r = self.report
        if self._state is RegionState.PENDING:
            r.interrupted = (
                f"while compiling (step {r.calls}, after {seconds:.1f} s, "
                f"{interruption(err)})"
            )
            # Nothing compiled is kept: processes waiting for this compile go on.
            self._drop_executor()
        else:
            r.interrupted = f"at step {r.calls} ({interruption(err)})"

    def _drop_executor(self) -> None:
        if self._executor is not None:
            self._executor.release()
        # Dropping the executor drops its compiled code object and with it every
        # Dynamo cache entry of this region; no process-wide reset is needed.
        self._executor = None

    def _recover(self, err: Exception, call: Call, seconds: float) -> Any:
        # Re-run eagerly first: if eager fails too, the input or the model is at
        # fault, not the compiler, and the caller gets the eager error unchanged.
        out = self._eager(call)
        spent = None
        if self._state is RegionState.PENDING or _torch.is_recompile_limit_hit(err):
            spent = seconds
            self.report.compile_seconds += seconds
            self.report.phases["before_fallback"] = seconds
        self._fall_back(describe(err), cause=err, spent=spent)
        return out

    def _fall_back(
        self, reason: str, cause: BaseException | None, spent: float | None = None
    ) -> None:
        r = self.report
        first = self._state is RegionState.PENDING
        if cause is not None and _torch.is_recompile_limit_hit(cause):
            reason = (
                f"recompile storm: {recompile_limit()} compiled variants "
                "and still recompiling"
            )
        elif first and self._executor is not None and self._executor.source:
            reason += f" (after loading {self._executor.source})"
        # The step is the caller's: the region's own calls (the fp32 reference,
        # an artifact's verification) never pass through its slot.
        stage = "at its first call" if first else f"at step {r.calls}"
        if spent:
            stage += f" after {spent:.1f} s"
        self.state = RegionState.EAGER
        r.reason = reason
        self._drop_executor()  # processes waiting for this compile take over
        warn_fallback(r, stage, rerun=cause is not None)


def _target(region: CompiledRegion, device: torch.device) -> Target:
    """What the candidates are asked to run: the region, its policy on ``device``."""
    return Target.resolve(
        region.module,
        owner=region.owner,
        region=region.report.region,
        device=device,
        precision=region.precision,
        options=region.options,
        table=region.spec,
        opaque=bool(region.hooks.opaque),
        fp32_modules=region.spec.fp32_modules,
        report=region.report,
        artifacts=region.artifacts,
    )
