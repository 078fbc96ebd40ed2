"""The zoo's StormCast (tools/zoo/stormcast.py) through ``compile=True``: the small
size on the CPU, the published one (GPU-marked) on CUDA.

Both UNets compile: the regression net once a step, the EDM denoiser at every sampler
evaluation. The sampler's initial noise is drawn eagerly from the global generator,
which the workflow seeds, so eager and compiled runs sample the same latents.
"""

from __future__ import annotations

import pytest
from conftest import messages
from zoo_helpers import (
    assert_cuda_graphs,
    compiled_workflow_matches_eager,
    held_outputs_match_eager,
)

from earth2studio_compile.planning import plan
from earth2studio_compile.tools import zoo

pytest.importorskip("physicsnemo.diffusion", reason="needs physicsnemo's diffusion")

# The denoiser runs 8 times a step on the small configuration; Inductor's fused
# kernels differ from eager by ~1e-6 a call (8e-6 rel L2 after two steps).
REL_L2 = 1e-4
# The published sampler (18 stochastic-Heun steps) calls the denoiser about 36 times
# a step, through UNets of 128-256 channels at 512x640: per-call differences of the
# GPU suite's size (up to ~2e-5, test_gpu.py) compound over ~72 calls in two steps.
# Not yet measured on a GPU; an overwritten CUDA-graph output or a lost step
# differs by O(1).
GPU_REL_L2 = 1e-3


def _check_regions(report, nsteps: int) -> dict:
    regions = {r.region: r for r in report.regions}
    assert sorted(regions) == ["diffusion_model", "regression_model"], report.summary()
    for region in regions.values():
        assert region.status == "compiled", report.summary()
        assert (region.graphs, region.graph_breaks, region.recompiles) == (1, 0, 0)
    assert regions["regression_model"].calls == nsteps
    assert regions["diffusion_model"].calls > nsteps  # once per sampler evaluation
    return regions


def test_compiled_stormcast_matches_eager_both_unets_compiled(logs, same_speed):
    report, _ = compiled_workflow_matches_eager(
        zoo.build("stormcast"), nsteps=2, tolerance=REL_L2
    )
    _check_regions(report, nsteps=2)
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")


def test_held_stormcast_outputs_are_not_overwritten(same_speed):
    held_outputs_match_eager(zoo.build("stormcast"), nsteps=2, tolerance=REL_L2)


def _real_pyproj() -> bool:
    import pyproj

    # The GPU machine's import stand-in (its .shim) cannot compute the HRRR grid.
    return "+stub" not in getattr(pyproj, "__version__", "")


@pytest.mark.gpu
@pytest.mark.published
@pytest.mark.skipif(
    not _real_pyproj(),
    reason="needs pyproj, not a stand-in (carry .ci/fetch-model-wheels.sh's wheels)",
)
def test_published_stormcast_on_the_gpu_matches_eager(
    logs, strict_fp32, record_property, same_speed
):
    """99 HRRR variables on the 512x640 window, 18 sampler steps, 2 forecast steps:
    both UNets one CUDA graph each, no break, no skipped graph.

    Every call timed alike (``same_speed``): the GPU suite's four processes share
    one GPU, and there the probe, which judges the denoiser's 72 calls, once found
    it slower compiled (H200, 2026-12-02) where it runs 1.8x faster alone; its
    speed is the benchmark's to measure."""
    model = zoo.build("stormcast", size="full")
    cudagraphs = plan(model).spec.cudagraphs
    report, worst = compiled_workflow_matches_eager(
        model, nsteps=2, tolerance=GPU_REL_L2, device="cuda"
    )
    record_property("rel_l2", worst)
    record_property("summary", report.summary())
    assert_cuda_graphs(report, _check_regions(report, nsteps=2).values(), cudagraphs)
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")
