"""The zoo's StormCast (tools/zoo/stormcast.py) through ``compile=True`` on the CPU.

Both UNets compile: the regression net once a step, the EDM denoiser at every sampler
evaluation. The sampler's initial noise is drawn eagerly from the global generator,
which the workflow seeds, so eager and compiled runs sample the same latents.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_unchanged, held_rollout, messages, run_workflow, snapshot

from earth2studio_compile import run
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.tools import zoo

pytest.importorskip("physicsnemo.diffusion", reason="needs physicsnemo's diffusion")

# The denoiser runs 8 times a step on the small configuration; Inductor's fused
# kernels differ from eager by ~1e-6 a call (8e-6 rel L2 after two steps).
REL_L2 = 1e-4


def test_compiled_stormcast_matches_eager_both_unets_compiled(logs):
    model = zoo.build("stormcast")
    before = snapshot(model)
    eager = run_workflow(run.deterministic, "deterministic", model, nsteps=2)
    compiled = run_workflow(
        run.deterministic, "deterministic", model, nsteps=2, compile=True
    )
    assert compiled.keys() == eager.keys() and eager
    for name, ref in eager.items():
        assert torch.isfinite(compiled[name]).all(), name
        assert rel_l2(compiled[name], ref) <= REL_L2, name
    assert_unchanged(model, before)

    report = run.last_report()
    assert not report.fell_back, report.summary()
    regions = {r.region: r for r in report.regions}
    assert sorted(regions) == ["diffusion_model", "regression_model"]
    for region in regions.values():
        assert region.status == "compiled", report.summary()
        assert (region.graphs, region.graph_breaks, region.recompiles) == (1, 0, 0)
    assert regions["regression_model"].calls == 2
    assert regions["diffusion_model"].calls > 2  # once per sampler evaluation
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")


def test_held_stormcast_outputs_are_not_overwritten():
    model = zoo.build("stormcast")
    before = snapshot(model)
    eager, _ = held_rollout(model, nsteps=2, compile=False)
    eager = [y.clone() for y in eager]
    compiled, session = held_rollout(model, nsteps=2, compile=True)
    assert [r.status for r in session.report.regions] == ["compiled", "compiled"]
    for step, (a, b) in enumerate(zip(compiled, eager, strict=True)):
        assert rel_l2(a, b) <= REL_L2, f"step {step}: rel L2 {rel_l2(a, b):.2e}"
    assert_unchanged(model, before)
