"""A region's settings and their keys (earth2studio_compile.artifacts.key): the
target resolves its policy, and its three keys (the bundle's, the artifact's, the
kept executor's) change with what compiled code depends on and with nothing else.

Each key's own fields are tested with their users: test_cache.py (a bundle key's
fields), test_aot_key.py (what an artifact's key hashes), test_resident.py (the
kept executors).
"""

from __future__ import annotations

import dataclasses

import torch
from tiny_cores import TinyCore

from earth2studio_compile import precision
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.cache import artifact_key
from earth2studio_compile.models import ModelSpec
from earth2studio_compile.options import CompileOptions, CompilePolicy

CPU = torch.device("cpu")
ARGS = (torch.randn(4, 8),)


def _target(module: torch.nn.Module | None = None, **settings) -> RegionTarget:
    fields = {"owner": "tiny_cores.TinyModel", "region": "core", "precision": None}
    fields["device"] = CPU
    return RegionTarget.resolve(
        module if module is not None else TinyCore(), **{**fields, **settings}
    )


def _keys(target: RegionTarget) -> tuple[str, str, str]:
    """The bundle's key, the artifact's and the kept executor's, for ``ARGS``."""
    bundle = artifact_key(target.bundle_fields(ARGS, {}))
    return bundle, target.aot_key(ARGS, {})[0], target.resident_key()


def test_resolve_resolves_the_policy_for_the_device():
    table = ModelSpec(regions=("core",), inductor_options={"epilogue_fusion": False})
    options = CompileOptions(fullgraph=True)
    target = _target(options=options, table=table, fp32_modules=["LayerNorm"])
    assert target.policy == CompilePolicy.resolve(options, CPU, table)
    assert target.policy.options == {"epilogue_fusion": False}
    assert target.fp32_modules == ("LayerNorm",) and not target.opaque
    # No options: the defaults', for the device.
    assert _target().policy == CompilePolicy.resolve(CompileOptions(), CPU)


def test_the_label_names_the_model_class_and_the_region():
    assert _target().label == "TinyModel.core"
    assert _target(region="").label == "TinyModel"
    assert _target(owner="", region="").label == "region"


def test_the_keys_agree_for_the_same_settings_whatever_the_weights_values():
    """Compiled code does not depend on the weights' values: another instance of
    the core (fresh random weights) finds the same bundle, artifact and executor."""
    a, b = TinyCore(), TinyCore()
    assert not torch.equal(a.a.weight, b.a.weight)
    assert _keys(_target(a)) == _keys(_target(b))
    with torch.no_grad():
        a.b.bias.add_(1.0)
    assert _keys(_target(a)) == _keys(_target(b))


def test_the_weights_shapes_change_the_on_disk_keys():
    """The kept executor's key is the settings only: resident.py checks the module
    itself (its fingerprint) before running a kept executor."""
    wider = TinyCore()
    wider.a, wider.b = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)
    doubled = TinyCore().double()
    base = _keys(_target())
    for module in (wider, doubled):
        bundle, aot, resident = _keys(_target(module))
        assert bundle != base[0] and aot != base[1]
        assert resident == base[2]


def test_each_setting_changes_every_key_it_is_part_of():
    """The kept executor's key takes every setting; the artifact's all but
    ``opaque`` (an opaque region never has one: the ahead-of-time executors
    decline it); the bundle's every one (a bundle of other ``fp32_modules`` or
    ``opaque`` settings holds code for another graph)."""
    base = _target()
    everything = {"bundle", "aot", "resident"}
    changed = {
        "owner": (_target(owner="tiny_cores.Other"), everything),
        "region": (_target(region="other"), everything),
        "precision": (_target(precision="bf16"), everything),
        "mode": (
            _target(options=CompileOptions(mode="max-autotune-no-cudagraphs")),
            everything,
        ),
        "options": (
            _target(options=CompileOptions(options={"max_fusion_size": 8})),
            everything,
        ),
        "fp32_modules": (_target(fp32_modules=("Linear",)), everything),
        "opaque": (dataclasses.replace(base, opaque=True), {"bundle", "resident"}),
        "autocast": (_target(autocast="bfloat16"), everything),
    }
    names = ("bundle", "aot", "resident")
    for setting, (target, expected) in changed.items():
        differ = {n for n, a, b in zip(names, _keys(target), _keys(base)) if a != b}
        assert differ == expected, setting
    # The same settings again: the same keys.
    assert _keys(_target(precision="bf16")) == _keys(changed["precision"][0])


def test_two_backends_of_one_name_are_two_kept_executors():
    def backend(gm, example_inputs):
        return gm

    def other(gm, example_inputs):
        return gm

    other.__name__ = other.__qualname__ = backend.__qualname__
    first = _target(options=CompileOptions(backend=backend))
    second = _target(options=CompileOptions(backend=other))
    again = _target(options=CompileOptions(backend=backend))
    assert first.resident_key() == again.resident_key()
    assert first.resident_key() != second.resident_key()


def _on_an_h100(monkeypatch) -> tuple[torch.device, dict[str, tuple[bool, bool]]]:
    """An H100 as the keys see it, and PyTorch's TF32 flags (matmul, cuDNN) as
    the returned dict's ``"tf32"`` says: on at first."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "H100")
    flags = {"tf32": (True, True)}
    monkeypatch.setattr(precision, "tf32_enabled", lambda: flags["tf32"])
    return torch.device("cuda"), flags


def test_one_artifact_serves_a_precision_however_it_was_asked_for(monkeypatch):
    # tools.build --precision tf32 and a workflow under PyTorch's TF32 flags compute
    # alike: the artifact one builds must be the one the other finds (an Aurora
    # build went unused by compile=True calls on an H100 when the two keys differed).
    cuda, flags = _on_an_h100(monkeypatch)

    def key(asked: str | None) -> str:
        return _target(device=cuda, precision=asked).aot_key(ARGS, {})[0]

    assert key(None) == key("tf32") != key("fp32")
    flags["tf32"] = (False, False)
    assert key(None) == key("fp32") != key("tf32")
    assert key("bf16") not in {key(None), key("tf32")}
    # On the CPU, TF32 does not apply: PyTorch's flags and "tf32" mean fp32
    # (regression: a CPU build(precision="tf32") was another artifact, 2026-11-30).
    flags["tf32"] = (True, True)
    on_cpu = {_keys(_target(precision=p))[1] for p in (None, "fp32", "tf32")}
    assert len(on_cpu) == 1
    assert _keys(_target(precision="bf16"))[1] not in on_cpu


def test_one_bundle_serves_a_precision_however_it_was_asked_for(monkeypatch):
    # As the artifact's key: a Dynamo-path region's bundle from
    # build(precision="tf32") is the one a forecast under PyTorch's TF32 flags
    # with precision None loads (regression: keyed by "None" against "tf32").
    cuda, flags = _on_an_h100(monkeypatch)

    def key(asked: str | None) -> str:
        return _keys(_target(device=cuda, precision=asked))[0]

    assert key(None) == key("tf32") != key("fp32")
    flags["tf32"] = (False, False)
    assert key(None) == key("fp32") != key("tf32")
    assert key("bf16") not in {key(None), key("tf32")}


def test_an_input_laid_out_otherwise_is_another_artifact():
    """AOTInductor's code reads its inputs with the strides it was built for: an
    expanded input (its build's clone is contiguous) and a transposed one are
    other programs than a contiguous input of the same shape."""
    target = _target(TinyCore())
    x = torch.randn(4, 8)
    key = target.aot_key((x,), {})[0]
    assert target.aot_key((x.clone(),), {})[0] == key
    assert target.aot_key((x[:1].expand(4, 8),), {})[0] == key  # cloned: contiguous
    assert target.aot_key((x.t().contiguous().t(),), {})[0] != key


def test_a_region_called_without_autocast_keeps_the_keys_it_had():
    """The autocast a model's wrapper calls its region in (AIFS's) is part of the
    keys only where one is on: every other region's artifacts, bundles, hints and
    figures stay where they were."""
    fields = _target().aot_key(ARGS, {})[1]
    assert "autocast" not in fields and "autocast" not in _target().factors()
    assert "autocast=" not in fields["options"]
