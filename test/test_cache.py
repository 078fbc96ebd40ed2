"""Warm start: the persistent compile cache and the warm-up helper.

The fresh-process test runs the benchmark's measurement module twice with empty
local Inductor caches, the second time with the first run's bundles: that is a
warm start on a new machine. It checks that no kernel is rebuilt (Inductor's own
hit/miss counts) rather than a wall-clock ratio; the ratio is the benchmark's job
(``python -m earth2studio_compile.bench --small``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import earth2studio.run as upstream
from conftest import messages, rel_l2, run_workflow

from earth2studio_compile import CompileSession, cache, zoo


@pytest.fixture
def bundles(tmp_path, monkeypatch):
    """Turn the package cache on, rooted in a temporary directory."""
    root = tmp_path / "compile-cache"
    monkeypatch.setenv(cache.ENV, str(root))
    return root / "artifacts"


def test_cache_root_follows_earth2studio_convention(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.ENV, raising=False)
    monkeypatch.setenv("EARTH2STUDIO_CACHE", str(tmp_path / "e2s"))
    assert cache.cache_root() == tmp_path / "e2s" / "compile"
    monkeypatch.setenv(cache.ENV, str(tmp_path / "mine"))
    assert cache.cache_root() == tmp_path / "mine"
    for off in ("off", "0", "", "false"):
        monkeypatch.setenv(cache.ENV, off)
        assert cache.cache_root() is None


def _fields(module, x, **changes):
    fields = cache.key_fields(
        "m.Model", "model", module, (x,), {}, "inductor/default", torch.device("cpu")
    )
    return {**fields, **changes}


def test_key_depends_on_shapes_dtype_parameters_and_versions():
    core = zoo.ToyCore(4, 8)
    base = cache.artifact_key(_fields(core, torch.zeros(1, 4, 8, 16)))
    assert base == cache.artifact_key(_fields(core, torch.ones(1, 4, 8, 16)))  # values don't matter
    assert base != cache.artifact_key(_fields(core, torch.zeros(2, 4, 8, 16)))
    assert base != cache.artifact_key(_fields(core, torch.zeros(1, 4, 8, 16, dtype=torch.float64)))
    assert base != cache.artifact_key(_fields(zoo.ToyCore(4, 16), torch.zeros(1, 4, 8, 16)))
    assert base != cache.artifact_key(_fields(core, torch.zeros(1, 4, 8, 16), torch="0.0"))
    assert base != cache.artifact_key(_fields(core, torch.zeros(1, 4, 8, 16), triton="0.0"))


def _toy_rollout(model, session_kwargs=None):
    x = torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(0))
    with CompileSession(model, **(session_kwargs or {})) as session, torch.no_grad():
        out = model.model(x)
    return out, session.report.regions[0]


def test_bundle_saved_then_loaded(bundles):
    model = zoo.build("toy")
    with torch.no_grad():
        expected = model.model(torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(0)))
    out, region = _toy_rollout(model)
    assert region.status == "compiled" and region.artifact == "saved"
    assert len(list(bundles.glob("*.tar"))) == 1
    torch._dynamo.reset()
    out2, region2 = _toy_rollout(model)
    assert region2.artifact == "loaded" and region2.cache == "warm"
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2, expected, rtol=1e-5, atol=1e-5)


def test_corrupt_bundle_is_ignored_with_one_warning(bundles, logs):
    model = zoo.build("toy")
    expected, _ = _toy_rollout(model, {"cache": False})
    torch._dynamo.reset()
    _toy_rollout(model)
    (path,) = bundles.glob("*.tar")
    path.write_bytes(b"not a tar file" * 100)
    torch._dynamo.reset()
    out, region = _toy_rollout(model)
    assert region.status == "compiled"
    assert region.artifact.startswith("ignored: ") and region.artifact.endswith("re-saved")
    warnings = [m for m in messages(logs, "WARNING") if "compile cache bundle" in m]
    assert len(warnings) == 1 and str(path) in warnings[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_bundle_made_for_another_version_is_not_used(bundles, logs, monkeypatch):
    model = zoo.build("toy")
    _toy_rollout(model)
    (saved,) = bundles.glob("*.tar")
    torch._dynamo.reset()
    real = cache._versions
    monkeypatch.setattr(cache, "_versions", lambda: {**real(), "torch": "9.9.9"})
    _, region = _toy_rollout(model)
    assert region.artifact == "saved"  # a different key: the old bundle is not looked up
    (other,) = set(bundles.glob("*.tar")) - {saved}
    # A bundle copied under the wrong name is caught by its own metadata.
    other.write_bytes(saved.read_bytes())
    torch._dynamo.reset()
    _, region = _toy_rollout(model)
    assert region.artifact.startswith("ignored: ValueError: made for a different torch")
    assert any("made for a different torch" in m for m in messages(logs, "WARNING"))


def test_cache_false_and_env_off_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "c"))
    _, region = _toy_rollout(zoo.build("toy"), {"cache": False})
    assert region.artifact is None and not (tmp_path / "c").exists()
    with pytest.raises(TypeError, match="cache must be True or False"):
        CompileSession(zoo.build("toy"), cache="yes")


def test_warmup_compiles_before_the_first_step():
    model = zoo.build("fcn")
    eager = run_workflow(upstream.deterministic, "deterministic", model)
    with pytest.raises(RuntimeError, match="inside an open session"):
        CompileSession(model).warmup()
    with CompileSession(model) as session:
        session.warmup()
        region = session.report.regions[0]
        assert (region.status, region.calls) == ("compiled", 1)
        compiled = run_workflow(
            upstream.deterministic, "deterministic", model
        )
    assert region.recompiles == 0 and region.calls == 3  # warm-up + 2 steps
    for key, value in eager.items():
        if value.dtype.is_floating_point:
            assert rel_l2(compiled[key], value) <= 1e-5, key


def _measure(spec: dict, out: Path, root: Path, local: Path) -> dict:
    env = {
        **os.environ,
        cache.ENV: str(root),
        "TORCHINDUCTOR_CACHE_DIR": str(local),
        "TRITON_CACHE_DIR": str(local / "triton"),
    }
    subprocess.run(
        [sys.executable, "-m", "earth2studio_compile.bench.measure", json.dumps(spec), str(out)],
        check=True, env=env, timeout=900,
    )
    return json.loads(out.read_text())


def test_warm_start_in_a_fresh_process_with_an_empty_local_cache(tmp_path):
    spec = {
        "model": "fcn", "size": "small", "device": "cpu", "steps": 2, "e2e_steps": 0,
        "reference": str(tmp_path / "eager.pt"),
    }
    root = tmp_path / "bundles"
    _measure({**spec, "mode": "eager"}, tmp_path / "e.json", root, tmp_path / "local-e")
    cold = _measure({**spec, "mode": "auto"}, tmp_path / "c.json", root, tmp_path / "local-1")
    warm = _measure({**spec, "mode": "auto"}, tmp_path / "w.json", root, tmp_path / "local-2")
    (c,), (w,) = cold["report"]["regions"], warm["report"]["regions"]
    assert (c["cache"], c["artifact"]) == ("cold", "saved")
    assert (w["cache"], w["artifact"]) == ("warm", "loaded"), "kernels were rebuilt"
    for run in (cold, warm):
        assert run["rel_l2_first"] <= 1e-5 and run["rel_l2_last"] <= 1e-5
    print(f"first step: cold {cold['first_step_s']:.2f} s, warm {warm['first_step_s']:.2f} s")


def test_warm_start_does_not_start_compile_workers(bundles, monkeypatch):
    import torch._inductor.async_compile as async_compile

    seen = []
    real = async_compile.get_compile_threads

    def spy():
        seen.append(real())
        return seen[-1]

    monkeypatch.setattr(async_compile, "get_compile_threads", spy)
    model = zoo.build("toy")
    _, cold = _toy_rollout(model)
    torch._dynamo.reset()
    seen.clear()
    _, warm = _toy_rollout(model)
    assert (cold.artifact, warm.artifact) == ("saved", "loaded")
    # Loading the cached kernels asks for the worker pool; on a warm start it must not
    # get one: nothing is left to build, and the workers would compete with the rollout.
    assert seen and set(seen) == {1}
