"""Whether a region's compile pays within a workflow call
(earth2studio_compile.artifacts.payoff): figures kept at a session's end on the
Dynamo path, and a later first call that runs eagerly where they say it cannot.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import messages

from earth2studio_compile import CompileSession
from earth2studio_compile.artifacts import payoff
from earth2studio_compile.tools import zoo


def test_ace2s_h200_figures_do_not_pay_in_twenty_steps():
    # ACE2 at published size on an H200 (docs/bench/2026-11-29-h200-twentyseventh):
    # 28.81 ms eager, 25.33 compiled a call, a 2.9 s first call from a warm cache.
    ace2 = payoff.Payoff(saved_ms=28.81 - 25.33, cost_s=2.92, calls_per_step=1.0)
    assert not ace2.pays(20)
    assert ace2.pays(1000)
    assert "20 calls (20 steps)" in ace2.text(20)
    # StormCast's denoiser runs once a sampler step: 36 calls a workflow step.
    denoiser = payoff.Payoff(saved_ms=37.7, cost_s=2.92, calls_per_step=36.0)
    assert denoiser.pays(20)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        json.dumps({"saved_ms": 1.0, "cost_s": 2.0}),
        json.dumps({"saved_ms": math.nan, "cost_s": 2.0, "calls_per_step": 1.0}),
        json.dumps({"saved_ms": 1.0, "cost_s": 2.0, "calls_per_step": 0.0}),
    ],
)
def test_damaged_figures_are_not_read(tmp_path, text):
    path = tmp_path / "payoff.json"
    path.write_text(text)
    assert payoff.recall(path) is None
    assert payoff.against(path, 20) is None  # compiles, as without figures


def _counting_backend(ran: list[int]):
    def backend(gm, example_inputs):
        def call(*args):
            ran[0] += 1
            return gm.forward(*args)

        return call

    return backend


def _session(backend, calls: int, steps: int | None, probe: bool = True):
    """A fresh core (as in a later process: nothing of it on the in-process
    shelf) through ``calls`` calls of a session told ``steps``."""
    core = zoo.ToyCore(4, 8).eval()
    x = torch.randn(2, 4, 8, 8)
    with CompileSession(core, regions=("net",), backend=backend, probe=probe) as s:
        if steps is not None:
            s.expect(steps)
        with torch.no_grad():
            for _ in range(calls):
                core.net(x)
    return s.report.regions[0]


def test_a_compile_that_cannot_pay_runs_eagerly_in_a_later_process(
    tmp_path, monkeypatch, logs, same_speed
):
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    ran = [0]
    backend = _counting_backend(ran)
    # Nine calls: the probe judges; the figures are kept per step.
    first = _session(backend, 9, steps=9)
    # Judged: every call timed alike (same_speed), whatever the machine.
    assert first.executor == "dynamo" and first.compiled_ms is not None
    (kept,) = tmp_path.rglob("payoff/*.json")
    figures = json.loads(kept.read_text())
    assert figures["calls_per_step"] == 1.0
    assert figures["saved_ms"] == pytest.approx(first.eager_ms - first.compiled_ms)
    # Not Inductor: no cache to be warm, so the cost is Dynamo's trace alone.
    assert figures["cost_s"] == first.phases["dynamo"]

    # A compile that saves a microsecond a call against 100 s.
    kept.write_text(
        json.dumps({"saved_ms": 1e-3, "cost_s": 100.0, "calls_per_step": 1.0})
    )
    ran[0] = 0
    logs.clear()  # the first session's (a slower verdict's WARNING, if any)
    eager = _session(backend, 3, steps=20)
    assert ran[0] == 0, "nothing may run compiled"
    assert eager.status == "eager" and eager.compile_seconds == 0.0
    assert eager.reason.startswith("compiling would not pay for itself in this call")
    assert eager.eager_calls == 3
    assert any(
        "runs eagerly: compiling would not pay" in m for m in messages(logs, "INFO")
    )
    assert not messages(logs, "WARNING")  # nothing failed

    # probe=False keeps every region compiled; so does a call of unknown length.
    assert _session(backend, 3, steps=20, probe=False).status == "compiled"
    assert _session(backend, 3, steps=None).status == "compiled"
    # Figures that pay within the call: compiled.
    kept.write_text(json.dumps({"saved_ms": 1e3, "cost_s": 1.0, "calls_per_step": 1.0}))
    assert _session(backend, 3, steps=20).status == "compiled"


def test_figures_that_cannot_be_found_leave_the_region_compiling(tmp_path, monkeypatch):
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))

    def broken(*args):
        raise OSError("no such place")

    monkeypatch.setattr(payoff, "payoff_path", broken)
    assert _session(_counting_backend([0]), 3, steps=20).status == "compiled"


def test_without_a_cache_nothing_is_kept_or_decided(monkeypatch, tmp_path, same_speed):
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", "off")
    monkeypatch.chdir(tmp_path)
    region = _session(_counting_backend([0]), 9, steps=9)
    assert region.executor == "dynamo" and region.compiled_ms is not None  # judged
    assert not list(tmp_path.rglob("payoff"))


@pytest.mark.parametrize(
    ("steps", "error"), [(0, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_expect_names_a_bad_step_count(steps, error):
    core = zoo.ToyCore(4, 8).eval()
    with CompileSession(core, regions=("net",)) as session:
        with pytest.raises(error, match="steps"):
            session.expect(steps)


def test_break_even_is_the_fewest_steps_that_pay():
    figures = payoff.Payoff(saved_ms=2.0, cost_s=1.0, calls_per_step=5.0)
    steps = figures.break_even()
    assert steps == 101  # 10 ms saved a step: 100 steps save exactly the cost
    assert figures.pays(steps) and not figures.pays(steps - 1)
    assert (
        payoff.Payoff(saved_ms=-0.3, cost_s=1.0, calls_per_step=1.0).break_even()
        is None
    )


def test_a_failed_judge_is_kept_and_a_damaged_record_is_not_read(tmp_path):
    path = tmp_path / "payoff" / "f.json"
    assert payoff.recall_failure(path) is None
    payoff.keep_failure(path, "BackendCompilerFailed: no backend", "core")
    assert payoff.recall_failure(path) == "BackendCompilerFailed: no backend"
    assert payoff.recall(path) is None  # no figures: a failure is not a Payoff
    payoff.failure_path(path).write_text('{"reason": 3}')
    assert payoff.recall_failure(path) is None


def test_a_tf32_builds_figures_are_those_a_forecast_under_tf32_flags_reads(
    monkeypatch, tmp_path
):
    """SFNO on an H200 (docs/bench/2026-11-30-h200-thirtyseventh): a
    build(precision="tf32") under PyTorch's default flags (TF32 convolutions, fp32
    matmuls) kept its figures under another key than a forecast under TF32 flags
    looked for, as the table's Inductor options followed the flags of the moment,
    not the TF32 the region's precision runs under. Faked CUDA: keys only."""
    from tiny_cores import TinyCore

    from earth2studio_compile.artifacts.key import RegionTarget
    from earth2studio_compile.models import TORCH_HARMONICS_SFNO
    from earth2studio_compile.probe import signature

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "H200")
    cuda = torch.device("cuda", 0)
    inputs = signature((torch.empty(2, 4, device="meta"),), {})
    core = TinyCore()

    def figures_at(precision: str | None, matmul: bool, conv: bool):
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = conv
        target = RegionTarget.resolve(
            core,
            owner="SFNOPrognostic",
            region="model",
            device=cuda,
            precision=precision,
            table=TORCH_HARMONICS_SFNO,
            opaque=True,
        )
        return target.policy.label, payoff.payoff_path(target, tmp_path, inputs)

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        built = figures_at("tf32", matmul=False, conv=True)
        forecast = figures_at(None, matmul=True, conv=True)
        # PyTorch's defaults compute other kernels (TF32 convolutions only).
        defaults = figures_at(None, matmul=False, conv=True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    assert built == forecast
    assert "conv_1x1_as_mm=True" in built[0]
    assert defaults != forecast
