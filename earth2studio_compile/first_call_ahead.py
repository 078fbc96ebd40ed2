"""The first call ahead: a region's first call started before the workflow reaches it.

A :class:`~earth2studio_compile.region.CompiledRegion` mixes in :class:`FirstCallAhead`
(over :class:`~earth2studio_compile.first_call.FirstCall`). :meth:`FirstCallAhead.ahead`
starts the first call on a thread of its own, on made-up inputs shaped like the last
first call's (:mod:`earth2studio_compile.artifacts.hints`), only where an
ahead-of-time artifact for them is on disk: it loads and verifies the artifact and
records its CUDA graph while the workflow fetches its data. The workflow's calls
never wait for it: they run eagerly beside it (:meth:`FirstCallAhead._beside_ahead`),
and the first call after it ended finds the region compiled, or still pending.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Executor as Pool
from concurrent.futures import Future, wait
from contextlib import nullcontext
from typing import Any

import torch
from loguru import logger

from earth2studio_compile.artifacts import hints
from earth2studio_compile.executors import AotExecutor, Target
from earth2studio_compile.first_call import FirstCall, RegionState, target_of
from earth2studio_compile.metrics import Laps, timed
from earth2studio_compile.precision import AUTOCASTS, autocast_of
from earth2studio_compile.report import describe
from earth2studio_compile.staging import Call

__all__ = ["FirstCallAhead"]


class FirstCallAhead(FirstCall):
    """The first call of a :class:`~earth2studio_compile.region.CompiledRegion`,
    started ahead of the workflow's where an artifact for it is on disk.

    A mixin, like :class:`~earth2studio_compile.first_call.FirstCall`.
    """

    #: The first call started ahead of the workflow's (:meth:`ahead`).
    _ahead: Future[bool] | None = None

    def ahead(self, pool: Pool) -> None:
        """Start the first call on ``pool``, before the workflow reaches the region,
        on made-up inputs shaped like the last first call's (:mod:`.artifacts.hints`)
        and only on an ahead-of-time artifact already on disk for them: load it,
        run it, verify it against eager, and record its CUDA graph where it runs
        one (:meth:`_record_ahead`). The workflow's calls do not wait for it:
        while it runs they run eager (:meth:`_beside_ahead`); the first call
        after it ended finds the region compiled, or still pending if it declined
        (another shape, no artifact, or another answer than eager on the made-up
        inputs, logged at DEBUG only: that call verifies on its own; nothing is
        compiled there). Only for regions that
        change no global setting (``precision`` None, no fp32 submodules), since the
        workflow runs beside.

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
            target = self._hinted()
            if target is not None:
                self._ahead = pool.submit(self._first_ahead, target)

    def _hinted(self) -> Target | None:
        """The region's target where a hint of its inputs is on disk (well under a
        millisecond): without one there is nothing to load ahead, and the first
        call compiles on its own, not eagerly beside a first call ahead."""
        weights = [*self.module.parameters(), *self.module.buffers()]
        if not weights:
            return None
        if self.spec.refused_on(weights[0].device) is not None:
            return None
        base = target_of(self, weights[0].device)
        # This thread has no autocast: a region its model's wrapper calls under one
        # (AIFS's) left its hint under that autocast's keys.
        for autocast in (None, *AUTOCASTS):
            target = dataclasses.replace(base, autocast=autocast)
            path = hints.hint_path(target, self._root)
            if path is None:
                return None
            if path.is_file():
                return target
        return None

    def _first_ahead(self, target: Target) -> bool:
        device = target.device
        # This thread's current CUDA device is the first one, not the caller's.
        on = torch.cuda.device(device) if device.type == "cuda" else nullcontext()
        with on:  # the made-up inputs are drawn there
            hint = hints.recall(target, self._root)
        if hint is None:
            return False
        args, kwargs, inference = hint
        call = Call.of(args, kwargs)
        self._take_kept(call)  # compiled earlier in this process: nothing to load
        chosen = AotExecutor.build(target, made_up=True)
        if self._state is not RegionState.PENDING or isinstance(chosen, str):
            return False
        if self._artifact_reason(call, target) is not None:
            return False  # the workflow's first call runs it eagerly, and says why
        self.report.device = device.type
        laps = Laps()
        # Its eager check runs as the workflow's calls do, under their autocast.
        autocast = autocast_of(target.autocast, device)
        try:
            with on, torch.inference_mode(inference), autocast:
                out = self._attempt(call, chosen, target, laps)
        except Exception as err:  # the workflow's first call tries again
            logger.debug(f"{self.report.label}: no first call ahead ({describe(err)})")
            self._executor = None
            return False
        self._compiled(chosen, out, laps)
        # Only while the workflow is elsewhere (fetching its data): once it calls
        # the region, recording here would delay the switch and share the device
        # with its eager calls (0.47 s instead of 0.16 beside two of them, FCN on
        # an H100); its first compiled call records instead.
        if (
            chosen.cudagraphs
            and self._state is RegionState.COMPILED
            and not self.report.calls
        ):
            with on, torch.inference_mode(inference):
                self._record_ahead(call)
        return True

    def _record_ahead(self, call: Call) -> None:
        """Record the CUDA graph on the made-up inputs too, so that the workflow's
        first call replays it: recording took 0.16 s of a fresh FCN process's first
        step on an H100, beside a data source that kept the device idle for 0.65 s
        (docs/bench/2026-11-26-h100-sixth). The graph reads its inputs from static
        buffers each replay fills, so the made-up values do not stay in it. Where
        it fails (another thread's work broke the capture), the workflow's next
        call records, as without a first call ahead."""
        try:
            _, seconds = timed(call.device, lambda: self._run(call))
        except Exception as err:
            logger.debug(
                f"{self.report.label}: CUDA graph not recorded ahead ({describe(err)})"
            )
            return
        self.report.phases["cudagraph_record"] = seconds
        self._records_at = None

    def _beside_ahead(self, call: Call) -> Any:
        """A call the workflow makes while the first call ahead still runs: eager,
        as without compiling. Waiting for it cost fresh FCN processes 0.2-1.2 s
        of their first step on an H100 (``ahead_wait``, 6bdb8a0 to ab6ec89:
        docs/bench/2026-11-26-h100-fifth), however long the first call ahead
        took; an eager call costs what it does without compiling (with the
        first call ahead's work beside it)."""
        start = time.perf_counter()
        out = self._eager(call)
        phases = self.report.phases
        phases["ahead_eager"] = phases.get("ahead_eager", 0.0) + (
            time.perf_counter() - start
        )
        return out

    def wait_ahead(self) -> None:
        """Return once the first call ahead, if one was started, has ended; the
        region's next call takes its result."""
        if self._ahead is not None:
            wait([self._ahead])

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
            if self._records_at is not None:
                self._records_at = self.report.calls + 1
            # Not the steady call its speed probe may time (under CUDA graphs).
            self.probe.compiled_again(self.report.calls)
