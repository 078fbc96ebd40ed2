"""The zoo's DLESyM and DLESyMLatLon (tools/zoo/dlesym.py) in a compile session: the
small size on the CPU, the published one (GPU-marked) on CUDA.

Needs ``earth2grid``, which Earth2Studio's DLESyM module imports and which is not on
the package index: skipped elsewhere, so the README's test command skips it. CI
builds it from the source in ``third_party/`` (``.ci/build-earth2grid.sh``) and runs
this module with it first on PYTHONPATH (``.ci/run``).

The tests drive the model's iterator, as Earth2Studio's DLESyM example does, not
``run.deterministic``: the workflow sizes its store as the model's output lead
times times the step number, which for DLESyM's 16 lead times a step repeats and
misplaces them. Only the valid outputs are compared
(``retrieve_valid_atmos_outputs`` / ``retrieve_valid_ocean_outputs``): the
wrapper's output starts from ``torch.empty`` and the ocean fills 2 of its 16 lead
times, so the rest is whatever memory held.

The compiled rollout runs first, on a model that never ran, as a user's would:
the atmosphere decoder's ConvGRU blocks keep their state in a plain attribute
(``h``), a ``(1, 1, 1, 1)`` placeholder until the first call replaces it with a
state of the input's shape, so the decoder compiles twice (on the CPU a guard on
``h``'s size; on CUDA its first call, on CUDA graphs, finds the state reassigned
and the decoder compiles again without them), and only at its first two calls.

On the CPU physicsnemo's HEALPix padding skips the NVTX range it marks each forward
with where CUDA is available, the calls that broke every region's graph on CUDA
(the table's ``quiet_nvtx`` makes them no-ops inside a region's calls). The CPU
test gives the padding a view of ``torch`` in which CUDA is available, so its
regions trace PyTorch's own ``range_push``/``range_pop`` as on a GPU.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
from conftest import assert_unchanged, messages, snapshot

from earth2studio_compile import CompileSession
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.runs import initial_state

pytest.importorskip(
    "earth2grid",
    reason="needs earth2grid, built from third_party/ (see .ci/run for the install)",
)

REGIONS = [
    "atmos_model.decoder",
    "atmos_model.encoder",
    "ocean_model.decoder",
    "ocean_model.encoder",
]
# Encoder and decoder calls per 96-hour step: the atmosphere's 8 passes and 4 GRU
# warm-ups (one each 24 hours), the ocean's one pass.
CALLS = {"atmos_model": 12, "ocean_model": 1}
# Measured on the CPU: 1e-7 after two steps (24 atmosphere calls, the ocean's
# coupling from their means).
REL_L2 = 1e-5
# Not yet measured on a GPU: fp32 with TF32 off, as the GPU suite (test_gpu.py)
# compares, through the same 24 recurrent calls at nside 64. A recurrent state
# that a CUDA-graph replay overwrote, or one lost between calls, differs by O(1).
GPU_REL_L2 = 1e-3


def _rollout(
    model: torch.nn.Module,
    nsteps: int,
    device: str,
    session: CompileSession | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``nsteps`` steps of the model's iterator from a seeded state, every output
    held until the end (a compiled step must not change an earlier one); each
    step's valid atmosphere and ocean outputs."""
    x, coords = initial_state(model, torch.device(device))
    held = []
    with session if session is not None else contextlib.nullcontext():
        for step, (y, c) in enumerate(model.create_iterator(x, coords)):
            if step:
                held.append((y, c))
            if step == nsteps:
                break
    return [
        (
            model.retrieve_valid_atmos_outputs(y, c)[0],
            model.retrieve_valid_ocean_outputs(y, c)[0],
        )
        for y, c in held
    ]


def _compiled_matches_eager(
    model: torch.nn.Module, tolerance: float, device: str = "cpu"
) -> tuple[CompileSession, float]:
    """Two steps in a session, then two eager ones: the same valid outputs within
    ``tolerance``, the model left as it was, every region compiled, no fallback
    but the speed probe's (a region slower compiled runs eagerly after it).

    Returns the session and the largest relative L2."""
    model = model.to(device)
    before = snapshot(model)
    session = CompileSession(model)
    compiled = _rollout(model, 2, device, session)
    assert_unchanged(model, before)
    # The network resets its recurrent state at every call: the eager rollout
    # starts as a fresh model's would.
    eager = _rollout(model, 2, device)
    worst = 0.0
    for step, pairs in enumerate(zip(compiled, eager, strict=True), start=1):
        for name, got, ref in zip(("atmosphere", "ocean"), *pairs, strict=True):
            assert torch.isfinite(ref).all(), f"step {step}, {name}: eager"
            error = rel_l2(got, ref)
            assert error <= tolerance, f"step {step}, {name}: rel L2 {error:.2e}"
            worst = max(worst, error)
    report = session.report
    for region in report.regions:
        # Compiled, or eager from the speed probe's verdict on: compiled slower
        # than eager (DLESyM's atmosphere regions on an H200); nothing else fell back.
        assert region.status == ("eager" if region.slower else "compiled"), (
            report.summary()
        )
        calls = CALLS[region.region.split(".")[0]] * 2
        if region.region in REGIONS:
            assert region.calls == calls, (region.region, region.calls)
        else:
            # A subtree of a split region runs once per call of its region, or
            # more often where one module sits at several places (physicsnemo
            # hands a block's one activation module to each of its layers).
            assert region.calls and region.calls % calls == 0, region
    return session, worst


def _recompiles(model: torch.nn.Module, path: str) -> int:
    """A region's expected recompiles: one where it holds a ConvGRUBlock (its
    placeholder state, then the real one), else none."""
    modules = model.get_submodule(path).modules()
    return int(any(type(m).__name__ == "ConvGRUBlock" for m in modules))


@pytest.fixture
def padding_sees_cuda(monkeypatch):
    """physicsnemo's HEALPix padding module sees ``torch.cuda.is_available()`` as
    True (a view of ``torch`` in its namespace; the rest of the process, Dynamo
    and Inductor included, sees the CPU machine): its forward calls
    ``torch.cuda.nvtx.range_push``/``range_pop`` as on a GPU, which a CUDA build
    of PyTorch runs without one. Its layers are chosen when the model is built,
    by another module: the CPU's plain-torch padding either way."""
    from physicsnemo.nn.module.hpx import padding

    try:
        torch.cuda.nvtx.range_push("probe")
        torch.cuda.nvtx.range_pop()
    except RuntimeError:  # a CPU-only build: "NVTX functions not installed"
        pytest.skip("this torch build has no NVTX")
    cuda = types.ModuleType("torch.cuda")
    vars(cuda).update(vars(torch.cuda))
    cuda.is_available = lambda: True
    view = types.ModuleType("torch")
    vars(view).update(vars(torch))
    view.cuda = cuda
    monkeypatch.setattr(padding, "torch", view)
    pushed: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(torch.cuda.nvtx, "range_push", pushed.append)
        padding.HEALPixPadding(padding=1)(torch.zeros(12, 1, 4, 4))
    assert pushed == ["HEALPixPadding:forward"], "the padding marks no NVTX range"


# DLESyM first: DLESyMLatLon's networks are the same (tools/zoo/dlesym.py), so its
# regions' graphs come from the Inductor cache the first one filled.
@pytest.mark.parametrize("name", ["dlesym", "dlesym-latlon"])
def test_compiled_dlesym_matches_eager_four_regions_one_graph_each(
    name, logs, padding_sees_cuda
):
    """With the padding's NVTX calls, as on CUDA: the regions whole, one graph
    each, no break (regression: without the entry's ``quiet_nvtx`` every pad
    broke the graph and each region fell back at a recompile storm, here as on
    an H100). DLESyMLatLon alike, its lat/lon regridding eager around them (the
    valid outputs compared are its 721 x 1440 fields)."""
    model = zoo.build(name)
    session, _ = _compiled_matches_eager(model, REL_L2)
    regions = {r.region: r for r in session.report.regions}
    assert sorted(regions) == REGIONS, session.report.summary()
    for path, region in regions.items():
        counts = (region.graphs, region.graph_breaks, region.recompiles)
        assert counts == (1, 0, _recompiles(model, path)), (path, counts)
    assert regions["atmos_model.decoder"].recompiles == 1
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")


def test_the_zoo_random_source_serves_the_healpix_grid():
    """DLESyM's grid is its last three input coordinates (face, height, width):
    the source draws fields of that shape for the workflow's fetch."""
    from earth2studio.data import fetch_data
    from earth2studio.utils.time import to_time_array

    model = zoo.build("dlesym")
    ic = model.input_coords()
    x, coords = fetch_data(
        zoo.random_source(model),
        to_time_array(["2024-01-01T00"]),
        ic["variable"],
        ic["lead_time"],
    )
    assert list(coords)[-3:] == ["face", "height", "width"]
    assert x.shape[-3:] == (12, 32, 32) and x.shape[1:3] == (9, 9)
    assert torch.isfinite(x).all() and x.std() > 0.5


def _cuda_padding() -> bool:
    from earth2grid.healpix._padding import cuda

    return cuda.healpixpad_cuda is not None


@pytest.mark.gpu
@pytest.mark.published
@pytest.mark.parametrize("name", ["dlesym", "dlesym-latlon"])
def test_published_dlesym_on_the_gpu_matches_eager(
    name, logs, strict_fp32, record_property
):
    """nside 64, the authors' widths, built on a CUDA machine (so the atmosphere
    pads with earth2grid's CUDA kernel, and every pad marks an NVTX range, which
    the table's ``quiet_nvtx`` makes a no-op inside the regions' calls: without
    it each pad broke the graph and the regions fell back after Dynamo's
    recompile limit), two 96-hour steps with every output held: the four regions
    whole, compiled, one graph each, no break, no skipped CUDA graph, no WARNING
    but the speed probe's for a region slower compiled than eager, which then runs
    eagerly (the atmosphere's on an H200: their eager calls take a few ms).

    The ConvGRU state is assigned to the module at every decoder call, not
    returned: CUDA graphs, which reuse their output memory, would overwrite it at
    the next replay (they did: an "overwritten by a subsequent run" error at the
    decoder's second call, which the eager fallback raised too). A region holding
    a ConvGRUBlock notices at its first call and compiles again without CUDA
    graphs (its one recompile); the others keep them. Needs an earth2grid built
    on a CUDA machine (``.ci/build-earth2grid.sh`` there). DLESyMLatLon: the
    same networks and checks, behind its eager lat/lon regridding (not yet run on
    a GPU)."""
    if not _cuda_padding():
        pytest.skip("earth2grid was built without its CUDA padding (on a CPU)")
    model = zoo.build(name, size="full")
    session, worst = _compiled_matches_eager(model, GPU_REL_L2, device="cuda")
    report = session.report
    record_property("rel_l2", worst)
    record_property("summary", report.summary())
    regions = {r.region: r for r in report.regions}
    assert sorted(regions) == REGIONS, report.summary()
    # The atmosphere decoder holds the ConvGRU blocks: it alone runs without
    # CUDA graphs.
    holders = [path for path in regions if _recompiles(model, path)]
    assert holders == ["atmos_model.decoder"], report.summary()
    for path, region in regions.items():
        counts = (region.graphs, region.graph_breaks, region.recompiles)
        assert counts == (1, 0, _recompiles(model, path)), (path, counts)
        stateful = _recompiles(model, path) == 1
        assert (region.no_cudagraphs is not None) == stateful, (path, region)
        mode = "inductor/default" if stateful else "inductor/reduce-overhead"
        assert region.mode == mode, (path, region.mode)
        assert region.cudagraph_skips == 0, report.summary()
    # The one WARNING a region may give: the probe's, for a region that then ran
    # eagerly because it was slower compiled.
    warnings = messages(logs, "WARNING")
    slower = [r for r in regions.values() if r.slower]
    assert len(warnings) == len(slower), warnings
    assert all("runs slower compiled" in m for m in warnings), warnings
    # No module keeps memory of a CUDA graph (the eager rollout after the session
    # read the states; reading one now would raise if a replay had taken it).
    for m in model.modules():
        for v in vars(m).values():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                assert torch.isfinite(v).all()
