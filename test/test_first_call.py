"""What compiling costs: the first call's phases, break-even, the optional probe."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import FailingBackend, eager_backend, messages

from earth2studio_compile import CompileSession
from earth2studio_compile.cache import local_cache_source
from earth2studio_compile.report import RegionReport
from earth2studio_compile.tools import zoo


def test_first_call_phases_add_up_to_the_measured_first_step(logs):
    model = zoo.build("toy")
    x = torch.randn(1, 4, 16, 32)
    with CompileSession(model) as session:
        with torch.no_grad():
            start = time.perf_counter()
            model.model(x)
            measured = time.perf_counter() - start
            for _ in range(2):
                model.model(x)
    r = session.report.regions[0]
    assert r.status == "compiled"
    for phase in ("dynamo", "backend", "first_run"):
        assert r.phases[phase] > 0, phase
    assert r.first_call_seconds == pytest.approx(measured, rel=0.1)
    # Dynamo's phase is measured: what no phase measured is small in a normal run.
    assert r.phases["unattributed"] < 0.1 * r.first_call_seconds
    # The tests point Inductor at a directory of their own: the report says so,
    # rather than "warm cache" as if it were this package's (turned off here).
    assert "(TORCHINDUCTOR_CACHE_DIR," in session.report.summary()


def test_time_no_phase_measured_is_unattributed_not_dynamo(monkeypatch):
    """A slow staging (before Dynamo runs) and a slow backend land in their own
    phases: Dynamo's time is measured, not the rest of the first call."""
    from earth2studio_compile import region

    pause = 0.3

    class SlowStaging(region.StagedCall):
        def __init__(self, *args, **kwargs):
            time.sleep(pause)
            super().__init__(*args, **kwargs)

    def slow_backend(gm, example_inputs):
        time.sleep(pause)
        return gm.forward

    monkeypatch.setattr(region, "StagedCall", SlowStaging)
    model = zoo.build("toy")
    with CompileSession(model, backend=slow_backend, probe=False) as session:
        with torch.no_grad():
            model.model(torch.randn(1, 4, 16, 32))
    r = session.report.regions[0]
    assert r.status == "compiled"
    assert r.phases["unattributed"] >= pause
    assert r.phases["backend"] >= pause
    # The measured phases leave the staging's pause out.
    measured = sum(v for k, v in r.phases.items() if k in r.FIRST_CALL)
    assert measured - r.phases["unattributed"] <= r.first_call_seconds - pause


def test_the_report_names_the_local_cache_that_made_a_compile_warm(
    tmp_path, monkeypatch
):
    from earth2studio_compile import _torch

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    assert "this package's" in local_cache_source(str(tmp_path / "inductor"))
    default = _torch.default_inductor_cache_dir()
    assert default is not None
    assert "PyTorch's default" in local_cache_source(default)
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", "off")
    assert "PyTorch's default" in local_cache_source(default)
    assert "TORCHINDUCTOR_CACHE_DIR" in local_cache_source(str(tmp_path / "mine"))


def _report(first: float, eager_ms: float, compiled_ms: float, calls: int):
    r = RegionReport("M", "core", status="compiled", calls=calls)
    r.phases.update(dynamo=first / 2, backend=first / 4, first_run=first / 4)
    r.eager_ms, r.compiled_ms = eager_ms, compiled_ms
    return r


def test_break_even_counts_the_calls_that_pay_for_the_compile():
    r = _report(first=1.0, eager_ms=10.0, compiled_ms=5.0, calls=8)
    # n calls cost 1.0 s + (n - 1) x 5 ms compiled against n x 10 ms eager.
    n = r.break_even_calls
    assert n is not None
    assert 1.0 + (n - 1) * 0.005 <= n * 0.010 + 1e-9
    assert 1.0 + (n - 2) * 0.005 > (n - 1) * 0.010
    assert f"pays for its compile after {n} calls (this run: 8)" in r.break_even_text
    r.calls = n
    assert "reached in this run" in r.break_even_text
    # CUDA-graph recording at the second call is a cost too.
    r.phases["cudagraph_record"] = 0.5
    assert r.break_even_calls is not None and r.break_even_calls > n
    slower = _report(first=1.0, eager_ms=5.0, compiled_ms=6.0, calls=8)
    assert slower.break_even_calls is None
    assert "does not pay" in slower.break_even_text


def test_speed_probe_can_be_turned_off():
    core = zoo.ToyCore(4, 8).eval()
    x = torch.randn(2, 4, 8, 8)
    with CompileSession(core, regions=("net",), backend=eager_backend) as on:
        with torch.no_grad():
            for _ in range(8):
                core.net(x)
    with CompileSession(
        core, regions=("net",), backend=eager_backend, probe=False
    ) as off:
        with torch.no_grad():
            for _ in range(8):
                core.net(x)
    assert on.report.regions[0].eager_ms is not None
    assert on.report.regions[0].compiled_ms is not None
    assert off.report.regions[0].eager_ms is None
    assert off.report.regions[0].compiled_ms is None
    with pytest.raises(TypeError, match="probe"):
        CompileSession(core, probe="no")


def test_a_fallback_reports_the_time_spent_before_it(logs):
    core = zoo.ToyCore(4, 8).eval()
    x = torch.randn(2, 4, 8, 8)
    with CompileSession(core, regions=("net",), backend=FailingBackend()) as session:
        with torch.no_grad():
            core.net(x)
    r = session.report.regions[0]
    assert r.status == "eager"
    assert r.phases["before_fallback"] > 0
    assert r.compile_seconds == pytest.approx(r.phases["before_fallback"])
    (warning,) = messages(logs, "WARNING")
    assert f"at its first call after {r.phases['before_fallback']:.1f} s" in warning
