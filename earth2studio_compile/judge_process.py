"""A judge's own process: compile one region on the Dynamo path, time it, keep the
figures, then exit.

:mod:`earth2studio_compile.artifacts.judge` saves a job (a copy of the core, its
first call's inputs, its model's table entry and compile options, the forecast's
TF32 flags, the figures file the forecast's next process will read and the
region's calls per workflow step) into a directory and starts :func:`main` on it
in a new process. The core is compiled in a :class:`~earth2studio_compile.
CompileSession` as the forecast's region would be (the same entry, its opaque
submodules and precision, background builds off: the Dynamo path), called
``JUDGE_CALLS`` times so that its speed probe judges it, then compiled again from
Inductor's warm cache in a second session: that first call is what each later
process pays. The figures (:class:`~earth2studio_compile.artifacts.payoff.Payoff`)
go to the forecast's file; ``result.json`` says how it went.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import filelock
import torch

from earth2studio_compile import resident
from earth2studio_compile.artifacts import background, payoff
from earth2studio_compile.artifacts.build_process import lower_priority, run_job
from earth2studio_compile.artifacts.judge import judge_lock
from earth2studio_compile.artifacts.store import file_lock
from earth2studio_compile.models import MODEL_TABLE
from earth2studio_compile.precision import autocast_of
from earth2studio_compile.session import CompileSession

__all__ = ["Holder", "judge", "main"]


class Holder(torch.nn.Module):
    """The judged core as the one region of a model (the table's entry of the
    forecast's model, its region renamed ``core``)."""

    def __init__(self, core: torch.nn.Module) -> None:
        super().__init__()
        self.core = core


def main(argv: list[str] | None = None) -> int:
    """The child: judge the job in ``argv[0]`` (a job directory) at a lower
    priority; 0 when it kept figures."""
    lower_priority()
    directory = Path((argv if argv is not None else sys.argv[1:])[0])
    return 0 if run_job(directory, judge, "judging") else 1


def judge(payload: dict[str, Any]) -> dict[str, Any]:
    """Compile, time and keep the figures of the job ``payload``
    (:func:`~earth2studio_compile.artifacts.judge.prepare`'s), under the
    forecast's TF32 flags (:func:`~earth2studio_compile.artifacts.build_process.
    run_job` set them). Changes process-wide state (the model table): call it in
    a process of its own.

    Parameters
    ----------
    payload : dict[str, Any]
        The job

    Returns
    -------
    dict[str, Any]
        ``ok``, and the figures kept or the ``reason`` none were
    """
    if payload["calls_per_step"] is None:
        return {"ok": False, "reason": "the forecast's session told no calls per step"}
    figures_at: Path = payload["figures"]
    lock = file_lock(judge_lock(figures_at))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return {"ok": False, "reason": "another process judges it"}
    try:
        target = payload["target"]
        holder = Holder(target.module)
        # The model's own patches have no model here; its submodules' apply as
        # in the forecast's session (the copy is bare, .snapshot).
        patches = tuple(p for p in payload["spec"].patches if p.submodules)
        spec = dataclasses.replace(
            payload["spec"], regions=("core",), wrapped=(), covers=(), patches=patches
        )
        MODEL_TABLE[f"{Holder.__module__}.{Holder.__qualname__}"] = spec
        first = _session(holder, payload, payload["calls"])
        figures = payoff.figures_of(first, payload["calls"])
        if figures is None:
            why = first.reason or f"its speed was not judged ({first.status})"
            # So that the next process does not judge it again, to the same end.
            payoff.keep_failure(figures_at, why, target.label)
            return {"ok": False, "reason": why}
        # Again from Inductor's warm cache: the first call each later process pays.
        resident.release()
        torch.compiler.reset()
        again = _session(holder, payload, 2)
        cost = again.first_call_seconds
        if again.executor == "dynamo" and again.cache == "warm" and cost is not None:
            figures = dataclasses.replace(figures, cost_s=cost)
        figures = dataclasses.replace(figures, calls_per_step=payload["calls_per_step"])
        payoff.keep(figures_at, figures, target.label)
        return {"ok": True, **dataclasses.asdict(figures)}
    finally:
        lock.release()


def _session(holder: Holder, payload: dict[str, Any], calls: int) -> Any:
    """``calls`` calls of the core in a session as the forecast's; its report."""
    options, target = payload["options"], payload["target"]
    session = CompileSession(
        holder,
        mode=options.mode,
        fullgraph=options.fullgraph,
        dynamic=options.dynamic,
        backend=options.backend,
        options=options.options,
        precision=target.precision,
    )
    args, kwargs = payload["args"], payload["kwargs"]
    # The forecast's region took the Dynamo path: so does this one, under the
    # autocast its model's wrapper called it in (AIFS's), which keys its figures.
    with (
        background.in_process(),
        session,
        torch.inference_mode(payload["inference"]),
        autocast_of(target.autocast, target.device),
    ):
        for _ in range(calls):
            holder.core(*args, **kwargs)
    [report] = session.report.regions
    return report
