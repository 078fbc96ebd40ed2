"""How a region turns eager: an error, a slower speed, an interrupted call.

A :class:`~earth2studio_compile.region.CompiledRegion` mixes in :class:`Fallback`.
A compiled call that raises is run again eagerly (:meth:`Fallback._recover`): the
caller gets eager's answer, or eager's own error where eager fails too (the input
or the model is at fault, not the compiler); where a reduced precision fails
eagerly at the first call, the caller's precision takes over
(:meth:`Fallback._eager_in_some_precision`). The region then runs eagerly for good,
with one WARNING (:meth:`Fallback._fall_back`). The speed probe's verdict turns a
region eager the same way, without an error (:meth:`Fallback._eager_if_slower`).
A device out-of-memory error beside compiled code turns the whole session eager
and frees that code's memory before the call runs again
(:meth:`Fallback._out_of_memory`), but for one in the speed probe's own eager
call, which stops the probe instead (the region's ``_probe_out_of_memory``).
Before any eager call after compiled ones, what CUDA graphs left on the region's
modules is copied out of their memory pool (:meth:`Fallback._off_the_pool`).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from loguru import logger

from earth2studio_compile import _torch, module_state, precision, resident
from earth2studio_compile.executors import recompile_limit
from earth2studio_compile.first_call import RegionState
from earth2studio_compile.measured import warn_fallback
from earth2studio_compile.probe import slower_text
from earth2studio_compile.report import describe, interruption

if TYPE_CHECKING:
    from earth2studio_compile.executors import Executor
    from earth2studio_compile.report import RegionReport
    from earth2studio_compile.staging import Call

__all__ = ["Fallback"]


class Fallback:
    """The ways a :class:`~earth2studio_compile.region.CompiledRegion` turns eager.

    A mixin: the region gives it its report, precision, state and eager call.
    """

    if TYPE_CHECKING:  # what the region (region.py) gives its fallback
        module: torch.nn.Module
        report: RegionReport
        precision: str | None
        _state: RegionState
        _executor: Executor | None
        _held: module_state.HeldTensors | None
        _pool_used: bool
        _siblings: Sequence[Fallback]
        state: RegionState

        def _eager(self, call: Call, count: bool = True) -> Any: ...

        def _drop_executor(self) -> None: ...

    def _eager_if_slower(self) -> None:
        """Run eagerly from the next call where the speed probe found compiled
        calls slower than eager ones (:func:`.probe.is_slower`; this process's
        probe, or an earlier process's or session's figures): ``compile=True`` is
        not left slower than eager. One WARNING; the executor stays (unused) for
        the shelf, without the memory its CUDA graphs held: FCN3's probe found
        most of its fifteen artifacts slower, each kept its graph, and a later
        call ran out of memory beside 63.6 GiB of graph pools (H200,
        2026-12-01)."""
        r = self.report
        if not r.slower or self._state is not RegionState.COMPILED:
            return
        self._off_the_pool()  # eager calls read the modules' own memory
        if self._executor is not None:
            self._executor.free_graphs()
        self.state = RegionState.EAGER
        r.reason = slower_text(r)
        logger.warning(
            f"{r.label} {r.reason}: it runs eagerly for the rest of the session; no "
            "output is lost. CompileSession(probe=False) keeps it compiled."
        )

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

    def _off_the_pool(self) -> None:
        """Copy out of CUDA-graph memory what a CUDA-graph executor's calls left on
        the region's modules (tensors reassigned since the first call), before an
        eager call or the user reads them (:mod:`earth2studio_compile.module_state`)."""
        if self._pool_used and self._held is not None:
            module_state.take_out(self._held.changed())
            self._held = module_state.HeldTensors(self.module)

    def _recover(self, err: Exception, call: Call, seconds: float) -> Any:
        # Re-run eagerly first: if eager fails too (in a reduced precision, also in
        # the caller's), the input or the model is at fault, not the compiler, and
        # the caller gets the eager error unchanged.
        # The eager call reads the modules' own memory, not a CUDA graph's.
        self._off_the_pool()
        reason = describe(err)
        out, dropped = self._eager_in_some_precision(call, reason)
        spent = None
        if self._state is RegionState.PENDING or _torch.is_recompile_limit_hit(err):
            spent = seconds
            self.report.compile_seconds += seconds
            self.report.phases["before_fallback"] = seconds
        self._fall_back(reason + dropped, cause=err, spent=spent)
        return out

    def _out_of_memory(
        self, err: torch.OutOfMemoryError, call: Call, counted: bool
    ) -> Any:
        """The call once more, eagerly, with the device memory compiled code holds
        freed.

        Compiled code holds device memory eager does not: each CUDA graph keeps
        the peak of its own call in a pool of its own, and code kept for a later
        session keeps its graphs. Beside fifteen artifacts' CUDA graphs (64 GiB),
        FCN3's surface decoder ran out of memory while it ran eagerly, and the
        forecast ended where eager alone runs (H200, 2026-12-01). So where this
        session's regions or the process's kept code hold compiled code, every
        region of the session runs eagerly from here, that code is dropped, and
        the call runs again: one WARNING. Where none was held, or eager runs out
        again, the error is the caller's; so it is for a region whose forward
        reassigns tensors kept on its modules (physicsnemo's ConvGRU, found at
        its first compiled call): the failed call may have changed that state,
        and a second one could update it twice.

        Parameters
        ----------
        err : torch.OutOfMemoryError
            What the call raised
        call : Call
            The call
        counted : bool
            Its failed attempt counted an eager call already
        """
        r = self.report
        holding = [x for x in self._siblings if x._executor is not None]
        kept = resident.kept_count()
        if (not holding and not kept) or r.no_cudagraphs is not None:
            raise err
        reason = (
            f"out of device memory beside compiled code at {r.label}'s step "
            f"{r.calls} ({describe(err)})"
        )
        for region in self._siblings:
            if region._state is not RegionState.EAGER:
                # Eager calls read the modules' own memory, not a CUDA graph's.
                region._off_the_pool()
                region.state = RegionState.EAGER
                region.report.reason = reason
            region._drop_executor()
        resident.release()
        gc.collect()  # the graphs' pools go with their last reference
        torch.cuda.empty_cache()  # does nothing where CUDA never started
        out = self._eager(call, count=not counted)
        labels = ", ".join(region.report.label for region in holding) or "none"
        logger.warning(
            f"{r.label} ran out of device memory at step {r.calls} "
            f"({describe(err)}) while compiled code held memory (this session's "
            f"{labels}; {kept} regions kept from earlier sessions): that code is "
            "released, every region of this session runs eagerly for the rest of "
            "it, and the call was re-run eagerly; no output is lost."
        )
        return out

    def _eager_in_some_precision(self, call: Call, reason: str) -> tuple[Any, str]:
        """The eager call, and what the fallback's WARNING adds: where a reduced
        precision fails eagerly too at the first call, the caller's precision
        settings from then on (StormCast's UNet refuses CPU autocast: bf16 on the
        CPU raised, compiled and eager; fp32 turns off the autocast a model's own
        wrapper enters, FCN3's or AIFS's, and its fp32 weights then meet bf16
        inputs). Another eager error (one the caller's precision gives too) is the
        caller's, unchanged."""
        try:
            return self._eager(call), ""
        except Exception as err:
            # A precision a core refuses shows at its first call; a later error
            # is the input's (a call on it once more could update state twice).
            first = self._state is RegionState.PENDING
            if not first or self.precision not in ("fp32", "tf32", "bf16"):
                raise
            dropped, self.precision = self.precision, None
            try:
                out = self._eager(call, count=False)
            except Exception:
                self.precision = dropped  # the input is at fault: its error
                raise err from None
            self.report.precision = None
            why = describe(err)
        why = "the same error" if why == reason else why
        return out, (
            f"; in {dropped} it fails eagerly too ({why}), so it runs in "
            f"your precision settings (ask for them: unset {precision.ENV}, or "
            "precision=None)"
        )

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
