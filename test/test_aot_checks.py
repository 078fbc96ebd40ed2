"""How build() checks an artifact it built or found (earth2studio_compile.aot_checks):
verified against eager and sealed, timed as a region's probe would, or removed and
refused where it gives another answer."""

from __future__ import annotations

from conftest import messages


def test_build_verifies_its_artifact_against_eager_and_seals_it(built, monkeypatch):
    """What build() built, and an artifact it found present, ran once against eager
    on the captured call here, and the seal of the model's weights is recorded: a
    forecast's first call in the next process skips its own eager call (0.41 s of
    FCN's first step on an H100)."""
    from aot_helpers import unverified

    from earth2studio_compile import build
    from earth2studio_compile.artifacts import verified

    assert built.result.verified
    path = built.result.path
    weights = verified.weights_print(built.core)
    unverified(built.root)
    assert not verified.known(path, verified.seal(path, weights))
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    [again] = build(built.model, precision="fp32")
    assert again.status == "present" and again.verified
    assert verified.known(path, verified.seal(path, weights))


def test_an_artifact_that_gives_another_answer_than_eager_is_not_built(
    monkeypatch, tmp_path, logs
):
    """With torch 2.11 on the CPU, AOTInductor's code for the zoo's FCN gave a
    relative L2 of 2e-3 against eager (2026-11-29): build() said "built" (its
    verification only logged at INFO) and left the artifact, which every later
    process loaded, verified, warned about and dropped, and a rebuild made again.
    Now it reports "failed" with the reason, removes the artifact and refuses its
    key (torch's version is in it), with one WARNING. Here the artifact is made
    wrong by scaling what it returns."""
    from earth2studio_compile import build
    from earth2studio_compile.artifacts import refused
    from earth2studio_compile.artifacts.aot_runner import AotRunner
    from earth2studio_compile.tools import zoo

    run_artifact = AotRunner.__call__
    monkeypatch.setattr(
        AotRunner, "__call__", lambda self, *a, **k: 1.01 * run_artifact(self, *a, **k)
    )
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    [result] = build(zoo.build("fcn"), precision="fp32")
    assert result.status == "failed" and result.path is None and not result.verified
    assert result.reason.startswith("its artifact gives another answer than eager")
    aot = tmp_path / "aot"
    [record] = (aot / "refused").glob("*.json")
    key = record.stem
    assert not (aot / key).exists()
    assert refused.recall(aot, key) == result.reason
    [warning] = [m for m in messages(logs, "WARNING") if "not built ahead" in m]
    assert result.reason in warning


def test_build_times_the_artifact_as_a_region_would_and_keeps_its_speed(built):
    """build() runs the speed probe on the verified artifact (CUDA graphs where it
    has them, steady calls alternating with eager ones) and keeps the figures
    beside it: the first process after it times no eager calls (regression: every
    process after build() timed three eager steps and waited for the device six
    times)."""
    import torch

    from earth2studio_compile.artifacts import speed

    kept = speed.recall(built.result.path, torch.device("cpu"), "fp32")
    assert kept is not None
    assert kept["compiled_ms"] > 0 and kept["eager_ms"] > 0
    low, high = kept["compiled_range"]
    assert low <= kept["compiled_ms"] <= high


def test_build_times_the_runner_its_seal_ran_where_it_runs_no_cuda_graphs(
    built, monkeypatch
):
    """On the CPU (no CUDA graphs) build() times the runner its seal loaded: one
    load of the artifact per region (regression: the speed timing loaded it
    again, one more AOTInductor load per region in every build)."""
    import torch

    from earth2studio_compile import aot, aot_checks, build
    from earth2studio_compile.artifacts import speed, verified

    loads: list = []

    def counted(real):
        def load(*args, **kwargs):
            loads.append(kwargs.get("cudagraphs"))
            return real(*args, **kwargs)

        return load

    monkeypatch.setattr(aot, "load_runner", counted(aot.load_runner))
    monkeypatch.setattr(aot_checks, "load_runner", counted(aot_checks.load_runner))
    monkeypatch.setattr(verified, "load_runner", counted(verified.load_runner))
    cpu = torch.device("cpu")
    speed.speed_file(built.result.path, cpu, "fp32").unlink(missing_ok=True)
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    [again] = build(built.model, precision="fp32")
    assert again.status == "present" and again.verified
    assert loads == [False]
    assert speed.recall(built.result.path, cpu, "fp32") is not None
