"""Reduced precision: opt-in, scoped to the regions' calls, measured on every run.

bf16 autocast exists on CPU, so scoping, restoring and the accuracy probe are tested
here; the speed and the GPU thresholds are the benchmark's and the GPU tests' job.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TIME, FailingBackend, eager_backend, messages

from earth2studio_compile import CompileSession, register_model
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.models import MODEL_TABLE
from earth2studio_compile.precision import ENV, THRESHOLDS
from earth2studio_compile.tools import zoo


def global_state() -> tuple:
    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
    )


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_precision_is_scoped_and_outputs_keep_their_dtype(precision):
    model = zoo.build("toy")
    x = torch.randn(1, 4, 16, 32)
    with torch.no_grad():
        expected = model.model(x)
    seen = []
    forward = model.model.net.forward

    def spy(*args):
        seen.append((torch.is_autocast_enabled("cpu"), torch.backends.cudnn.allow_tf32))
        return forward(*args)

    model.model.net.forward = spy
    before = global_state()
    with CompileSession(model, backend=eager_backend, precision=precision) as session:
        assert global_state() == before
        with torch.no_grad():
            out = model.model(x)
        assert global_state() == before
    del model.model.net.forward
    assert out.dtype == torch.float32
    assert seen and seen[0] == (precision == "bf16", precision == "tf32")
    region = session.report.regions[0]
    assert region.status == "compiled" and region.precision == precision
    if precision == "fp32":
        assert region.precision_error is None
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    else:
        # The probe's figure is the error a user would measure by hand.
        assert region.precision_error == pytest.approx(rel_l2(out, expected), rel=1e-3)
        assert region.precision_error < THRESHOLDS[precision]
        assert precision in session.report.summary()
    if precision == "bf16":
        assert region.precision_error > 1e-6  # bf16 really ran (fp32: ~1e-8)


def test_state_is_restored_after_an_exception_and_a_fallback():
    model = zoo.build("toy")
    before = global_state()
    with CompileSession(model, backend=eager_backend, precision="bf16"):
        with pytest.raises(RuntimeError):
            model.model(torch.randn(1, 3, 16, 32))  # wrong channels: the caller's error
        assert global_state() == before
    with CompileSession(model, backend=FailingBackend(), precision="bf16") as session:
        with torch.no_grad():
            out = model.model(torch.randn(1, 4, 16, 32))
        assert global_state() == before
    region = session.report.regions[0]
    assert region.status == "eager" and region.precision == "bf16"
    assert out.dtype == torch.float32 and region.precision_error is not None
    assert "kept bf16" in session.report.summary()


def test_bad_precision_names_the_choices(monkeypatch):
    model = zoo.build("toy")
    with pytest.raises(
        ValueError, match=r"precision must be one of \['fp32', 'tf32', 'bf16'\]"
    ):
        CompileSession(model, precision="fp16")
    from earth2studio_compile import run

    monkeypatch.setenv(ENV, "half")
    with pytest.raises(ValueError, match=ENV):
        run.deterministic(TIME, 1, model, zoo.random_source(model), None, compile=True)


def test_the_probe_does_not_update_a_stateful_core_twice():
    from test_reliability import StatefulCore

    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.core = StatefulCore(2)

    model = Holder()
    x, state = torch.randn(1, 2, 4, 4), torch.zeros(1, 2, 4, 4)
    with CompileSession(model, backend=eager_backend, precision="tf32") as session:
        with torch.inference_mode():
            model.core(x, state)
    assert session.report.regions[0].precision_error is not None
    torch.testing.assert_close(state, x)  # 0 * 0.5 + x once, not twice


def test_spectral_convolutions_stay_fp32_under_bf16():
    model = zoo.build("sfno")
    x = torch.randn(1, 4, 16, 32)
    with torch.no_grad():
        expected = model.model(x)
    with CompileSession(model, backend=eager_backend, precision="bf16") as session:
        with torch.no_grad():
            out = model.model(x)
    region = session.report.regions[0]
    assert region.status == "compiled", session.report.summary()
    assert out.dtype == torch.float32
    assert rel_l2(out, expected) < THRESHOLDS["bf16"]
    assert "forward" not in model.model.sfno.blocks[0].global_conv.__dict__


def test_a_precision_the_table_refuses_is_not_used(logs):
    class Touchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 4)

    register_model(Touchy, regions=("net",), precisions_refused={"bf16": "needs fp32"})
    try:
        model = Touchy()
        with CompileSession(model, backend=eager_backend, precision="bf16") as session:
            with torch.no_grad():
                model.net(torch.randn(2, 4))
    finally:
        del MODEL_TABLE[f"{Touchy.__module__}.{Touchy.__qualname__}"]
    assert session.report.regions[0].precision is None
    assert any("needs fp32" in w for w in messages(logs, "WARNING"))


def test_workflow_precision_from_the_environment(monkeypatch):
    from earth2studio.io import KVBackend

    from earth2studio_compile import run

    model = zoo.build("toy")
    monkeypatch.setenv(ENV, "bf16")
    io = KVBackend()
    run.deterministic(
        TIME, 2, model, zoo.random_source(model), io, verbose=False, compile=True
    )
    region = run.last_report().regions[0]
    assert region.precision == "bf16" and region.precision_error is not None
    assert all(
        v.dtype == torch.float32 for v in io.root.values() if v.is_floating_point()
    )


def test_a_refused_precision_is_reported_once_per_model(logs):
    class TwoCores(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

    register_model(TwoCores, regions=("a", "b"), precisions_refused={"tf32": "no"})
    try:
        with CompileSession(TwoCores(), backend=eager_backend, precision="tf32") as s:
            pass
    finally:
        del MODEL_TABLE[f"{TwoCores.__module__}.{TwoCores.__qualname__}"]
    assert [r.precision for r in s.report.regions] == [None, None]
    assert sum("does not run in tf32" in w for w in messages(logs, "WARNING")) == 1
