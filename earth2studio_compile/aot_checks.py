"""What :func:`~earth2studio_compile.aot.build` leaves for one region, and how it
checks an artifact it built or found: verified against eager on the captured call
and sealed (a forecast's first call then runs no eager call beside it), timed as a
region's speed probe would (the next process times no eager calls), or removed and
refused where it gives another answer than eager.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from loguru import logger

from earth2studio_compile import precision as _precision
from earth2studio_compile.artifacts import background, payoff, speed, verified
from earth2studio_compile.artifacts.aot_load import load_runner, wants_cudagraphs
from earth2studio_compile.artifacts.aot_runner import AotRunner
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.refused import refuse_artifact
from earth2studio_compile.metrics import synchronize, timed
from earth2studio_compile.probe import SpeedProbe, signature
from earth2studio_compile.report import RegionReport

__all__ = ["Built", "Captured", "refuse_wrong", "seal", "time_speed"]

#: A runner's phases of loading (:func:`~.artifacts.aot_load.load_runner`).
LOADED = ("key", "checksum", "aot_load", "bind")


@dataclass
class Built:
    """What :func:`~earth2studio_compile.aot.build` did for one region.

    Attributes
    ----------
    label : str
        ``Model.region``
    path : Path | None
        The artifact's directory; None if not built
    status : str
        ``"built"``, ``"present"`` (a loadable artifact for the key existed),
        ``"judged"`` (no artifact can serve it: compiled on the Dynamo path and
        timed, its payoff figures kept), ``"skipped"`` (the region cannot be
        built ahead of time) or ``"failed"`` (the build raised, or its artifact
        gave another answer than eager on the captured call: removed, and its key
        refused for this PyTorch)
    seconds : float
        Wall time of the build, or of the judged region's first (compiling)
        call (0 otherwise)
    reason : str | None
        Why it was skipped or failed
    verified : bool
        The artifact gave eager's answer here and its seal is recorded: a
        forecast's first call runs no eager call beside it
    payoff : str | None
        What the artifact saves a call against what getting it ready costs, and
        from how many steps ``compile=True`` runs it
        (:func:`time_speed`); None where it was not timed
    """

    label: str
    path: Path | None
    status: str
    seconds: float = 0.0
    reason: str | None = None
    verified: bool = False
    payoff: str | None = None


class Captured(NamedTuple):
    """A core's first call in one forward of its model
    (:func:`~earth2studio_compile.aot.capture_calls`).

    Attributes
    ----------
    args : tuple[Any, ...]
        Detached copies of its positional arguments
    kwargs : dict[str, Any]
        Detached copies of its keyword arguments
    inference : bool
        Whether it ran in inference mode (Earth2Studio's models run their
        forward under ``torch.inference_mode``)
    autocast : str | None
        The 16-bit autocast it ran under (:func:`~earth2studio_compile.precision.
        ambient_autocast`), None where none was on
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    inference: bool
    autocast: str | None = None


def time_speed(
    built: Built,
    target: RegionTarget,
    calls: dict[int, Captured],
    sealed: AotRunner | None = None,
    root: Path | None = None,
) -> None:
    """Time the verified artifact as a workflow's region would, its speed probe
    (:class:`~earth2studio_compile.probe.SpeedProbe`: its CUDA graphs recorded,
    then steady calls alternating with eager ones), and keep the figures beside
    it (:mod:`~earth2studio_compile.artifacts.speed`): the next process's region
    then times no eager calls of its own. Eager calls run in the region's
    precision, as its probe's do. ``sealed``, the runner the seal ran (without
    CUDA graphs), is timed where the region runs none (on the CPU, always);
    otherwise the artifact is loaded again with them. With ``root``, what
    loading it, its first run and its recording call cost beyond eager's calls
    is kept too, at one call a workflow step until a workflow says
    (:func:`~earth2studio_compile.artifacts.payoff.payoff_path`): a
    forecast's first call runs the region eagerly where that cannot pay within
    its steps. Never raises: the probe then runs in the next process, as before.

    Parameters
    ----------
    built : Built
        The region's result; only a verified artifact is timed
    target : RegionTarget
        The region and its settings
    calls : dict[int, Captured]
        The captured calls, by ``id`` of their core
    sealed : AotRunner | None, optional
        The runner the seal ran, by default None
    root : Path | None, optional
        The cache root, by default None (no payoff figures kept)
    """
    if not built.verified or built.path is None:
        return
    args, kwargs, inference, _ = calls[id(target.module)]
    try:
        runner: AotRunner | str | None = sealed
        if sealed is None or sealed.cudagraphs != wants_cudagraphs(target):
            runner = load_runner(target, args, kwargs, clone=False)
        if not isinstance(runner, AotRunner):
            return
        report = RegionReport(model=built.label, region="", mode=target.policy.label)
        probe = SpeedProbe(report, cudagraphs=runner.cudagraphs)
        path, device = built.path, runner.device
        probe.judged = lambda: speed.remember(path, device, target.precision, report)
        sig = signature(args, kwargs)
        module, chosen = target.module, target.precision

        def autocast(*a: Any, **k: Any) -> Any:
            # Inside the precision's scope, as the seal's eager call: an fp32 or
            # tf32 scope turns off the wrapper's autocast, and FCN3's layer-scale
            # regions then met bf16 inputs with fp32 weights (untimed, H200).
            with _precision.autocast_of(target.autocast, device):
                return module(*a, **k)

        def eager() -> Any:
            return _precision.call(chosen, device, autocast, args, kwargs)

        # As a region's first call laps them: the load, then its untimed calls.
        loaded = runner.phases
        report.phases.update({k: loaded[k] for k in LOADED if k in loaded})
        untimed = iter(("first_run", "cudagraph_record" if runner.cudagraphs else ""))
        with torch.inference_mode(inference):
            for call in range(1, 20):
                kind = probe.kind(call, sig)
                if kind == "eager":
                    probe.time(kind, call, device, eager)
                elif kind == "compiled":
                    probe.time(kind, call, device, lambda: runner(*args, **kwargs))
                else:
                    _, seconds = timed(device, lambda: runner(*args, **kwargs))
                    if phase := next(untimed, ""):
                        report.phases[phase] = seconds
                if probe.done:
                    break
        synchronize(device)
        built.payoff = _keep_payoff(report, target, root, sig)
    except Exception as err:  # the next process probes on its own
        logger.debug(f"{built.label}: speed not timed at the build ({err!r})")


def _keep_payoff(
    report: RegionReport, target: RegionTarget, root: Path | None, sig: Any
) -> str | None:
    """Keep what the artifact saves a call and costs to get ready, at the calls
    per step a workflow kept earlier for the same region and inputs, else one;
    what they say, for :attr:`Built.payoff`."""
    path = payoff.payoff_path(target, root, sig, artifact=True)
    if path is None:
        return None
    earlier = payoff.recall(path)
    figures = payoff.artifact_figures(
        report, earlier.calls_per_step if earlier is not None else 1.0
    )
    if figures is None:
        return None
    payoff.keep(path, figures, report.label)
    return (
        f"{figures.saved_ms:.2f} ms saved a call, {figures.cost_s:.2f} s to get "
        "it ready beyond eager's calls, "
        f"{figures.calls_per_step:g} calls a step; {figures.verdict()}"
    )


def seal(
    built: Built,
    target: RegionTarget,
    calls: dict[int, Captured],
    runner: AotRunner | None = None,
) -> AotRunner | None:
    """Verify ``built``'s artifact (``runner`` where it is loaded already) against
    eager on the captured call and seal it
    (:func:`~earth2studio_compile.artifacts.verified.seal_built`): the forecast's
    first call then skips its own eager call. Sets ``built.verified``.

    Parameters
    ----------
    built : Built
        The region's result
    target : RegionTarget
        The region and its settings
    calls : dict[int, Captured]
        The captured calls, by ``id`` of their core
    runner : AotRunner | None, optional
        The artifact where it is loaded already, by default None

    Returns
    -------
    AotRunner | None
        The runner it ran, loaded without CUDA graphs; None where none was loaded
        or the artifact was refused
    """
    args, kwargs, _, _ = calls[id(target.module)]
    why, loaded, wrong = verified.seal_built(
        target, args, kwargs, root=None, runner=runner
    )
    built.verified = why is None
    if wrong:
        assert why is not None
        refuse_wrong(built, why)
        return None
    if why is not None:
        logger.info(f"{built.label}: not verified against eager here ({why})")
    return loaded


def refuse_wrong(built: Built, why: str) -> None:
    """The artifact ``built`` names gave another answer than eager on the captured
    call (the compiler's code for this key is wrong, as torch 2.11's AOTInductor's
    for the zoo's FCN on the CPU, 2026-11-29): removed, and its key refused, so
    that no later process loads it (each would verify it, warn and compile again)
    or builds it again in the background; a PyTorch of another version has
    another key. The build reports ``"failed"`` with the reason.

    Parameters
    ----------
    built : Built
        The region's result, its ``path`` the artifact
    why : str
        How its answer differed
    """
    assert built.path is not None
    path, built.path = built.path, None
    reason = refuse_artifact(path, why)
    built.status, built.reason = "failed", reason
    logger.warning(
        f"{built.label}: not built ahead of time: {reason}. Removed; its forecasts "
        f"compile on the Dynamo path with {background.ENV}=off."
    )
