"""How a region leaves *pending*: its first call, which picks the executor it runs on.

A :class:`~earth2studio_compile.region.CompiledRegion` mixes in :class:`FirstCall`.
Its first call takes code an earlier session compiled for the same module where it
fits (:mod:`earth2studio_compile.resident`), or else tries the candidates
(:func:`~earth2studio_compile.executors.offers`) in turn on the call: each try is
one :meth:`FirstCall._attempt`, the first candidate that takes the call becomes the
region's executor, and with none the region falls back to eager. A later call its
executor declines (an artifact built for other inputs) is handed over to the
candidates again, as a recompile (:meth:`FirstCall._hand_over`). A first call on
CUDA graphs that left new tensor state on the region's modules has that state
copied out of the graph pool, and the next call compiles the region again without
CUDA graphs (:meth:`FirstCall._leave_cudagraphs`,
:mod:`earth2studio_compile.module_state`).
The first call may also start before the workflow reaches the region
(:mod:`earth2studio_compile.first_call_ahead`).

The call path each attempt runs (staging, precision, output clones) is the
region's (:mod:`earth2studio_compile.region`), the fallback its mixin's
(:mod:`earth2studio_compile.fallback`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from loguru import logger

from earth2studio_compile import module_state, resident
from earth2studio_compile.artifacts import hints, speed
from earth2studio_compile.executors import (
    Declined,
    Executor,
    Target,
    offers,
    root_of,
)
from earth2studio_compile.metrics import Laps, synchronize
from earth2studio_compile.payoff_gate import PayoffGate
from earth2studio_compile.precision import ambient_autocast
from earth2studio_compile.report import describe
from earth2studio_compile.spec import region_patches, unused_arguments
from earth2studio_compile.staging import Call

if TYPE_CHECKING:
    from earth2studio_compile.hooks import Hooks
    from earth2studio_compile.options import CompileOptions
    from earth2studio_compile.probe import SpeedProbe
    from earth2studio_compile.report import RegionReport
    from earth2studio_compile.spec import ModelSpec
    from earth2studio_compile.staging import BatchPadding

__all__ = ["FirstCall", "RegionState", "target_of"]

#: Executors whose first call leaves an artifact for its inputs, now or once built.
HINTED = ("aot", "background")


class RegionState(enum.Enum):
    """Where a region is; its value is the report's ``status``."""

    PENDING = "pending"
    #: Eager calls while the region's artifact builds in the background.
    BUILDING = "building"
    COMPILED = "compiled"
    EAGER = "eager"


class FirstCall(PayoffGate):
    """The first call of a :class:`~earth2studio_compile.region.CompiledRegion`,
    and the region's executor handed over at a later call.

    A mixin: the region gives it its settings, its report and its call path.
    """

    #: The first call's RegionTarget.resident_key(): where the executor is kept.
    _shelf_key: str | None = None
    _kept: resident.Kept | None = None
    #: The call that records the executor's CUDA graph (timed as
    #: ``cudagraph_record``): the one after its first, which may come after calls
    #: that ran eager beside the first call ahead (:mod:`.first_call_ahead`); None
    #: where the first call ahead recorded it too.
    _records_at: int | None = 2
    #: What the last executor's first call on CUDA graphs reassigned on the
    #: region's modules (:meth:`_attempt`); taken by :meth:`_leave_cudagraphs`.
    #: A tuple: a class attribute shared by every region until one sets its own.
    _reassigned: Sequence[module_state.HeldTensor] = ()
    #: Keeps the probe's figures beside the artifact the region runs, once judged
    #: (:meth:`_speed_beside`).
    _remember_speed: Callable[[], None] | None = None

    if TYPE_CHECKING:  # what the region (region.py) gives its first call
        module: torch.nn.Module
        report: RegionReport
        options: CompileOptions
        spec: ModelSpec
        precision: str | None
        artifacts: Path | None
        owner: str
        probe: SpeedProbe
        _warned: set[str]
        padding: BatchPadding
        hooks: Hooks
        _state: RegionState
        _executor: Executor | None
        _held: module_state.HeldTensors | None
        _pool_used: bool
        state: RegionState

        def _run(self, call: Call, laps: Laps | None = None) -> Any: ...

        def _eager(self, call: Call, count: bool = True) -> Any: ...

        def _drop_executor(self) -> None: ...

        # The fallback's (fallback.py), mixed into the region beside this.
        def _recover(self, err: Exception, call: Call, seconds: float) -> Any: ...

        def _fall_back(
            self, reason: str, cause: BaseException | None, spent: float | None = None
        ) -> None: ...

        def _eager_if_slower(self) -> None: ...

    @property
    def _root(self) -> Path | None:
        return root_of(self.artifacts)

    # -- the first call -------------------------------------------------------------
    def _first(self, call: Call) -> Any:
        """Run the first call on the first candidate that takes it.

        Its wall time is cut into laps (:class:`~earth2studio_compile.metrics.Laps`):
        ``setup`` (building the candidates), ``declined`` (candidates that gave
        way), ``stage``, the executor's own phases, and ``finish``.
        """
        # Known before any executor takes the region: a fallback's summary needs it.
        self.report.device = call.device.type
        self._records_at = self.report.calls + 1
        out = self._choose(call, Laps(), self._compiled)
        if self._executor is not None and self._executor.name in HINTED:
            # Its artifact exists or is being built: a later process's guess.
            target = target_of(self, call.device)
            hints.remember(target, self._root, call.args, call.kwargs)
        return out

    def _refuse_device(self, device: torch.device) -> None:
        """Eager for good on a device the model's table entry refuses
        (``devices_refused``: a wrong answer measured there, not yet explained),
        before anything compiled, kept or built ahead could run the call."""
        reason = self.spec.refused_on(device)
        if reason is None:
            return
        r = self.report
        self.state = RegionState.EAGER
        r.device, r.reason = device.type, reason
        if r.model in self._warned:
            logger.info(f"{r.label} runs eagerly: {reason}")
            return
        self._warned.add(r.model)
        why = self.spec.devices_refused[device.type]
        logger.warning(f"{r.model} runs eagerly on {device.type}: {why}")

    def _not_paying(self, call: Call, target: Target, chosen: Executor) -> bool:
        """Before a first call compiles on the Dynamo path (no artifact serves
        it) or loads an artifact: eager for good where the payoff figures say so,
        or while a judge finds the Dynamo path's
        (:class:`~earth2studio_compile.payoff_gate.PayoffGate`)."""
        if self._state is not RegionState.PENDING:
            return False
        if chosen.name == "dynamo":
            reason = self._payoff_reason(call, target)
        elif chosen.name == "aot":
            reason = self._artifact_reason(call, target)
        else:
            return False
        if reason is not None:
            self.state = RegionState.EAGER
            self.report.reason = reason
            logger.info(f"{self.report.label} runs eagerly: {reason}")
        return reason is not None

    def _choose(
        self, call: Call, laps: Laps, chosen_by: Callable[[Executor, Any, Laps], Any]
    ) -> Any:
        """Run ``call`` on the first candidate that takes it; ``chosen_by`` accounts
        for the call. When none takes it, the region falls back to eager."""
        reason = "no executor was offered"
        try:
            target = target_of(self, call.device)
            candidates = offers(target)
        except Exception as err:  # nothing on the compile path may end a forecast
            candidates = iter(())
            reason = f"setting up torch.compile failed ({describe(err)})"
        for chosen in candidates:
            if isinstance(chosen, str):
                reason = chosen
                continue
            if self._not_paying(call, target, chosen):
                # What deciding took (the figures read), for the report: a call
                # that runs eagerly should cost what eager does.
                laps.lap("payoff")
                self.report.phases.update(laps.phases)
                return self._eager(call)
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
        # A scan of the modules' tensors, cheap beside a first call.
        before = module_state.HeldTensors(self.module) if chosen.cudagraphs else None
        out = self._run(call, attempt)
        synchronize(call.device)  # the first call's kernels count here
        if before is not None:
            self._reassigned = before.changed()
        attempt.lap("finish")
        laps.merge(attempt)
        return out

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
        self._speed_beside(chosen)
        logger.trace(f"Compiled {r.label} ({chosen.name}, {r.mode}) in {seconds:.1f} s")
        self._leave_cudagraphs()
        return out

    def _speed_beside(self, chosen: Executor) -> None:
        """For an executor that runs an artifact (its ``runner`` has the artifact's
        ``path`` and ``device``): the speed probe's figures an earlier process kept
        beside it stand for this process's probe, which then times no eager calls
        (:mod:`~earth2studio_compile.artifacts.speed`), and a verdict of slower
        turns the region eager at once; without them, the probe's are kept there
        once judged, while ``chosen`` still runs the region."""
        runner = getattr(chosen, "runner", None)
        path, device = getattr(runner, "path", None), getattr(runner, "device", None)
        if not self.probe.enabled or path is None or device is None:
            return
        kept = speed.recall(Path(path), device, self.precision)
        if kept is not None:
            for name, value in kept.items():
                setattr(self.report, name, value)
            self.report.speed_earlier = True
            self._eager_if_slower()
            return

        def keep() -> None:
            if self._executor is chosen:
                speed.remember(Path(path), device, self.precision, self.report)

        self._remember_speed = keep

    def _judged(self) -> None:
        """The speed probe's figures are in the report: keep them beside the
        artifact the region runs, if any, and act on its verdict."""
        if self._remember_speed is not None:
            self._remember_speed()
        self._eager_if_slower()

    def _leave_cudagraphs(self) -> None:
        """After an executor's first call on CUDA graphs that reassigned tensors on
        the region's modules (a recurrent state, ``self.h = h_next``): copy them
        out of the graph pool, which the next replay overwrites, and drop the
        executor; the next call compiles the region again without CUDA graphs
        (:meth:`_without_cudagraphs`). Why not keep CUDA graphs and copy the state
        after every replay: :mod:`earth2studio_compile.module_state`."""
        changed, self._reassigned = self._reassigned, ()
        if not changed:
            return
        module_state.take_out(changed)
        r = self.report
        r.no_cudagraphs = f"its forward reassigns {module_state.describe(changed)}"
        logger.info(
            f"{r.label}: {r.no_cudagraphs}, a tensor kept on the module from call "
            "to call, which CUDA graphs would overwrite at their next replay: "
            "compiled again without CUDA graphs (Inductor's default mode) from "
            "its next call"
        )
        # Nothing of the pool is left on its modules: only a later CUDA-graph
        # executor's calls could put some there (the region takes those out).
        self._held = module_state.HeldTensors(self.module)
        self._pool_used = False
        self._drop_executor()

    def _without_cudagraphs(self, call: Call) -> Any:
        """The call after :meth:`_leave_cudagraphs`: the candidates again, on a
        target without CUDA graphs, as a recompile."""
        why = f"without CUDA graphs: {self.report.no_cudagraphs}"

        def account(chosen: Executor, out: Any, laps: Laps) -> Any:
            return self._recompiled(chosen, out, laps, why)

        return self._choose(call, Laps(), account)

    def _take_kept(self, call: Call) -> None:
        """Run code an earlier session compiled for this module, if it fits."""
        try:
            self._shelf_key = target_of(self, call.device).resident_key()
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
        # Judged slower in an earlier session: eager again, without compiling.
        self._eager_if_slower()

    # -- a later call its executor declines ----------------------------------------
    def _hand_over(self, call: Call, reason: str) -> Any:
        """A later call its executor cannot take (an artifact built for other
        inputs): the candidates are tried again for it, as a recompile, rather
        than the region turning eager."""
        assert self._executor is not None
        self.report.declined.append(f"{self._executor.name}: {reason}")
        self._drop_executor()
        return self._choose(call, Laps(), self._recompiled)

    def _recompiled(
        self, chosen: Executor, out: Any, laps: Laps, why: str | None = None
    ) -> Any:
        """Account for a later call that a newly chosen executor compiled: for
        ``why``, or (None) for inputs its earlier code was not built for."""
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
        if why is None:
            why = f"for inputs its earlier code was not built for: {r.declined[-1]}"
        logger.info(
            f"{r.label} compiled again at step {r.calls} ({chosen.name}, "
            f"{r.mode}, {seconds:.1f} s) {why}"
        )
        self._leave_cudagraphs()
        return out


def target_of(region: FirstCall, device: torch.device) -> Target:
    """What the candidates are asked to run: the region, its policy on ``device``.

    Parameters
    ----------
    region : FirstCall
        The region (its module, settings, report and artifacts root)
    device : torch.device
        Where the call runs

    Returns
    -------
    Target
        The region's target there
    """
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
        unused_arguments=unused_arguments(region.spec, region.module),
        patches=region_patches(region.spec, region.module),
        without_cudagraphs=region.report.no_cudagraphs is not None,
        # Read where the call runs: an ahead thread's target has none, and finds
        # no hint of a region its model's wrapper calls under autocast.
        autocast=ambient_autocast(device.type),
        report=region.report,
        artifacts=region.artifacts,
    )
