"""Building a region ahead of time (earth2studio_compile.artifacts.aot_build) on CPU."""

from __future__ import annotations

import json

import pytest
import torch
from aot_helpers import eager, load, tiny_target
from tiny_cores import (
    HeldTensorCore,
    MaskedCore,
    WindowMaskedCore,
    window_mask,
    window_masks,
)

from earth2studio_compile.artifacts.aot_build import build_region
from earth2studio_compile.artifacts.aot_load import (
    AotRunner,
    load_runner,
    verify,
)
from earth2studio_compile.metrics import rel_l2


def test_build_writes_an_artifact_that_matches_eager(built):
    assert built.result.status == "built", built.result
    assert built.result.path.parent == built.root / "aot"
    meta = json.loads((built.result.path / "meta.json").read_text())
    assert set(meta["sha256"]) == {"model.pt2"}
    runner = load(built)
    assert isinstance(runner, AotRunner), runner
    out = runner(*built.args)
    ref = eager(built.core, built.args)
    assert rel_l2(out, ref) <= 1e-5
    assert verify(out, ref, "fp32") is None
    # Each phase measured, none a remainder.
    for phase in ("key", "checksum", "aot_load", "bind", "first_run"):
        assert runner.phases[phase] >= 0.0, phase


# The mask maker as if in a package whose name starts like PyTorch's (the SFNO's
# torch_harmonics caches its tensors so): model code all the same.
@pytest.mark.parametrize("home", [None, "torch_harmonics.masks"])
def test_a_tensor_the_core_makes_while_it_runs_is_kept_in_the_artifact(
    tmp_path, monkeypatch, home
):
    """Aurora's shifted-window masks: made by its code once per shape (cached),
    lifted by export as constants without a name in the module. The artifact
    keeps them (they are not the model's data), and the build leaves the cache
    with real tensors: eager calls in the same process still compute (before,
    after a ``build()`` they computed with the fake tensors export had cached)."""
    if home is not None:
        monkeypatch.setattr(window_mask, "__module__", home)
    window_mask.cache_clear()
    core, x = MaskedCore(), torch.randn(4, 8)
    path = build_region(tiny_target(core), (x,), {}, root=tmp_path)
    meta = json.loads((path / "meta.json").read_text())
    assert set(meta["sha256"]) == {"model.pt2", "constants.pt"}
    out = core(x)
    assert type(out) is torch.Tensor and type(window_mask(8, x.device)) is torch.Tensor
    mask = torch.zeros(8)
    mask[::3] = -100.0
    assert torch.allclose(out, torch.softmax(core.lin(x) + mask, -1))
    runner = load_runner(tiny_target(core), (x,), {}, root=tmp_path)
    assert isinstance(runner, AotRunner), runner
    assert rel_l2(runner(x), out) <= 1e-5


def test_a_mask_made_before_the_build_is_kept_under_the_packages_name(tmp_path):
    """``build()`` calls the model before it exports a region, so a mask the
    model caches is already real: export lifts it, and AOTInductor names it anew
    in the package (``_tensor_constant0``). The artifact keeps it under that name:
    before, every load of such an artifact failed ("the model has no tensor
    '_tensor_constant0'"; Aurora's, built by ``tools.build``)."""
    window_masks.cache_clear()
    core, x = WindowMaskedCore(), torch.randn(4, 8)
    out = core(x)
    build_region(tiny_target(core), (x,), {}, root=tmp_path)
    runner = load_runner(tiny_target(core), (x,), {}, root=tmp_path)
    assert isinstance(runner, AotRunner), runner
    assert rel_l2(runner(x), out) <= 1e-5


def test_a_tensor_the_model_holds_beside_its_weights_is_refused(tmp_path):
    """A tensor held as a plain attribute is the model's own data (it may differ
    between processes with the same weights): an artifact must not keep it."""
    core = HeldTensorCore()
    with pytest.raises(RuntimeError, match="neither parameters nor buffers"):
        build_region(tiny_target(core), (torch.randn(4, 8),), {}, root=tmp_path)
