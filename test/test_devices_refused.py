"""A device the model table refuses (``ModelSpec.devices_refused``): where compiled
regions were measured to give other answers than eager, a forecast on that device
runs them eagerly, says why once, and loses nothing; ``build()`` builds nothing
there. The CPU stands in for the refused device (Aurora's entry refused CUDA from
2026-11-29 to 2026-11-30)."""

from __future__ import annotations

from dataclasses import replace

import torch
from conftest import messages, run_workflow

import earth2studio_compile
from earth2studio_compile import CompileSession, run
from earth2studio_compile.models import MODEL_TABLE, lookup, table_markdown
from earth2studio_compile.spec import ModelSpec
from earth2studio_compile.tools import zoo

WHY = "its compiled regions gave other answers than eager there"


def _refuse_cpu(monkeypatch, model: torch.nn.Module, regions: tuple[str, ...]):
    key = f"{type(model).__module__}.{type(model).__qualname__}"
    spec = ModelSpec(regions=regions, devices_refused={"cpu": WHY})
    monkeypatch.setitem(MODEL_TABLE, key, spec)
    assert lookup(model) == (key, spec)


def test_a_refused_device_runs_the_workflow_eagerly_warning_once(monkeypatch, logs):
    """Before: no such entry field (the table could not say it), so the regions
    compiled. Now every region runs eagerly from its first call, its reason in the
    report, one WARNING for the model, and the outputs are eager's, bit for bit."""
    model = zoo.build("toy")
    eager = run_workflow(run.deterministic, "deterministic", model, nsteps=3)
    _refuse_cpu(monkeypatch, model, ("model.net.0", "model.net.4"))
    got = run_workflow(
        run.deterministic, "deterministic", model, nsteps=3, compile=True
    )
    report = run.last_report()
    assert [r.status for r in report.regions] == ["eager", "eager"], report.summary()
    for r in report.regions:
        assert r.reason == f"not compiled on cpu: {WHY}" and r.graphs == 0
        assert r.calls == 3 and r.eager_calls == 3
    warnings = messages(logs, "WARNING")
    assert sum(WHY in w for w in warnings) == 1, warnings
    assert eager.keys() == got.keys()
    for name, values in eager.items():
        assert torch.equal(got[name], values), name


def test_a_session_on_another_device_still_compiles(monkeypatch):
    """The refusal is the device's alone: the same entry refusing CUDA leaves a
    CPU session compiling."""
    model = zoo.build("toy")
    key = f"{type(model).__module__}.{type(model).__qualname__}"
    spec = ModelSpec(regions=("model",), devices_refused={"cuda": WHY})
    monkeypatch.setitem(MODEL_TABLE, key, spec)
    x, coords = earth2studio_compile.example_input(model)
    with CompileSession(model) as session, torch.no_grad():
        model(x, coords)
    assert [r.status for r in session.report.regions] == ["compiled"]


def test_build_builds_nothing_on_a_refused_device(monkeypatch, tmp_path, logs):
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    model = zoo.build("toy")
    _refuse_cpu(monkeypatch, model, ("model",))
    built = earth2studio_compile.build(model, device="cpu")
    assert [(b.status, b.path) for b in built] == [("skipped", None)], built
    assert built[0].reason == f"not compiled on cpu: {WHY}"
    assert sum(WHY in w for w in messages(logs, "WARNING")) == 1
    assert not any(tmp_path.rglob("*.pt2"))


def _aurora_rows() -> list[str]:
    rows = table_markdown().splitlines()
    names = ("Aurora", "Aurora1p5", "Aurora1p5_6h")
    return [row for row in rows if row.split(" | ")[0][2:] in names]


def test_the_table_names_a_refusal(monkeypatch):
    """The row of a refused device says so (Aurora's did, 2026-11-29 to -30)."""
    key, spec = lookup(zoo.build("aurora"))
    monkeypatch.setitem(MODEL_TABLE, key, replace(spec, devices_refused={"cuda": WHY}))
    refused = [r for r in _aurora_rows() if f"not compiled on cuda: {WHY}" in r]
    assert [r.split(" | ")[0] for r in refused] == ["| Aurora"]


def test_aurora_is_compiled_on_cuda_with_its_swin_patch():
    """The published Aurora matched eager on an H200 with the Swin patch
    (2026-11-30): no device refused, the patch named."""
    aurora = _aurora_rows()
    assert len(aurora) == 3
    assert not any("not compiled on" in r for r in aurora)
    assert all(
        "`forward` patched while a session runs (cyclic shifts" in r for r in aurora
    )
