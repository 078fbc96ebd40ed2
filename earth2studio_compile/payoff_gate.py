"""Whether a region's first call compiles on the Dynamo path, from what compiling
would pay within the session's steps.

A region no ahead-of-time artifact serves compiles at its first call in every
process. :class:`PayoffGate`, mixed into the region's first call
(:class:`~earth2studio_compile.first_call.FirstCall`), asks first, where the
workflow told its steps (:meth:`~earth2studio_compile.CompileSession.expect`) and
the speed probe is on: an earlier process's figures
(:mod:`~earth2studio_compile.artifacts.payoff`) say whether the compile pays for
itself within those steps; with none yet, a judge
(:mod:`~earth2studio_compile.artifacts.judge`) is prepared to find them in a
background process once the session closes (:meth:`PayoffGate._launch_judge`),
and the region runs eagerly meanwhile. Where no judge can run, the region
compiles to find out, as before. A region an ahead-of-time artifact serves asks
too, before it loads the artifact (:meth:`PayoffGate._artifact_reason`): its
figures come from the build or an earlier session that ran it, and without them it
runs the artifact, as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from loguru import logger

from earth2studio_compile.artifacts import background, judge, payoff
from earth2studio_compile.executors import Target
from earth2studio_compile.probe import signature
from earth2studio_compile.staging import Call

if TYPE_CHECKING:
    from earth2studio_compile.options import CompileOptions
    from earth2studio_compile.probe import SpeedProbe
    from earth2studio_compile.report import RegionReport
    from earth2studio_compile.spec import ModelSpec

__all__ = ["PayoffGate"]


class PayoffGate:
    """What compiling a region would pay within the session's steps, asked before
    its first call compiles on the Dynamo path. A mixin: the region gives it its
    settings and report."""

    #: The workflow's steps in this session, where the caller said
    #: (:meth:`~earth2studio_compile.CompileSession.expect`).
    steps: int | None = None
    #: Where the first call's figures of compile against calls are kept
    #: (:mod:`~earth2studio_compile.artifacts.payoff`).
    _payoff_at: Path | None = None
    #: A judge of the region's compile, launched as the session closes, where no
    #: figures were kept yet (:mod:`~earth2studio_compile.artifacts.judge`).
    _judge: judge.JudgeJob | None = None
    #: Where the figures of the first call's artifact are kept
    #: (:func:`~earth2studio_compile.artifacts.payoff.payoff_path`).
    _artifact_at: Path | None = None

    if TYPE_CHECKING:  # what the region (region.py) gives it
        report: RegionReport
        options: CompileOptions
        spec: ModelSpec
        probe: SpeedProbe

        @property
        def _root(self) -> Path | None: ...

    def _payoff_reason(self, call: Call, target: Target) -> str | None:
        """Why ``call``, a first call about to compile on the Dynamo path, runs
        eagerly instead: the figures say the compile cannot pay within the
        session's steps, or a judge is finding them; None where it compiles
        (``probe=False``, no steps told, figures that say it pays, no judge)."""
        self._payoff_at = self._figures_path(call, target, artifact=False)
        if self._payoff_at is None or self.steps is None:
            return None
        kept = payoff.recall(self._payoff_at)
        if kept is None:
            failed = payoff.recall_failure(self._payoff_at)
            if failed is not None:
                return self._failed_earlier(failed)
            return self._judged_later(call, target)
        return None if kept.pays(self.steps) else kept.text(self.steps)

    def _artifact_reason(self, call: Call, target: Target) -> str | None:
        """Why ``call``, a first call about to load the region's ahead-of-time
        artifact, runs eagerly instead: the figures kept of it say loading it and
        recording its CUDA graph cost more than its calls save within the
        session's steps; None where it runs the artifact (``probe=False``, no
        steps told, no figures, figures that say it pays)."""
        self._artifact_at = self._figures_path(call, target, artifact=True)
        if self._artifact_at is None or self.steps is None:
            return None
        kept = payoff.recall(self._artifact_at)
        if kept is None or kept.pays(self.steps):
            return None
        return kept.text(self.steps, payoff.ARTIFACT_COST)

    def _figures_path(self, call: Call, target: Target, artifact: bool) -> Path | None:
        """Where the payoff figures of ``call``'s region (its artifact's, with
        ``artifact``) are kept; None where nothing is to be decided or kept
        (``probe=False``, no steps told, no cache) or the path cannot be made:
        the region then compiles or runs its artifact, as before."""
        # Without the workflow's steps there is nothing to decide or to keep.
        if not self.probe.enabled or self.steps is None:
            return None
        try:
            inputs = signature(call.args, call.kwargs)
            return payoff.payoff_path(target, self._root, inputs, artifact)
        except Exception as err:
            logger.debug(f"{self.report.label}: no payoff figures ({err!r})")
            return None

    def _keep_artifact_figures(self) -> None:
        """As the session closes: what running its artifact saved and cost here,
        at the session's calls per step, for a later process's first call."""
        r = self.report
        if self._artifact_at is None or not self.steps or r.executor != "aot":
            return
        if r.interrupted is not None:
            return
        figures = payoff.artifact_figures(r, r.calls / self.steps)
        if figures is not None:
            payoff.keep(self._artifact_at, figures, r.label)

    def _failed_earlier(self, failed: str) -> str:
        """Eager, with one WARNING: an earlier process's judge of this region ended
        without figures, as a compile here would."""
        assert self._payoff_at is not None
        why = (
            f"an earlier process's judge could not compile and time it ({failed}); "
            f"delete {payoff.failure_path(self._payoff_at)} to judge it again"
        )
        logger.warning(f"{self.report.label} runs eagerly: {why}")
        return why

    def _judged_later(self, call: Call, target: Target) -> str | None:
        """A judge of this region's compile for the session's end: why the
        region runs eagerly meanwhile; None where none can judge it."""
        why = judge.unjudged(target, self._root)
        if why is None or self._payoff_at is None:
            return None
        session = {
            "spec": self.spec,
            "options": self.options,
            "inference": torch.is_inference_mode_enabled(),
        }
        try:
            job = judge.prepare(
                target, call.args, call.kwargs, self._root, self._payoff_at, session
            )
        except Exception as err:  # nothing on the compile path may end a forecast
            job = f"{type(err).__name__}: {err}"
        if isinstance(job, judge.JudgeJob):
            self._judge = job
            return why
        if job == judge.BUSY:  # its figures are on the way: do not compile for them
            return f"no figures yet of what compiling it saves: {job}"
        logger.debug(f"{self.report.label}: no judge ({job})")
        return None

    def _launch_judge(self) -> None:
        """As the session closes: launch the judge prepared at the first call,
        told the region's calls per step (once the workflow's writers are done:
        :func:`~earth2studio_compile.artifacts.background.deferred`); drop it where
        the calls per step are not known (an interrupted session)."""
        job, self._judge = self._judge, None
        if job is None:
            return
        r = self.report
        if self.steps and r.interrupted is None:
            job.set_calls_per_step(r.calls / self.steps)
            background.launch_later(job)
        else:
            job.cancel()
