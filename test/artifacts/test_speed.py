"""The speed probe's figures kept beside an ahead-of-time artifact."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from earth2studio_compile.artifacts.speed import FIGURES, recall, remember, speed_file

CPU = torch.device("cpu")


def _report(**figures):
    base = dict(
        compiled_ms=1.5,
        eager_ms=3.0,
        compiled_range=(1.4, 1.6),
        eager_range=(2.9, 3.2),
        slower=False,
    )
    return SimpleNamespace(**{**base, **figures})


def test_the_figures_come_back_as_the_report_had_them(tmp_path):
    remember(tmp_path, CPU, None, _report())
    kept = recall(tmp_path, CPU, None)
    assert kept == {
        "compiled_ms": 1.5,
        "eager_ms": 3.0,
        "compiled_range": (1.4, 1.6),
        "eager_range": (2.9, 3.2),
        "slower": False,
    }
    assert set(kept) == set(FIGURES)


def test_a_kept_verdict_is_judged_again_by_this_versions_margin(tmp_path):
    """Figures kept when a region counted as slower only past 5% said "not
    slower" for FCN3's blocks at 0.96x (H200, 2026-12-01): recalled, their figures
    are judged again, and the region runs eagerly."""
    blocks = _report(
        compiled_ms=89.74,
        eager_ms=86.05,
        compiled_range=(89.70, 89.82),
        eager_range=(85.98, 86.15),
        slower=False,
    )
    remember(tmp_path, CPU, None, blocks)
    assert recall(tmp_path, CPU, None)["slower"] is True


def test_nothing_kept_before_the_probe_judged_or_unreadable_gives_nothing(tmp_path):
    remember(tmp_path, CPU, None, _report(compiled_ms=None))
    assert recall(tmp_path, CPU, None) is None
    assert not speed_file(tmp_path, CPU, None).exists()
    path = speed_file(tmp_path, CPU, None)
    path.write_text("{not json")
    assert recall(tmp_path, CPU, None) is None
    path.write_text(json.dumps({"compiled_ms": 1.0}))  # figures missing
    assert recall(tmp_path, CPU, None) is None
    figures = {**vars(_report()), "compiled_ms": float("nan")}
    path.write_text(json.dumps(figures))
    assert recall(tmp_path, CPU, None) is None


def test_a_cache_that_cannot_be_written_is_not_an_error(tmp_path):
    remember(tmp_path / "missing", CPU, None, _report())  # never raises
    assert recall(tmp_path / "missing", CPU, None) is None


def test_each_kind_of_device_and_torch_has_its_own_file(tmp_path, monkeypatch):
    here = speed_file(tmp_path, CPU, None)
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert speed_file(tmp_path, CPU, None) != here


def _gpu(monkeypatch) -> torch.device:
    """A CUDA device's key, on any machine: only its name is read."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "H100")
    return torch.device("cuda")


def test_figures_timed_under_other_tf32_flags_are_not_recalled(tmp_path, monkeypatch):
    """Eager matmuls and convolutions on CUDA (and the artifact's, where its
    precision is PyTorch's global flags) run in TF32 or not as the flags say:
    figures a build() timed with TF32 off do not stand for a forecast with it on."""
    from earth2studio_compile.precision import scope, tf32_enabled

    gpu = _gpu(monkeypatch)
    remember(tmp_path, gpu, None, _report())
    other = "fp32" if tf32_enabled()[0] else "tf32"
    with scope(other, CPU):
        assert recall(tmp_path, gpu, None) is None
    assert recall(tmp_path, gpu, None) is not None


def test_figures_timed_on_the_cpu_stand_whatever_the_tf32_flags(tmp_path):
    """Regression: TF32 changes nothing on the CPU, but its flags were part of the
    figures' key, so a CPU forecast under the flags a GPU script sets missed what
    build() timed without them and compiled the region again (2026-11-30, a CPU
    run of the next session's calls)."""
    from earth2studio_compile.precision import scope

    with scope("fp32", CPU):
        remember(tmp_path, CPU, None, _report())
    with scope("tf32", CPU):
        assert recall(tmp_path, CPU, None) is not None
        assert recall(tmp_path, CPU, "tf32") is not None


def test_a_build_in_tf32_stands_for_a_forecast_under_the_tf32_flags(
    tmp_path, monkeypatch
):
    """A region in "tf32" runs under TF32 whatever the flags outside it say: what
    build(precision="tf32") timed is recalled by a forecast whose region takes
    PyTorch's TF32 flags (regression: it was not, and every process after the
    build timed eager calls again, docs/bench/2026-11-28-h200-twentieth), never
    by one with them off or in "fp32"."""
    from earth2studio_compile.precision import scope

    gpu = _gpu(monkeypatch)
    remember(tmp_path, gpu, "tf32", _report())
    with scope("tf32", CPU):
        assert recall(tmp_path, gpu, None) is not None
        assert recall(tmp_path, gpu, "fp32") is None
    with scope("fp32", CPU):
        assert recall(tmp_path, gpu, None) is None
        assert recall(tmp_path, gpu, "tf32") is not None
