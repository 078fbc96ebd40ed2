"""Shared by the zoo's model tests (tools/zoo/test_aurora.py, test_stormcast.py):
a deterministic workflow and a held-output rollout, each run eagerly and with
``compile=True`` from the same seed and checked against each other, on the CPU or
(the published sizes, GPU-marked) on CUDA, where the regions' CUDA graphs are
checked too."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

import pytest
import torch
from conftest import assert_unchanged, held_rollout, run_workflow, snapshot
from torch.utils._pytree import tree_leaves

from earth2studio_compile import run
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.report import CompileReport, RegionReport

#: Brings the model back to the state a snapshot was taken in, before the compiled
#: run (Aurora's wrapper overwrites its static fields at every step).
Restart = Callable[[torch.nn.Module, dict], None]


def _eager_then_compiled(
    model: torch.nn.Module, nsteps: int, device: str, restart: Restart | None
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], CompileReport]:
    """``deterministic`` eagerly, then with ``compile=True``, on the same seed: the
    same variables, finite compiled outputs, the model left as the eager run left
    it, no fallback. Returns both runs' arrays and the compiled call's report."""
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
    for name, values in compiled.items():
        assert torch.isfinite(values).all(), name
    assert_unchanged(model, after_eager)
    report = run.last_report()
    assert report is not None and not report.fell_back, report
    return eager, compiled, report


def _worst(errors: dict[str, float]) -> str:
    return max(errors, key=errors.__getitem__)


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
    eager, compiled, report = _eager_then_compiled(model, nsteps, device, restart)
    errors = {name: rel_l2(compiled[name], ref) for name, ref in eager.items()}
    worst = _worst(errors)
    assert errors[worst] <= tolerance, f"{worst}: rel L2 {errors[worst]:.2e}"
    return report, errors[worst]


def compiled_workflow_within_eager_rounding(
    model: torch.nn.Module,
    nsteps: int,
    full_precision: Callable[[], AbstractContextManager],
    margin: float,
    device: str = "cpu",
    restart: Restart | None = None,
) -> tuple[CompileReport, float, float]:
    """For a wrapper that lowers its own precision (FCN3's bf16 autocast beside
    torch-harmonics' CUDA kernels): compiled and eager runs round differently, so
    both are judged against the same wrapper run eagerly in fp32 (inside
    ``full_precision()``), after step 1: the compiled run's relative L2 there may
    be at most ``margin`` times eager's own, variable by variable.

    Returns
    -------
    tuple[CompileReport, float, float]
        The compiled call's report; the compiled and the eager run's relative L2 to
        fp32 for the variable where the compiled run stands worst against eager
    """
    start = snapshot(model) if restart is not None else None
    with full_precision():
        exact = run_workflow(
            run.deterministic, "deterministic", model, nsteps=nsteps, device=device
        )
    if restart is not None:
        restart(model, start)
    eager, compiled, report = _eager_then_compiled(model, nsteps, device, restart)
    ratios, pairs = {}, {}
    for name, values in exact.items():
        # (time, lead_time, ...): lead time 0 is the initial state, equal in all.
        reference = values[:, 1:]
        pair = (
            rel_l2(compiled[name][:, 1:], reference),
            rel_l2(eager[name][:, 1:], reference),
        )
        assert pair[1] > 0.0, f"{name}: eager equals fp32: full_precision did nothing"
        pairs[name], ratios[name] = pair, pair[0] / pair[1]
    worst = _worst(ratios)
    assert ratios[worst] <= margin, (
        f"{worst}: rel L2 to fp32 {pairs[worst][0]:.2e} compiled, "
        f"{pairs[worst][1]:.2e} eager"
    )
    return report, *pairs[worst]


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


def shared_pool(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every region runs an eager stand-in for CUDA graph trees, whose regions share
    one memory pool: each call of any region overwrites (NaN) every tensor any
    region's earlier calls returned, as a replay after a step mark may. A region
    that hands on an output uncloned (a skip connection held across regions, a
    tuple's second element) gives NaN. Returns the pool."""
    from earth2studio_compile import executors

    pool: list[torch.Tensor] = []

    def overwriting(run: Callable) -> Callable:
        def call(*args, **kwargs):
            for t in pool:
                t.fill_(float("nan"))
            out = run(*args, **kwargs)
            pool.extend(t for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            return out

        return call

    class Graphs(executors.EagerExecutor):
        name, cudagraphs = "graphs", True

        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__(module)
            self.first_call = overwriting(self.first_call)  # type: ignore[method-assign]

        def __call__(self, *args, **kwargs):
            return overwriting(super().__call__)(*args, **kwargs)

    monkeypatch.setattr(executors, "CANDIDATES", [lambda target: Graphs(target.module)])
    return pool
