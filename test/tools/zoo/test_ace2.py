"""The zoo's ACE2 (tools/zoo/ace2.py) through ``compile=True`` on the CPU.

Needs Ai2's ``fme`` with torch-harmonics 0.8.0 (fme's SHTs call its Legendre API):
skipped elsewhere, so the README's test command skips it. CI installs both into a
folder of their own and runs this module with that folder first on PYTHONPATH
(``.ci/run``). The wrapper's stepper is not a module: what a session must leave
unchanged is the stepper's network (``model.stepper.modules``).
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_unchanged, held_rollout, messages, run_workflow, snapshot

from earth2studio_compile import run
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.tools import zoo

pytest.importorskip(
    "fme", reason="needs fme and torch-harmonics 0.8.0 (see .ci/run for the install)"
)
_harmonics = pytest.importorskip("torch_harmonics")
if not _harmonics.__version__.startswith("0.8."):
    pytest.skip(
        f"fme's SHTs need torch-harmonics 0.8.x, found {_harmonics.__version__} "
        "(see .ci/run for the install)",
        allow_module_level=True,
    )

REL_L2 = 1e-5
# On CUDA, fp32 with TF32 off as the GPU suite (test_gpu.py) compares.
GPU_REL_L2 = 1e-4


def _compiled_matches_eager(model, tolerance: float, device: str = "cpu"):
    """Two steps of ``deterministic`` eager, then with ``compile=True``: the same
    outputs within ``tolerance``, the network unchanged; the compiled call's
    region."""
    before = snapshot(model.stepper.modules)
    eager = run_workflow(
        run.deterministic, "deterministic", model, nsteps=2, device=device
    )
    compiled = run_workflow(
        run.deterministic,
        "deterministic",
        model,
        nsteps=2,
        device=device,
        compile=True,
    )
    assert compiled.keys() == eager.keys() and eager
    worst = 0.0
    for name, ref in eager.items():
        # The initial condition's output-only variables are NaN, eager alike.
        assert torch.equal(ref.isnan(), compiled[name].isnan()), name
        done = ~ref.isnan()
        error = rel_l2(compiled[name][done], ref[done])
        assert error <= tolerance, f"{name}: rel L2 {error:.2e}"
        worst = max(worst, error)
    assert_unchanged(model.stepper.modules, before)
    report = run.last_report()
    assert not report.fell_back, report.summary()
    (region,) = report.regions
    assert region.region == "stepper.modules.0" and region.status == "compiled"
    assert (region.graphs, region.graph_breaks, region.recompiles) == (1, 0, 0)
    # Opaque: the network's spectral convolutions, one a layer (2 small, 8 full).
    convs = sum(
        type(m).__name__ == "SpectralConvS2" for m in model.stepper.modules.modules()
    )
    assert region.calls == 2 and region.opaque == convs > 0, convs
    return report, worst


def test_compiled_ace2_matches_eager_one_graph_spectral_convs_opaque(logs):
    _compiled_matches_eager(zoo.build("ace2"), REL_L2)
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")


@pytest.mark.gpu
@pytest.mark.published
def test_published_ace2_on_the_gpu_matches_eager(logs, strict_fp32, record_property):
    """ACE2's published layout (180x360 Gaussian grid, 8 levels) on CUDA, 2 steps:
    one graph, no break, its eight spectral convolutions opaque inside it.

    Needs fme and torch-harmonics 0.8.0 there: ``.ci/fetch-ace2-wheels.sh``."""
    report, worst = _compiled_matches_eager(
        zoo.build("ace2", size="full"), GPU_REL_L2, device="cuda"
    )
    record_property("rel_l2", worst)
    record_property("summary", report.summary())
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")


def test_ace2_coordinates_go_where_fme_loads_them(monkeypatch):
    """fme's checkpoint load puts the dataset's coordinates on ``get_device()``
    (CUDA where there is one), where its corrector meets the network's outputs; the
    zoo's stepper must ask the same, or its first corrected step on a GPU fails
    ("Expected all tensors to be on the same device", H200, 2026-11-29). On the CPU
    fme names the CPU, so the test counts that the zoo asked."""
    import fme.core.coordinates

    asked = []
    device = fme.core.coordinates.get_device

    def spy():
        asked.append(device())
        return asked[-1]

    monkeypatch.setattr(fme.core.coordinates, "get_device", spy)
    zoo.build("ace2")
    assert len(asked) == 2, asked  # the vertical and the horizontal coordinates


def test_held_ace2_outputs_are_not_overwritten():
    model = zoo.build("ace2")
    before = snapshot(model.stepper.modules)
    eager, _ = held_rollout(model, nsteps=2, compile=False)
    eager = [y.clone() for y in eager]
    compiled, session = held_rollout(model, nsteps=2, compile=True)
    assert [r.status for r in session.report.regions] == ["compiled"]
    for step, (a, b) in enumerate(zip(compiled, eager, strict=True)):
        done = ~b.isnan()
        assert torch.equal(a.isnan(), b.isnan()), f"step {step}"
        assert rel_l2(a[done], b[done]) <= REL_L2, f"step {step}"
    assert_unchanged(model.stepper.modules, before)
