"""Shared by the zoo's model tests (tools/zoo/test_aurora.py, test_stormcast.py):
a deterministic workflow and a held-output rollout, each run eagerly and with
``compile=True`` from the same seed and checked against each other, on the CPU or
(the published sizes, GPU-marked) on CUDA, where the regions' CUDA graphs are
checked too."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from conftest import assert_unchanged, held_rollout, run_workflow, snapshot

from earth2studio_compile import run
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.report import CompileReport, RegionReport

#: Brings the model back to the state a snapshot was taken in, before the compiled
#: run (Aurora's wrapper overwrites its static fields at every step).
Restart = Callable[[torch.nn.Module, dict], None]


def compiled_workflow_matches_eager(
    model: torch.nn.Module,
    nsteps: int,
    tolerance: float,
    device: str = "cpu",
    restart: Restart | None = None,
) -> tuple[CompileReport, float]:
    """``deterministic`` eagerly, then with ``compile=True``, on the same seed.

    Asserts the same variables, finite compiled outputs within ``tolerance``
    (relative L2 per variable), the model left as the eager run left it, and no
    fallback.

    Returns
    -------
    tuple[CompileReport, float]
        The compiled call's report and the largest relative L2
    """
    start = snapshot(model) if restart is not None else None
    eager = run_workflow(
        run.deterministic, "deterministic", model, nsteps=nsteps, device=device
    )
    after_eager = snapshot(model)
    if restart is not None:
        restart(model, start)
    compiled = run_workflow(
        run.deterministic,
        "deterministic",
        model,
        nsteps=nsteps,
        device=device,
        compile=True,
    )
    assert compiled.keys() == eager.keys() and eager
    errors = {}
    for name, ref in eager.items():
        assert torch.isfinite(compiled[name]).all(), name
        errors[name] = rel_l2(compiled[name], ref)
    worst = max(errors, key=errors.__getitem__)
    assert errors[worst] <= tolerance, f"{worst}: rel L2 {errors[worst]:.2e}"
    assert_unchanged(model, after_eager)
    report = run.last_report()
    assert report is not None and not report.fell_back, report
    return report, errors[worst]


def held_outputs_match_eager(
    model: torch.nn.Module,
    nsteps: int,
    tolerance: float,
    restart: Restart | None = None,
) -> None:
    """A CPU rollout keeping every yielded tensor, eager then in a session: each
    compiled step within ``tolerance`` of eager's, every region compiled, the model
    left as the eager rollout left it."""
    start = snapshot(model) if restart is not None else None
    eager, _ = held_rollout(model, nsteps=nsteps, compile=False)
    eager = [y.clone() for y in eager]
    after_eager = snapshot(model)
    if restart is not None:
        restart(model, start)
    compiled, session = held_rollout(model, nsteps=nsteps, compile=True)
    statuses = [r.status for r in session.report.regions]
    assert statuses and set(statuses) == {"compiled"}, session.report.summary()
    for step, (a, b) in enumerate(zip(compiled, eager, strict=True)):
        assert rel_l2(a, b) <= tolerance, f"step {step}: rel L2 {rel_l2(a, b):.2e}"
    assert_unchanged(model, after_eager)


def assert_cuda_graphs(
    report: CompileReport, regions: Iterable[RegionReport], cudagraphs: bool
) -> None:
    """Each of ``regions`` ran in the mode its spec's ``cudagraphs`` asks for
    (CUDA graphs, ``reduce-overhead``, or Inductor's default) and skipped no CUDA
    graph."""
    mode = "inductor/reduce-overhead" if cudagraphs else "inductor/default"
    for region in regions:
        assert region.mode.startswith(mode), (region.region, region.mode)
        assert region.cudagraph_skips == 0, report.summary()
