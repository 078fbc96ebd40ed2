"""What the library tells a user: log levels and the wording of its messages."""

from __future__ import annotations

import earth2studio.run
import pytest
import torch
from conftest import TIME, eager_backend, messages, run_workflow
from loguru import logger

from earth2studio_compile.cache import local_cache_source
from earth2studio_compile.precision import ENV
from earth2studio_compile.report import CompileReport, RegionReport
from earth2studio_compile.tools import zoo


def test_a_compiled_workflow_logs_nothing_at_debug(tmp_path, monkeypatch):
    from earth2studio_compile import run

    # The package's own cache on: bundles are saved and their lines logged.
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    records: list = []
    sink = logger.add(
        lambda m: records.append(m.record), level="DEBUG", filter="earth2studio_compile"
    )
    try:
        from earth2studio.io import KVBackend

        model = zoo.build("toy")
        data, io = zoo.random_source(model), KVBackend()
        run.deterministic(TIME, 2, model, data, io, verbose=False, compile=True)
    finally:
        logger.remove(sink)
    assert any("torch.compile: " in r["message"] for r in records)  # the INFO summary
    debug = [
        f"{r['name']}: {r['message']}" for r in records if r["level"].name == "DEBUG"
    ]
    assert debug == []


def test_a_bad_precision_variable_names_the_fix(monkeypatch):
    from earth2studio_compile import run

    model = zoo.build("toy")
    monkeypatch.setenv(ENV, "fp16")
    with pytest.raises(ValueError) as err:
        run.deterministic(TIME, 1, model, zoo.random_source(model), None, compile=True)
    text = str(err.value)
    assert f"{ENV}='fp16' is not a precision" in text
    assert "Did you mean 'bf16'?" in text
    assert "fp32, tf32, bf16, or unset it" in text
    assert "None" not in text


def test_a_bad_precision_variable_leaves_compile_false_upstreams(monkeypatch, logs):
    """compile=False runs upstream's workflow whatever the environment says: the
    bad value is named in one WARNING per value, not per call, and never raised."""
    from earth2studio_compile import run

    model = zoo.build("toy")
    expected = run_workflow(earth2studio.run.deterministic, "deterministic", model)
    monkeypatch.setenv(ENV, "fp16-typo-for-this-test")
    for _ in range(2):
        got = run_workflow(run.deterministic, "deterministic", model, compile=False)
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            assert torch.equal(got[name], value), name
    monkeypatch.setenv(ENV, "half-typo-for-this-test")
    run_workflow(run.deterministic, "deterministic", model, compile=False)
    warnings = [m for m in messages(logs, "WARNING") if ENV in m]
    assert len(warnings) == 2, warnings
    assert "'fp16-typo-for-this-test' is not a precision" in warnings[0]
    assert "compile=False" in warnings[0] and "unset it" in warnings[0]
    assert "'half-typo-for-this-test' is not a precision" in warnings[1]


def test_tf32_off_cuda_is_reported_as_no_effect():
    kwargs = dict(status="compiled", precision="tf32", precision_error=4.6e-7)
    cpu = CompileReport([RegionReport("FCN", "model", device="cpu", **kwargs)])
    assert "tf32 (no effect on cpu)" in cpu.summary()
    assert "rel. L2" not in cpu.summary()
    cuda = CompileReport([RegionReport("FCN", "model", device="cuda", **kwargs)])
    assert "tf32 (rel. L2 4.6e-07 vs fp32 eager)" in cuda.summary()
    bf16 = dict(kwargs, precision="bf16")
    cpu_bf16 = CompileReport([RegionReport("FCN", "model", device="cpu", **bf16)])
    assert "bf16 (rel. L2 4.6e-07 vs fp32 eager)" in cpu_bf16.summary()


def test_a_cpu_tf32_session_says_tf32_has_no_effect():
    from earth2studio_compile import CompileSession

    model = zoo.build("toy")
    with CompileSession(model, backend=eager_backend, precision="tf32") as session:
        with torch.no_grad():
            model.model(torch.randn(1, 4, 16, 32))
    assert session.report.regions[0].device == "cpu"
    assert "tf32 (no effect on cpu)" in session.report.summary()


def test_the_cache_state_reads_as_plain_words(tmp_path, monkeypatch):
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    where = local_cache_source(str(tmp_path / "inductor"))
    report = CompileReport(
        [
            RegionReport(
                "FCN", "model", status="compiled", cache="cold", cache_source=where
            )
        ]
    )
    summary = report.summary()
    assert (
        f"cold: nothing cached yet in this package's cache ({tmp_path / 'inductor'})"
        in summary
    ), summary
    assert "cold cache" not in summary
    report.regions[0].cache = "warm"
    assert "warm: compiled code reused from this package's cache" in report.summary()
