"""What every executor is given (earth2studio_compile.executors.base): the target
of one first call, whose artifact key its candidates share."""

from __future__ import annotations

import threading

import torch
from tiny_cores import TinyCore, TinyModel

from earth2studio_compile import CompileSession
from earth2studio_compile.artifacts import background
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.executors import Target
from earth2studio_compile.report import RegionReport


def _counted(monkeypatch) -> list[str]:
    """Count every computation of an artifact key (one entry each)."""
    computed: list[str] = []
    real = RegionTarget.aot_key

    def counting(self, args, kwargs):
        computed.append(self.label)
        return real(self, args, kwargs)

    monkeypatch.setattr(RegionTarget, "aot_key", counting)
    return computed


def _target(module: torch.nn.Module) -> Target:
    return Target.resolve(
        module,
        owner="m.Model",
        region="core",
        device=torch.device("cpu"),
        precision=None,
        report=RegionReport(model="m.Model", region="core"),
        artifacts=None,
    )


def test_a_target_computes_the_key_of_a_call_once(monkeypatch):
    computed = _counted(monkeypatch)
    target = _target(TinyCore())
    x = torch.randn(4, 8)
    key, fields = target.aot_key((x,), {})
    assert target.aot_key((torch.zeros(4, 8),), {}) == (key, fields)
    assert len(computed) == 1  # values do not count, shapes do
    other, _ = target.aot_key((torch.randn(2, 8),), {})
    assert other != key and len(computed) == 2
    assert target.aot_key((x,), {"scale": 2})[0] not in (key, other)
    assert target.aot_key((x.double(),), {})[0] not in (key, other)
    assert len(computed) == 4
    # A new target (a later call) computes afresh: a changed module is seen.
    module = target.module
    module.c = torch.nn.Linear(8, 8)
    assert _target(module).aot_key((x,), {})[0] != key


def test_a_cold_first_call_computes_the_artifact_key_once(monkeypatch, tmp_path):
    """No artifact yet: the loader looks for it, then the background build starts
    for it (and declines: the core cannot be handed to a build process, so no
    build is left behind); both under the one key."""
    monkeypatch.setenv(background.ENV, "on")
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    computed = _counted(monkeypatch)
    model = TinyModel()
    model.core.guard = threading.Lock()  # no build process can be given it
    with CompileSession(model, regions=["core"], probe=False) as session:
        with torch.no_grad():
            model.core(torch.randn(4, 8))
    [r] = session.report.regions
    aot, bg = r.declined
    assert aot.startswith("aot: no artifact for its key"), r
    assert bg.startswith("background: its core cannot be handed"), r
    assert computed == ["TinyModel.core"]
