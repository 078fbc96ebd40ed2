"""The zoo's Aurora (tools/zoo/aurora.py) through ``compile=True`` on the CPU.

Needs the ``microsoft-aurora`` package: skipped where it is not installed.
Earth2Studio's wrapper replaces its static-field buffers (``z``, ``slt``, ``lsm``) by
the core's output at every step, a round trip through Aurora's normalisation (0.002
on ``z`` after three steps, eager alike): each run starts from the same state, and
"restored" means "as an eager run leaves it".
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    assert_unchanged,
    held_rollout,
    messages,
    run_workflow,
    snapshot,
)

from earth2studio_compile import run
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.tools import zoo

pytest.importorskip(
    "aurora", reason="needs microsoft-aurora (pip install microsoft-aurora)"
)

REL_L2 = 1e-5


def _restart(model: torch.nn.Module, start: dict) -> None:
    """Back to the state ``start`` was taken in (the wrapper's buffers are inference
    tensors after a step: only inference mode may copy into them)."""
    with torch.inference_mode():
        model.load_state_dict(start["state"])
    model.preds_idx = 0


def test_compiled_aurora_matches_eager_each_swin_stage_one_graph(logs):
    model = zoo.build("aurora")
    start = snapshot(model)
    eager = run_workflow(run.deterministic, "deterministic", model, nsteps=3)
    after_eager = snapshot(model)
    _restart(model, start)
    compiled = run_workflow(
        run.deterministic, "deterministic", model, nsteps=3, compile=True
    )
    assert compiled.keys() == eager.keys() and eager
    for name, ref in eager.items():
        assert torch.isfinite(compiled[name]).all(), name
        assert rel_l2(compiled[name], ref) <= REL_L2, name
    assert_unchanged(model, after_eager)

    report = run.last_report()
    assert not report.fell_back, report.summary()
    stages = [
        f"model.backbone.{side}_layers.{i}"
        for side in ("encoder", "decoder")
        for i in (0, 1)
    ]
    assert [r.region for r in report.regions] == stages, report.summary()
    for region in report.regions:
        assert region.status == "compiled" and region.calls == 3, report.summary()
        assert (region.graphs, region.graph_breaks, region.recompiles) == (1, 0, 0)
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")


def test_held_aurora_outputs_are_not_overwritten():
    model = zoo.build("aurora")
    start = snapshot(model)
    eager, _ = held_rollout(model, nsteps=3, compile=False)
    eager = [y.clone() for y in eager]
    after_eager = snapshot(model)
    _restart(model, start)
    compiled, session = held_rollout(model, nsteps=3, compile=True)
    assert {r.status for r in session.report.regions} == {"compiled"}
    for step, (a, b) in enumerate(zip(compiled, eager, strict=True)):
        assert rel_l2(a, b) <= REL_L2, f"step {step}: rel L2 {rel_l2(a, b):.2e}"
    assert_unchanged(model, after_eager)
