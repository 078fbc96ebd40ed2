"""The model table's run column (earth2studio_compile.tools.bench.model_runs): its
records exist and say what the column claims, and each kind of evidence renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from earth2studio_compile.models import shipped_entries
from earth2studio_compile.tools.bench import model_runs

ROOT = Path(__file__).resolve().parents[3]

_JUNIT = """<testsuites><testsuite>
<testcase classname="t" name="test_ok"/>
<testcase classname="t" name="test_bad"><failure message="x"/></testcase>
<testcase classname="t" name="test_off"><skipped message="y"/></testcase>
<testcase classname="t" name="test_fixed">
<failure message="[XPASS(strict)] z"/></testcase>
</testsuite></testsuites>"""


def _classes() -> set[str]:
    return {key.rsplit(".", 1)[-1] for key in shipped_entries()}


def test_the_catalogs_name_classes_tests_and_records_that_exist():
    classes = _classes()
    assert set(model_runs.ZOO_CLASSES.values()) <= classes
    assert set(model_runs.CPU_TESTS) <= classes
    assert set(model_runs.GPU_TESTS) <= classes
    for path in model_runs.CPU_TESTS.values():
        assert (ROOT / path).is_file(), path
    for record, test in model_runs.GPU_TESTS.values():
        # Passed or failed as recorded; a skip is no run and must not be listed.
        outcome = model_runs.junit_outcome(ROOT / "docs" / "bench" / record, test)
        assert outcome in ("passed", "failed"), (record, test)


def test_junit_outcome_reads_each_ending(tmp_path):
    record = tmp_path / "r.xml"
    record.write_text(_JUNIT)
    got = {t: model_runs.junit_outcome(record, t) for t in ("test_ok", "test_bad")}
    assert got == {"test_ok": "passed", "test_bad": "failed"}
    assert model_runs.junit_outcome(record, "test_off") == "skipped"
    with pytest.raises(ValueError, match="no testcase 'test_gone'"):
        model_runs.junit_outcome(record, "test_gone")


def test_a_strict_xfail_that_passed_reads_passed(tmp_path):
    """Aurora's published GPU test was a strict xfail while the table refused CUDA;
    its run of 2026-11-30 XPASSed (every assertion held), which pytest records as a
    failure: before, the model table said "failed"."""
    record = tmp_path / "r.xml"
    record.write_text(_JUNIT)
    assert model_runs.junit_outcome(record, "test_fixed") == "passed"


def _gpu_tests(tmp_path, monkeypatch, tests: dict[str, str], day: str) -> None:
    """Point the catalog of GPU tests at one JUnit record of ``_JUNIT`` under a
    ``<day>-h200-x`` directory of a docs/bench/ in ``tmp_path``."""
    bench = tmp_path / "docs" / "bench" / f"{day}-h200-x"
    bench.mkdir(parents=True)
    (bench / "r.xml").write_text(_JUNIT)
    monkeypatch.setattr(model_runs, "ROOT", tmp_path)
    record = f"{day}-h200-x/r.xml"
    catalog = {cls: (record, test) for cls, test in tests.items()}
    monkeypatch.setattr(model_runs, "GPU_TESTS", catalog)


def _env(date: str) -> dict:
    return {"gpu": "NVIDIA H200", "date": date, "torch": "2.11.0+cu130"}


def test_each_kind_of_evidence_renders(tmp_path, monkeypatch):
    _gpu_tests(
        tmp_path,
        monkeypatch,
        {"AIFS2ENS": "test_bad", "ACE2ERA5": "test_off"},
        day="2026-11-28",
    )
    rollout = {
        "environment": _env("2026-11-27T01:00:00+00:00"),
        "results": [
            {
                "model": "aurora",
                "precision": "fp32",
                "mode": "eager",
                "steady_ms": 2000.0,
                "first_step_s": 3.0,
            },
            {
                "model": "aurora",
                "precision": "tf32",
                "mode": "eager",
                "steady_ms": 1000.0,
                "first_step_s": 1.5,
            },
            {
                "model": "aurora",
                "precision": "tf32",
                "mode": "auto",
                "steady_ms": 500.0,
                "first_step_s": 9.0,
                "rel_l2_first": 4e-6,
            },
            {"model": "sfno", "precision": "tf32", "mode": "auto", "steady_ms": 1.0},
        ],
    }
    workflow = {
        "meta": {"environment": _env("2026-11-29T00:00:00+00:00")},
        "rows": [
            {
                "job": "dlwp-ens",
                "model": "dlwp",
                "io": "zarr-disk",
                "run": "eager",
                "first_step_s": 1.25,
            },
            {
                "job": "dlwp-ens",
                "model": "dlwp",
                "io": "overlapped",
                "run": "eager",
                "first_step_s": 1.1,
            },
            {
                "job": "dlwp-ens",
                "model": "dlwp",
                "io": "overlapped",
                "run": "compiled",
                "first_step_s": 0.95,
            },
            {
                "job": "dlwp-ens",
                "model": "dlwp",
                "io": None,
                "run": "floor",
                "precision": "tf32",
                "batch_size": 8,
                "eager_step_ms": 24.0,
                "compiled_step_ms": 4.8,
            },
        ],
    }
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in model_runs.model_runs()([rollout, workflow]).splitlines()
        if line.startswith("| ") and not line.startswith("| model")
    }
    assert rows.keys() == _classes()
    assert rows["Aurora"] == [
        "GPU speed at published size (NVIDIA H200, 2026-11-27, torch 2.11.0+cu130)",
        "2.00x",
        "-",
        "4.0e-06",
        "1.50/9.00",
    ]
    assert rows["DLWP"][1:] == ["5.00x (batch 8)", "-", "-", "1.25/0.95"]
    assert rows["AIFS2ENS"][0] == (
        "GPU test at published size, failed "
        "([H200, 2026-11-28](bench/2026-11-28-h200-x/r.xml))"
    )
    # A skipped GPU test is no run: the CPU test stands.
    assert rows["ACE2ERA5"][0] == "CPU test, small (`test/tools/zoo/test_ace2.py`)"
    assert rows["FuXi"] == ["read only", "-", "-", "-", "-"]


def test_a_failed_gpu_test_outranks_speed_and_hides_it(tmp_path, monkeypatch):
    """Before, a speed record won over the GPU test: Aurora's row showed its
    speedup and a rel. L2 of 4.6e-6 (measured with an identity backbone) after
    its GPU test failed with other answers than eager."""
    _gpu_tests(
        tmp_path,
        monkeypatch,
        {"Aurora": "test_bad", "StormCast": "test_ok"},
        day="2026-11-29",
    )
    rows = [
        {"model": m, "precision": "tf32", "mode": mode, "steady_ms": ms}
        for m in ("aurora", "stormcast")
        for mode, ms in (("eager", 1000.0), ("auto", 500.0))
    ]
    rollout = {"environment": _env("2026-11-27T01:00:00+00:00"), "results": rows}
    table = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in model_runs.model_runs()([rollout]).splitlines()
        if line.startswith("| ") and not line.startswith("| model")
    }
    assert table["Aurora"] == [
        "GPU test at published size, failed "
        "([H200, 2026-11-29](bench/2026-11-29-h200-x/r.xml))",
        "-",
        "-",
        "-",
        "-",
    ]
    # A passed test still gives way to the speed record.
    assert table["StormCast"][:2] == [
        "GPU speed at published size (NVIDIA H200, 2026-11-27, torch 2.11.0+cu130)",
        "2.00x",
    ]
