"""Judge a Dynamo-path region's compile in a child process, off the forecast's path.

A region no ahead-of-time artifact can serve (opaque submodules: ACE2's spectral
convolutions) compiles at its first call in every process, and whether that pays
within the call the payoff figures of an earlier process say (:mod:`.payoff`). The
first process of a cache has none: it compiled to find out, and ACE2's 20-step
call took 19.89 s against 3.76 s eager on an H200
(docs/bench/2026-11-29-h200-twentyeighth). Now, where background builds run
(:func:`.background.enabled`), that first process runs the region eagerly
(:func:`unjudged` says why) and, as its session closes, hands a copy of the core
to a child process (:mod:`earth2studio_compile.judge_process`) that compiles it on
the Dynamo path as a session would, times it against eager with the speed probe,
and keeps the figures for the next process; its compile also leaves Inductor's
cache warm for a process that compiles. The job is a background build's
(:class:`.build_job.BuildJob`: a session of its own, ``nice`` 10, half the cores,
launched once the workflow's writers are done); one judge per figures file at a
time. ``build()`` judges the same regions in its own process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from earth2studio_compile.artifacts import background
from earth2studio_compile.artifacts.aot_key import aot_root
from earth2studio_compile.artifacts.build_job import BuildJob
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.payoff import JUDGE_CALLS
from earth2studio_compile.artifacts.store import held
from earth2studio_compile.cache import make_private_dir

__all__ = ["BUSY", "JUDGE_CHILD", "JudgeJob", "judge_lock", "prepare", "unjudged"]

#: What a judge's process runs (``python -c JUDGE_CHILD JOB_DIR``).
JUDGE_CHILD = (
    "import sys; from earth2studio_compile.judge_process import main; "
    "sys.exit(main(sys.argv[1:]))"
)


#: :func:`prepare`'s answer while another process judges the same figures.
BUSY = "another process judges it now (eager in this one)"


def judge_lock(figures: Path) -> Path:
    """The file lock a judge holds while it judges for the figures file
    ``figures``.

    Parameters
    ----------
    figures : Path
        The payoff figures' file
        (:func:`~earth2studio_compile.artifacts.payoff.payoff_path`)

    Returns
    -------
    Path
        ``figures`` with the suffix ``.judge.lock``
    """
    return figures.with_suffix(".judge.lock")


class JudgeJob(BuildJob):
    """A judge's process, as the process that started it sees it; its
    :attr:`artifact` is the figures file it writes."""

    child = JUDGE_CHILD

    def set_calls_per_step(self, calls_per_step: float) -> None:
        """Tell the waiting job the region's calls per workflow step, known once
        the session ends (the child's figures carry them)."""
        if self._payload is not None:
            self._payload["calls_per_step"] = calls_per_step

    def _left(self) -> bool:
        return self.artifact.is_file()

    def describe(self) -> str:
        state = self.poll()
        if state == "built":
            return f"judged in the background in {self.seconds:.1f} s ({self.artifact})"
        if state == "failed":
            return f"not judged in the background: {self.reason}"
        return f"to be judged in the background; its figures go to {self.artifact}"


def unjudged(target: RegionTarget, root: Path | None) -> str | None:
    """Why a region with no figures runs eagerly while a child judges it; None
    where no judge can run (no cache, background builds off on its device: the
    region compiles to find out, as before).

    Parameters
    ----------
    target : RegionTarget
        The region and its settings
    root : Path | None
        Cache root (None: the cache is off)

    Returns
    -------
    str | None
        The report's reason
    """
    if root is None or not background.enabled(target.device):
        return None
    return (
        "no figures yet of what compiling it saves: eager in this process while a "
        "background process compiles and times it for the next "
        f"({background.ENV}=off compiles it here)"
    )


def prepare(
    target: RegionTarget,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    root: Path | None,
    figures: Path,
    session: dict[str, Any],
) -> JudgeJob | str:
    """A waiting judge of ``target``'s region for the figures file ``figures``.

    Launch it with :func:`~earth2studio_compile.artifacts.background.launch_later`
    once :meth:`JudgeJob.set_calls_per_step` has told it the calls per step.

    Parameters
    ----------
    target : RegionTarget
        The region (its module's hooks may be installed) and its settings
    args, kwargs : tuple, dict
        Its first call's arguments
    root : Path | None
        Cache root
    figures : Path
        :func:`~earth2studio_compile.artifacts.payoff.payoff_path` of the call
    session : dict[str, Any]
        What the child's session is opened with: ``spec`` (the region's
        :class:`~earth2studio_compile.spec.ModelSpec`), ``options`` (its
        :class:`~earth2studio_compile.options.CompileOptions`), ``inference``

    Returns
    -------
    JudgeJob | str
        The job, or why none can start (:data:`BUSY`: another process judges
        it now)
    """
    directory = aot_root(root)
    if directory is None:
        return "the compile cache is off"
    # A later session of this process, while its judge has not taken the lock yet.
    for job in background.started():
        if isinstance(job, JudgeJob) and job.artifact == figures:
            if job.poll() in ("waiting", "running"):
                return BUSY
    make_private_dir(figures.parent)
    try:
        if held(judge_lock(figures)):
            return BUSY
    except OSError as err:
        return f"no lock on this file system ({err})"
    return background.make_job(
        JudgeJob,
        target,
        args,
        kwargs,
        directory,
        figures,
        f"judge-{figures.stem}",
        figures=figures,
        calls=JUDGE_CALLS,
        calls_per_step=None,
        **session,
    )
