"""Eager steps at once while the region's artifact is built in the background.

The executor a region gets at its first call when no ahead-of-time artifact
serves it yet (the :class:`~earth2studio_compile.executors.aot.AotExecutor`
declined): it starts a background build
(:mod:`earth2studio_compile.artifacts.background`) and runs the module eagerly,
in the region's precision, so no step waits for a compile. At later calls it
looks, without blocking and at most every :data:`LOOK_EVERY_S`, whether the build
ended; once it did, that call loads the artifact, runs it and compares it with one
eager call on the same input, and the calls from then on run the artifact (with
CUDA graphs on CUDA). A build that fails, or an artifact that fails verification,
leaves the region eager with its eager results, and the report says why. Where
an earlier process's build of the same key was refused
(:mod:`earth2studio_compile.artifacts.refused`), no build starts: it declines,
and the Dynamo path takes the region, behind its payoff gate
(:mod:`earth2studio_compile.payoff_gate`).
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile.artifacts import background, refused
from earth2studio_compile.artifacts.aot_key import aot_root
from earth2studio_compile.artifacts.aot_runner import AotRunner, SignatureMismatch
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.executors.aot import run_artifact
from earth2studio_compile.executors.base import Declined, Measured, Target
from earth2studio_compile.metrics import Laps

#: Seconds of eager calls before a waiting build is launched. A run shorter than
#: this (or than the build itself: FCN's took 134 s on an H100) gains nothing from it
#: while it runs, so its build starts when the session closes: the forecast does
#: not share the machine's cores and GPU with a compile it cannot use. Past it, a
#: build launches only while no other of this process runs.
LAUNCH_AFTER_S = 10.0

#: Seconds between looks at a running build. Looking at another process's build
#: takes its file lock (0.17 ms on a 2-core machine), and DLESyM's four regions
#: are called 520 times in a 20-step call; the switch waits for a step boundary
#: anyway.
LOOK_EVERY_S = 0.5


class BackgroundExecutor:
    """Eager calls until the region's artifact, built in a child process, is ready.

    Each call measures (:attr:`measured`) what the build is doing, in words, and
    the call that switches how long switching took; the region records both in
    its report.

    Attributes
    ----------
    job : BuildJob | None
        The background build, until its end was seen
    runner : AotRunner | None
        The verified artifact, once the region switched to it
    """

    name = "background"
    source: str | None = None
    not_compiled: str | None = None

    def __init__(self, target: Target) -> None:
        self.not_compiled = None
        self.target = target
        # For the verification's WARNING; the label is the module's in every session.
        self.label = target.report.label
        self._module = weakref.ref(target.module)
        self.job: background.BuildJob | None = None
        self.runner: AotRunner | None = None
        self._since = 0.0  # when the first call made the (waiting) build
        self._next_look = 0.0  # when a running build is looked at again
        self._said: str | None = None  # the running build, as last looked at
        self.keepable = False
        self.measured = Measured()
        # The settings without the module: a kept executor holds it weakly.
        self._settings = background.settings_of(target)
        self._root = target.root
        self._wants_cudagraphs = target.policy.cudagraphs

    @classmethod
    def build(cls, target: Target) -> BackgroundExecutor | str:
        """The executor for ``target``, or why it cannot build in the background."""
        if not background.enabled(target.device):
            device = target.device.type
            return f"background builds are off on {device} ({background.ENV})"
        if target.artifacts is None:
            return "the compile cache is off"
        if target.no_artifact is not None:
            return target.no_artifact
        reason = _torch.missing("aoti_compile") or _torch.missing("aoti_loader")
        return reason if reason is not None else cls(target)

    @property
    def cudagraphs(self) -> bool:
        """The artifact replays CUDA graphs (once switched)."""
        return self.runner is not None and self.runner.cudagraphs

    @property
    def compiling(self) -> bool:
        """Calls run eagerly while the build may still bring compiled code."""
        return self.runner is None and self.job is not None

    @property
    def module(self) -> torch.nn.Module:
        module = self._module()
        if module is None:  # the user dropped the model; nothing calls us then
            raise RuntimeError("the region's module is gone")
        return module

    def _target(self) -> RegionTarget:
        return RegionTarget(module=self.module, **self._settings)

    def first_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], laps: Laps
    ) -> Any:
        """Start the build, then run the call eagerly; a lap for each.

        See :meth:`~earth2studio_compile.executors.base.Executor.first_call`.
        """
        m = self.measured = Measured()
        # The key the artifact loader looked for: the target computes it once.
        key, _ = self.target.aot_key(args, kwargs)
        why = refused.recall(aot_root(self._root), key)
        if why is not None:
            # Not again: the same key, the same refusal, minutes of a machine
            # shared. The Dynamo path takes it, as a region no artifact can serve:
            # its payoff gate compiles it only where that pays within the call
            # (before, such a region stayed eager for good: AIFS2ENS's processor).
            raise Declined(
                f"no ahead-of-time artifact can be built for it (an earlier build: "
                f"{why})"
            )
        job = background.start(
            self._target(), args, kwargs, self._root, launch=False, key=key
        )
        laps.lap("background_start")
        if isinstance(job, str):
            raise Declined(job)
        self.job, self._since = job, time.monotonic()
        m.background = job.describe()
        out = _torch.call_module(self.module, args, kwargs)
        laps.lap("first_run")
        self.keepable = True
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The artifact once switched; before that eager, switching when the build
        has ended (a non-blocking look, at most every :data:`LOOK_EVERY_S`)."""
        m = self.measured = Measured()
        if self.runner is not None:
            try:
                return self.runner(*args, **kwargs)
            except SignatureMismatch as err:
                raise Declined(
                    f"its artifact was built for other inputs ({err})"
                ) from err
        job = self.job
        if job is not None and job.waiting:
            # One build of this process at a time while the forecast runs; the
            # others launch when it ends, or as the session closes.
            if (
                time.monotonic() - self._since > LAUNCH_AFTER_S
                and not background.building_here()
            ):
                job.launch()
            m.background = job.describe()
        elif job is not None and time.monotonic() < self._next_look:
            m.background = self._said
        elif job is not None and job.poll() == "running":
            self._next_look = time.monotonic() + LOOK_EVERY_S
            m.background = self._said = job.describe()
        elif job is not None:
            self.job = None
            m.background = job.describe()
            if job.poll() == "built":
                out = self._switch(args, kwargs, job)
                if out is not None:
                    return out[0]
            self.not_compiled = m.background
        return _torch.call_module(self.module, args, kwargs)

    def _switch(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], job: background.BuildJob
    ) -> tuple[Any] | None:
        """Load the artifact, run this call on it and verify it against eager;
        ``(output,)`` once switched, None when the region stays eager."""
        m = self.measured
        start = time.perf_counter()
        runner, out, reason = run_artifact(
            self._target(), args, kwargs, self._wants_cudagraphs, self._root
        )
        seconds = time.perf_counter() - start
        if runner is None:
            m.background = f"built in the background, but not loaded: {reason}"
            return None
        if reason is not None:
            m.background = f"built, but it gives another answer than eager ({reason})"
            logger.warning(
                f"The ahead-of-time artifact {runner.path} of {self.label}, built in "
                f"the background, gives another answer than eager ({reason}): not "
                f"used; {self.label} stays eager."
            )
            return None
        self.runner = runner
        self.source = f"the ahead-of-time artifact {runner.path}"
        m.background, m.switch_seconds = job.describe(), seconds
        m.verified_earlier = runner.verified_earlier
        return (out,)

    def detach(self) -> None:
        """Launch a build still waiting (the session ends; a workflow's writers
        finish first: :func:`~earth2studio_compile.artifacts.background.deferred`);
        keep no strong reference to the module or the session."""
        if self.job is not None:
            background.launch_later(self.job)
        self.target = None  # type: ignore[assignment]

    def free_graphs(self) -> None:
        """Drop the built artifact's CUDA graph, once one serves."""
        if self.runner is not None:
            self.runner.free_graph()

    def release(self) -> None:
        """Launch a build still waiting: it goes on for the next run."""
        if self.job is not None:
            background.launch_later(self.job)
