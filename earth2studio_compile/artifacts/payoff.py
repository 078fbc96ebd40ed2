"""Whether a region's compile can pay for itself within one workflow call.

A region on the Dynamo path (no ahead-of-time artifact serves it: opaque Python
operators inside, or nothing built) compiles at its first call in every process:
Dynamo traces the core again even where Inductor's cache holds the kernels. Where
its compiled calls save less than that over the call's steps, ``compile=True``
made the call slower than eager: ACE2 at its published size on an H200 saved 3.5
ms a call against a 2.9 s first call from a warm cache, 20 calls a 20-step call
(docs/bench/2026-11-29-h200-twentyseventh). Once a process's speed probe has
judged such a region, what a call saves, what its first call cost that every
process pays (the whole first call where the cache was warm, else Dynamo's own
trace, which a warm cache does not spare) and its calls per workflow step are kept
(:func:`remember`); a later process's first call, told the workflow's steps, runs
the region eagerly where they say the compile cannot pay within the call
(:meth:`Payoff.pays`). Kept under the cache root's ``aot/payoff/``, keyed as the
region's hint (every setting, the core's constants) plus the inputs' shapes, the
device's kind, torch and the TF32 flags: figures of one place stand for no other.

A region an ahead-of-time artifact serves pays less, but not nothing: loading it,
its first run and recording its CUDA graph. FCN3's processor blocks at their
published size on an H200 saved 1 ms of 88 a call against 0.11 s of that beyond
eager's calls: over a 20-step call, ten artifacts made ``compile=True`` 1.2 s
slower than eager (docs/bench/2026-12-02-h200-fortyeighth). Their figures
(:func:`payoff_path` with ``artifact``; the cost
:attr:`RegionReport.ready_seconds`) are kept by
:func:`earth2studio_compile.build`, which times the artifact as a region would,
and by each workflow session that ran it; a later first call runs the region
eagerly, without loading the artifact, where they say it cannot pay.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

from earth2studio_compile.artifacts.hints import hint_path
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.speed import timing_text
from earth2studio_compile.artifacts.store import keep_json, keep_reason, read_reason
from earth2studio_compile.probe import SpeedProbe

__all__ = [
    "ARTIFACT_COST",
    "JUDGE_CALLS",
    "Payoff",
    "against",
    "artifact_figures",
    "failure_path",
    "figures_of",
    "keep",
    "keep_failure",
    "payoff_path",
    "recall",
    "recall_failure",
    "remember",
]


#: Calls of a region in a session that judges it, off a workflow's path
#: (:func:`earth2studio_compile.build`, :mod:`.judge`): the first compiles, the
#: next records CUDA graphs, eager's first call is untimed, then the speed probe
#: times its pairs of compiled and eager calls (as many as noisy pairs take), with
#: room for a recompile.
JUDGE_CALLS = 3 + 2 * SpeedProbe.MAX_PAIRS + 3

#: What an artifact's :attr:`Payoff.cost_s` is, for :meth:`Payoff.text`.
ARTIFACT_COST = (
    "getting its artifact ready (loading it, its first run, recording its CUDA "
    "graph where it has one) beyond eager's calls"
)


@dataclasses.dataclass(frozen=True)
class Payoff:
    """An earlier process's figures of a region's compile against its calls.

    Attributes
    ----------
    saved_ms : float
        Eager's median call minus the compiled one's (the speed probe's)
    cost_s : float
        The part of the first call every process pays, in seconds
    calls_per_step : float
        The region's calls per workflow step (StormCast's denoiser: one per
        sampler step)
    """

    saved_ms: float
    cost_s: float
    calls_per_step: float

    def pays(self, steps: int) -> bool:
        """Whether ``steps`` workflow steps save more than the compile costs."""
        return self.saved_ms / 1e3 * self.calls_per_step * steps > self.cost_s

    def break_even(self) -> int | None:
        """The fewest workflow steps that save more than the compile costs; None
        where a call saves nothing."""
        per_step = self.saved_ms / 1e3 * self.calls_per_step
        if per_step <= 0:
            return None
        return math.floor(self.cost_s / per_step) + 1

    def verdict(self) -> str:
        """What ``compile=True`` makes of these figures, for a build's report:
        ``"compile=True compiles it in calls of N steps or more, eagerly below"``."""
        steps = self.break_even()
        if steps is None:
            return "it saves nothing a call: compile=True runs it eagerly"
        return (
            f"compile=True compiles it in calls of {steps} steps or more, eagerly below"
        )

    def text(
        self, steps: int, cost: str = "compiling at each process's first call"
    ) -> str:
        """Why not, for the report: ``"compiling would not pay for itself in this
        call (...)"``.

        Parameters
        ----------
        steps : int
            The workflow's steps in the session
        cost : str, optional
            What :attr:`cost_s` is, by default the Dynamo path's first call

        Returns
        -------
        str
            The reason
        """
        calls = self.calls_per_step * steps
        return (
            f"compiling would not pay for itself in this call: {self.saved_ms:.2f} "
            f"ms saved a call, {calls:g} calls ({steps} steps), against "
            f"{self.cost_s:.2f} s of {cost} (measured in an earlier process)"
        )


def payoff_path(
    target: RegionTarget,
    root: Path | None,
    inputs: tuple[Any, ...],
    artifact: bool = False,
) -> Path | None:
    """Where the figures of ``target``'s region for these inputs are kept.

    Parameters
    ----------
    target : RegionTarget
        The region and its settings
    root : Path | None
        Cache root (None: the cache is off)
    inputs : tuple[Any, ...]
        The call's :func:`~earth2studio_compile.probe.signature`
    artifact : bool, optional
        The figures of its ahead-of-time artifact, apart from the Dynamo path's
        (whose compile costs more), by default False

    Returns
    -------
    Path | None
        The file, None without a cache
    """
    hint = hint_path(target, root)
    if hint is None:
        return None
    text = f"{hint.stem}|{inputs}|{timing_text(target.device, target.precision)}"
    name = hashlib.sha256(text.encode()).hexdigest()[:32]
    kind = "artifact-" if artifact else ""
    return hint.parent.parent / "payoff" / f"{kind}{name}.json"


def artifact_figures(report: Any, calls_per_step: float) -> Payoff | None:
    """What running ``report``'s artifact saved a call and cost to get ready
    (:attr:`RegionReport.ready_seconds`), at ``calls_per_step``.

    Parameters
    ----------
    report : RegionReport
        The region's report, its artifact timed (its probe's or an earlier
        process's figures) and its first call's phases in it
    calls_per_step : float
        Its calls per workflow step (1 where no workflow said: the build's)

    Returns
    -------
    Payoff | None
        None without the figures, for code compiled earlier in the process (its
        first call's phases are not this session's), or with no calls per step
    """
    ready = report.ready_seconds
    if ready is None or report.compiled_ms is None or report.reused is not None:
        return None
    if not (calls_per_step > 0 and math.isfinite(calls_per_step)):
        return None
    return Payoff(report.eager_ms - report.compiled_ms, ready, calls_per_step)


def remember(path: Path, report: Any, steps: int) -> None:
    """Keep what ``report``'s session measured: its probe's verdict, its first
    call, its calls over ``steps`` workflow steps. Never raises (a cache the
    process cannot write only means the next process compiles again); keeps
    nothing where the probe did not judge or the first call did not compile on
    the Dynamo path in this process.

    Parameters
    ----------
    path : Path
        :func:`payoff_path` of the region's first call
    report : RegionReport
        The region's report at the session's end
    steps : int
        The workflow's steps in the session
    """
    figures = figures_of(report, steps)
    if figures is not None:
        keep(path, figures, report.label)


def keep(path: Path, figures: Payoff, label: str) -> None:
    """Write ``figures`` to ``path``. Never raises (a cache the process cannot
    write only means the next process compiles again).

    Parameters
    ----------
    path : Path
        :func:`payoff_path` of the region's first call
    figures : Payoff
        What to keep
    label : str
        The region's label, for the DEBUG line of a failed write
    """
    keep_json(path, dataclasses.asdict(figures), f"the payoff of {label}")


def failure_path(path: Path) -> Path:
    """Where a judge that kept no figures at ``path`` says why.

    Parameters
    ----------
    path : Path
        :func:`payoff_path` of the region's first call

    Returns
    -------
    Path
        ``path`` with the suffix ``.failed.json``
    """
    return path.with_suffix(".failed.json")


def keep_failure(path: Path, reason: str, label: str) -> None:
    """Keep why a judge's session of the region ended without figures (its compile
    failed, or its probe never judged it). The key holds everything such an end
    depends on (the core's code and settings, the inputs, torch): a later process
    would launch the same judge and see it end the same way, so it runs the
    region eagerly instead (:func:`recall_failure`). Never raises.

    Parameters
    ----------
    path : Path
        :func:`payoff_path` of the region's first call
    reason : str
        The judge's session's reason
    label : str
        The region's label, for the DEBUG line of a failed write
    """
    keep_reason(failure_path(path), reason, f"the failed judge of {label}")


def recall_failure(path: Path | None) -> str | None:
    """Why an earlier judge of the figures at ``path`` kept none; None where none
    failed, or the record is not readable (a judge is tried, as without it).

    Parameters
    ----------
    path : Path | None
        :func:`payoff_path` of the region's first call

    Returns
    -------
    str | None
        The judge's reason
    """
    return None if path is None else read_reason(failure_path(path))


def figures_of(report: Any, steps: int) -> Payoff | None:
    """The figures :func:`remember` keeps of ``report``'s session.

    Parameters
    ----------
    report : RegionReport
        The region's report at the session's end
    steps : int
        The workflow's steps in the session

    Returns
    -------
    Payoff | None
        None where the probe did not judge, or the first call did not compile on
        the Dynamo path in this process
    """
    first = report.first_call_seconds
    dynamo = report.phases.get("dynamo")
    if report.compiled_ms is None or not report.eager_ms or dynamo is None:
        return None
    if steps <= 0 or report.calls <= 0 or first is None:
        return None
    return Payoff(
        saved_ms=report.eager_ms - report.compiled_ms,
        cost_s=first if report.cache == "warm" else dynamo,
        calls_per_step=report.calls / steps,
    )


def recall(path: Path | None) -> Payoff | None:
    """The figures an earlier process kept at ``path``; None where none were kept,
    or they are not readable as such (the region compiles, as without them)."""
    if path is None:
        return None
    try:
        kept = json.loads(path.read_text())
        payoff = Payoff(
            float(kept["saved_ms"]),
            float(kept["cost_s"]),
            float(kept["calls_per_step"]),
        )
    except Exception:
        return None
    numbers = (payoff.saved_ms, payoff.cost_s, payoff.calls_per_step)
    if not all(math.isfinite(x) for x in numbers) or payoff.calls_per_step <= 0:
        return None
    return payoff


def against(path: Path | None, steps: int | None) -> str | None:
    """Why a region should run eagerly in a call of ``steps`` workflow steps, from
    the figures kept at ``path``; None where it should compile (no figures, no
    steps, or a compile that pays).

    Parameters
    ----------
    path : Path | None
        :func:`payoff_path` of the region's first call
    steps : int | None
        The workflow's steps in the session (None: not said)

    Returns
    -------
    str | None
        The report's reason (:meth:`Payoff.text`), or None
    """
    kept = recall(path)
    if kept is None or steps is None or kept.pays(steps):
        return None
    return kept.text(steps)
