"""Building a region ahead of time (earth2studio_compile.artifacts.aot_build) on CPU."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from aot_helpers import eager, load, tiny_target
from tiny_cores import (
    HeldTensorCore,
    MaskedCore,
    SdpaCore,
    WindowMaskedCore,
    window_mask,
    window_masks,
)

from earth2studio_compile.artifacts import aot_build, refused
from earth2studio_compile.artifacts.aot_build import build_region
from earth2studio_compile.artifacts.aot_load import load_runner, verify
from earth2studio_compile.artifacts.aot_runner import AotRunner
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.spec import ModelSpec


def test_build_writes_an_artifact_that_matches_eager(built):
    assert built.result.status == "built", built.result
    assert built.result.path.parent == built.root / "aot"
    meta = json.loads((built.result.path / "meta.json").read_text())
    # Its patch embedding is a convolution: recorded.
    assert set(meta["sha256"]) == {"model.pt2", "convolutions.json"}
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
    between processes with the same weights): an artifact must not keep it. The
    refusal is kept for the key: a later process does not build it again. The
    reason is kept bare (regression: what follows from it, "It stays on the Dynamo
    path.", was kept too and read inside a later process's parentheses)."""
    core, x = HeldTensorCore(), torch.randn(4, 8)
    assert (
        refused.recall(tmp_path / "aot", tiny_target(core).aot_key((x,), {})[0]) is None
    )
    with pytest.raises(refused.Refused, match="neither parameters nor buffers") as err:
        build_region(tiny_target(core), (x,), {}, root=tmp_path)
    key = tiny_target(core).aot_key((x,), {})[0]
    kept = refused.recall(tmp_path / "aot", key)
    assert kept == err.value.reason and "neither parameters nor buffers" in kept
    assert str(err.value) == f"{kept} It stays on the Dynamo path."


def test_a_built_conv_net_keeps_its_distinct_convolutions(conv_built):
    """The convolutions one run of the artifact makes (channels-last strides, the
    flags it passes), each once, as a checksummed member beside the package."""
    _torch = aot_build._torch
    path, core = conv_built.path, conv_built.core
    meta = json.loads((path / "meta.json").read_text())
    assert set(meta["sha256"]) == {"model.pt2", "convolutions.json"}
    assert "convolutions.json" not in json.dumps(meta["fields"])  # not in the key
    record = _torch.read_convolutions((path / "convolutions.json").read_bytes())
    # ``b`` is made twice on inputs of one shape: three distinct, each once.
    assert len(record) == 3
    assert len({json.dumps(e, sort_keys=True) for e in record}) == 3
    weights = sorted(e["tensors"][1][0] for e in record)
    assert weights == sorted(list(m.weight.shape) for m in (core.a, core.b, core.c))
    for e in record:
        size, stride, dtype = e["tensors"][0]
        m = next(m for m in (core.a, core.b, core.c) if m.in_channels == size[1])
        assert e["arguments"][:4] == [
            list(m.stride),
            list(m.padding),
            list(m.dilation),
            m is core.c,
        ]
        assert e["arguments"][5] == m.groups and dtype == "float32"
    # Exactly what a run of the loaded artifact makes, strides included.
    runner = load_runner(tiny_target(core), conv_built.args, {}, root=conv_built.root)
    assert isinstance(runner, AotRunner), runner
    with torch.no_grad():
        seen = _torch.record_convolutions(lambda: runner(*conv_built.args))
    assert seen == record


def test_a_record_that_fails_leaves_a_whole_artifact_without_one(tmp_path, monkeypatch):
    from tiny_cores import ConvCore

    def fails(run):
        raise RuntimeError("no dispatch modes here")

    monkeypatch.setattr(aot_build._torch, "record_convolutions", fails)
    core, x = ConvCore().eval(), torch.randn(2, 3, 8, 8)
    path = build_region(tiny_target(core), (x,), {}, root=tmp_path)
    meta = json.loads((path / "meta.json").read_text())
    assert set(meta["sha256"]) == {"model.pt2"}
    assert not (path / "convolutions.json").exists()
    runner = load_runner(tiny_target(core), (x,), {}, root=tmp_path)
    assert isinstance(runner, AotRunner), runner
    assert rel_l2(runner(x), eager(core, (x,))) <= 1e-5


def test_the_callers_autocast_is_entered_for_the_device_of_keyword_inputs(monkeypatch):
    """Regression (2026-11-30, H200): anemoi's processor takes its tensors by
    keyword; the exported wrapper read the device from positional ones only, so
    on CUDA it entered the callers' bfloat16 autocast for the CPU, traced the
    processor without it, and the build refused the artifact (float32 out where
    eager gives bfloat16)."""
    entered = []

    def recorded(autocast, device):
        entered.append((autocast, device.type))
        return contextlib.nullcontext()

    monkeypatch.setattr(aot_build._precision, "autocast_of", recorded)
    scoped = aot_build._Scoped(torch.nn.Identity(), None, "bfloat16")
    scoped(input=torch.empty(2, device="meta"))
    assert entered == [("bfloat16", "meta")]


def test_an_artifact_is_exported_and_compiled_on_the_tables_backend(
    tmp_path, monkeypatch
):
    """The exported graph keeps SDPA whole, AOTInductor's compile picks its
    backend: both under the table's."""
    seen = []

    def flags():
        return (
            torch.backends.cuda.flash_sdp_enabled(),
            torch.backends.cuda.math_sdp_enabled(),
        )

    export = torch.export.export

    def exporting(*args, **kwargs):
        seen.append(("export", flags()))
        return export(*args, **kwargs)

    class Stop(Exception):
        pass

    def compiling(*args, **kwargs):
        seen.append(("compile", flags()))
        raise Stop

    monkeypatch.setattr(aot_build.torch.export, "export", exporting)
    monkeypatch.setattr(aot_build._torch, "aoti_compile", compiling)
    core = SdpaCore()
    table = ModelSpec(regions=("core",), attention_backends=("math",))
    target = RegionTarget.resolve(
        core,
        owner="tiny_cores.SdpaCore",
        region="core",
        device=torch.device("cpu"),
        precision=None,
        table=table,
    )
    with pytest.raises(Stop):
        build_region(target, (torch.randn(2, 4, 8, 16),), {}, root=tmp_path)
    assert seen == [("export", (False, True)), ("compile", (False, True))]
    assert flags() == (True, True)
