"""A region's ahead-of-time artifact as an executor, verified at its first call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile.artifacts import verified
from earth2studio_compile.artifacts.aot_load import load_runner
from earth2studio_compile.artifacts.aot_runner import AotRunner, SignatureMismatch
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.executors.base import Declined, Measured, Target
from earth2studio_compile.metrics import Laps


def run_artifact(
    target: RegionTarget,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    cudagraphs: bool,
    root: Path | None,
    laps: Laps | None = None,
) -> tuple[AotRunner | None, Any, str | None]:
    """Load the region's artifact, run one call on it and verify it against eager.

    What the ahead-of-time executor does at its first call and the background
    executor at its switch; each says itself what a refusal means for it. An
    artifact that gave eager's answer in an earlier process with the same weights
    is not verified again (:mod:`~earth2studio_compile.artifacts.verified`; the
    runner's ``verified_earlier`` says so); one that gives it now is recorded.

    Parameters
    ----------
    target : RegionTarget
        The region (its live module is bound to the artifact)
    args, kwargs : tuple, dict
        The call's arguments, as the region staged them
    cudagraphs : bool
        Capture a CUDA graph around the artifact (outputs are not cloned: the
        region clones what escapes a CUDA graph)
    root : Path | None
        Cache root
    laps : Laps | None, optional
        Where to lap ``key`` (with the load's phases), ``first_run`` (with
        ``warm_convolutions`` where the runner replayed them) and
        ``verify`` (or ``verified_earlier``), by default None

    Returns
    -------
    tuple[AotRunner | None, Any, str | None]
        ``(runner, output, None)`` for an artifact that gives eager's answer;
        ``(None, None, why)`` when none could be loaded; ``(runner, output, why)``
        when it gives another answer (then neither may be used)
    """
    runner = load_runner(
        target, args, kwargs, cudagraphs=cudagraphs, clone=False, root=root
    )
    if isinstance(runner, str):
        return None, None, runner
    if laps is not None:
        # What load_runner spent before its own phases is finding it: "key".
        loaded = ("checksum", "aot_load", "bind")
        laps.lap("key", **{k: runner.phases[k] for k in loaded})
    out = runner(*args, **kwargs)
    if laps is not None:
        warmed = {k: v for k, v in runner.phases.items() if k == "warm_convolutions"}
        laps.lap("first_run", **warmed)
    reason = verified.against_eager(
        runner, target.module, args, kwargs, out, target.precision
    )
    if laps is not None:
        laps.lap("verified_earlier" if runner.verified_earlier else "verify")
    return runner, out, reason


class AotExecutor:
    """A region's ahead-of-time artifact, verified at its first call.

    :meth:`build` offers it whenever artifacts can exist (the cache is on, no
    opaque submodules, the loader is there); :meth:`first_call` then looks for the
    artifact of the call's key, runs it, and compares its output with one eager
    call on the same input (:func:`verify`). No artifact, a damaged one or a wrong
    answer raises :class:`~earth2studio_compile.executors.Declined` before anything
    is handed back, and the region goes on to the next candidate (Dynamo); a wrong
    answer also logs one WARNING, or a DEBUG line where the call's inputs are made
    up (``made_up``).

    Parameters
    ----------
    target : Target
        The region and its settings
    made_up : bool, optional
        Its first call runs on made-up inputs (the region's first call ahead): a
        wrong answer there may be the inputs' (noise a model answers with NaNs or
        overflow), and the region's own first call verifies again, by default False
    """

    name = "aot"
    source: str | None = None
    not_compiled: str | None = None
    compiling = False

    def __init__(self, target: Target, made_up: bool = False) -> None:
        self.target = target
        self.made_up = made_up
        self.cudagraphs = target.policy.cudagraphs and target.device.type == "cuda"
        self.runner: AotRunner | None = None
        # The runner reports nothing the region records.
        self.measured = Measured()
        # The runner binds the live weights and checks them at every call; the
        # shelf's fingerprint checks them again before a later session runs it.
        self.keepable = False

    @classmethod
    def build(cls, target: Target, made_up: bool = False) -> AotExecutor | str:
        """The executor for ``target``, or why no artifact can serve it.

        Parameters
        ----------
        target : Target
            The region and its settings
        made_up : bool, optional
            Its first call runs on made-up inputs (see the class), by default False

        Returns
        -------
        AotExecutor | str
            The executor, or the reason
        """
        if target.artifacts is None:
            return "the compile cache is off"
        if target.no_artifact is not None:
            return target.no_artifact
        return _torch.missing("aoti_loader") or cls(target, made_up)

    def first_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], laps: Laps
    ) -> Any:
        """Load, run and verify the artifact; a lap for each phase.

        See :meth:`~earth2studio_compile.executors.base.Executor.first_call`.
        """
        t = self.target
        runner, out, reason = run_artifact(
            t, args, kwargs, self.cudagraphs, t.root, laps
        )
        if runner is None:
            raise Declined(reason)
        if reason is not None:
            if self.made_up:
                logger.debug(
                    f"{t.report.label}: its ahead-of-time artifact {runner.path} "
                    f"differs from eager on made-up inputs ({reason}); the first call "
                    "verifies it on its own inputs"
                )
            else:
                logger.warning(
                    f"The ahead-of-time artifact {runner.path} of {t.report.label} "
                    f"gives another answer than eager ({reason}): not used; "
                    f"{t.report.label} compiles with torch.compile instead. Rebuild "
                    "it with earth2studio_compile.build(..., force=True)."
                )
            raise Declined(f"its artifact failed verification ({reason})")
        self.runner = runner
        self.source = f"the ahead-of-time artifact {runner.path}"
        self.keepable = True
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A later call; inputs the artifact was not built for decline it
        (:class:`~earth2studio_compile.executors.Declined`), before anything runs."""
        assert self.runner is not None
        try:
            return self.runner(*args, **kwargs)
        except SignatureMismatch as err:
            raise Declined(f"its artifact was built for other inputs ({err})") from err

    def detach(self) -> None:
        """Keep no strong reference to the module (the runner's is weak)."""
        self.target = None  # type: ignore[assignment]

    def free_graphs(self) -> None:
        """Drop the runner's CUDA graph (:meth:`AotRunner.free_graph`)."""
        if self.runner is not None:
            self.runner.free_graph()

    def release(self) -> None:
        """Nothing is claimed for other processes."""
