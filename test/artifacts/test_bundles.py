"""Compile cache bundles (earth2studio_compile.artifacts.bundles): saved at a
cold compile, loaded at a warm start, and never trusted blindly.

A bundle that is corrupt, made for something else, damaged or without checksums is
ignored with one WARNING before anything of it is planted in the local Inductor
cache; a sound one is planted whole or not at all. The fresh-process test runs the
benchmark's measurement module twice with empty local Inductor caches, the second
time with the first run's bundles: that is a warm start on a new machine (the eager
reference they compare with is measured in this process). It checks
that no kernel is rebuilt (Inductor's own hit/miss counts) rather than a wall-clock
ratio; the ratio is the benchmark's job
(``python -m earth2studio_compile.tools.bench --small``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from cache_helpers import toy_rollout
from conftest import as_new_process, messages

from earth2studio_compile import cache
from earth2studio_compile.artifacts import bundles as store
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.__main__ import MEASURE


def test_bundle_saved_then_loaded(bundles):
    model = zoo.build("toy")
    with torch.no_grad():
        expected = model.model(
            torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(0))
        )
    out, region = toy_rollout(model)
    assert region.status == "compiled" and region.artifact == "saved"
    assert len(list(bundles.glob("*.tar"))) == 1
    as_new_process()
    out2, region2 = toy_rollout(model)
    assert region2.artifact == "loaded" and region2.cache == "warm"
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2, expected, rtol=1e-5, atol=1e-5)


def test_corrupt_bundle_is_ignored_with_one_warning(bundles, logs):
    model = zoo.build("toy")
    expected, _ = toy_rollout(model, {"cache": False})
    as_new_process()
    toy_rollout(model)
    (path,) = bundles.glob("*.tar")
    path.write_bytes(b"not a tar file" * 100)
    as_new_process()
    out, region = toy_rollout(model)
    assert region.status == "compiled"
    assert region.artifact.startswith("ignored: ") and region.artifact.endswith(
        "re-saved"
    )
    warnings = [m for m in messages(logs, "WARNING") if "compile cache bundle" in m]
    assert len(warnings) == 1 and str(path) in warnings[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def saved_bundle(tmp_path_factory) -> Path:
    """One real bundle, from a cold compile of the toy model into an empty local
    Inductor cache so that it holds kernel files as well as torch's artifacts."""
    tmp = tmp_path_factory.mktemp("saved-bundle")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(cache.ENV, str(tmp / "root"))
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp / "local"))
        as_new_process()
        _, region = toy_rollout(zoo.build("toy"))
        as_new_process()
    assert region.artifact == "saved"
    (path,) = (tmp / "root" / "artifacts").glob("*.tar")
    with tarfile.open(path) as tar:
        names = tar.getnames()
    assert store.MEGA in names and any(n.startswith(store.FILES) for n in names)
    return path


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def _load_copy(
    bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[Path], None] | None = None,
) -> tuple[str | None, Path, Path]:
    """Copy ``bundle`` into a fresh cache, apply ``change`` to the copy, load it into an
    empty local cache; return (report, bundle path, local cache)."""
    directory = tmp_path / "artifacts"
    directory.mkdir(parents=True)
    path = directory / bundle.name
    shutil.copy(bundle, path)
    if change is not None:
        change(path)
    with tarfile.open(bundle) as tar:
        fields = json.loads(tar.extractfile(store.META).read())["fields"]
    assert cache.artifact_key(fields) == path.stem
    local = tmp_path / "local"
    local.mkdir()
    # torch.compiler.load_cache_artifacts writes into the local cache in effect.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(local))
    return store.ArtifactCache(directory, local, fields).load(), path, local


def _damage(member: Callable[[tarfile.TarInfo], bool]) -> Callable[[Path], None]:
    """Flip bytes inside the first matching member's data; the tar stays readable."""

    def change(path: Path) -> None:
        with tarfile.open(path) as tar:
            info = next(m for m in tar.getmembers() if member(m) and m.size >= 16)
        data = bytearray(path.read_bytes())
        middle = info.offset_data + info.size // 2
        data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
        path.write_bytes(bytes(data))
        with tarfile.open(path) as tar:
            assert info.name in tar.getnames()

    return change


def _kernel_file(m: tarfile.TarInfo) -> bool:
    return m.name.startswith(store.FILES) and m.name.endswith((".so", ".cpp", ".py"))


@pytest.mark.parametrize(
    "member",
    [_kernel_file, lambda m: m.name == store.MEGA],
    ids=["kernel", "torch-blob"],
)
def test_damaged_bundle_is_ignored_before_anything_is_planted(
    saved_bundle, tmp_path, monkeypatch, logs, member
):
    change = _damage(member)
    report, path, local = _load_copy(saved_bundle, tmp_path, monkeypatch, change)
    assert report is not None and report.startswith("ignored: ")
    assert "checksum" in report
    warnings = messages(logs, "WARNING")
    assert len(warnings) == 1 and str(path) in warnings[0]
    assert _files(local) == [], "a damaged bundle planted files in the local cache"


def _rewrite_meta(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def rewrite(path: Path) -> None:
        with tarfile.open(path) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
        meta = json.loads({m.name: d for m, d in members}[store.META])
        change(meta)
        with tarfile.open(path, "w") as tar:
            for info, data in members:
                if info.name == store.META:
                    data = json.dumps(meta).encode()
                    info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    return rewrite


def _old_format(meta: dict) -> None:
    meta["fields"]["format"] = 1
    meta.pop("sha256", None)


def _no_checksums(meta: dict) -> None:
    meta.pop("sha256", None)


@pytest.mark.parametrize(
    ("change", "reason"),
    [(_old_format, "made for a different format"), (_no_checksums, "checksum")],
    ids=["old-format", "no-checksums"],
)
def test_bundle_without_checksums_is_ignored(
    saved_bundle, tmp_path, monkeypatch, logs, change, reason
):
    rewrite = _rewrite_meta(change)
    report, path, local = _load_copy(saved_bundle, tmp_path, monkeypatch, rewrite)
    assert report is not None and report.startswith("ignored: ") and reason in report
    warnings = messages(logs, "WARNING")
    assert len(warnings) == 1 and str(path) in warnings[0]
    assert _files(local) == []


def test_sound_bundle_is_planted_whole_or_not_at_all(
    saved_bundle, tmp_path, monkeypatch
):
    with tarfile.open(saved_bundle) as tar:
        kernels = {
            m.name.removeprefix(store.FILES): tar.extractfile(m).read()
            for m in tar.getmembers()
            if m.name.startswith(store.FILES)
        }
    # A write that fails half-way (a full disk) leaves no file behind, not even a
    # temporary one.
    real = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(cache.os, "replace", failing_replace)
    report, _, local = _load_copy(saved_bundle, tmp_path / "a", monkeypatch)
    assert report is not None and report.startswith("ignored: OSError")
    assert _files(local) == []
    monkeypatch.setattr(cache.os, "replace", real)
    report, _, local = _load_copy(saved_bundle, tmp_path / "b", monkeypatch)
    assert report == "loaded"
    planted = {p.relative_to(local).as_posix(): p.read_bytes() for p in _files(local)}
    for rel, data in kernels.items():
        assert planted[rel] == data, rel
    assert not any(Path(rel).name.startswith(".e2sc-") for rel in planted)


def _measure(spec: dict, out: Path, root: Path, local: Path) -> dict:
    env = {
        **os.environ,
        cache.ENV: str(root),
        "TORCHINDUCTOR_CACHE_DIR": str(local),
        "TRITON_CACHE_DIR": str(local / "triton"),
    }
    subprocess.run(
        [sys.executable, "-m", MEASURE, json.dumps(spec), str(out)],
        check=True,
        env=env,
        timeout=900,
    )
    return json.loads(out.read_text())


def _eager_reference(spec: dict, monkeypatch) -> None:
    """The eager row of ``spec`` run in this process, as its fresh process would:
    it only writes the reference the compiled rows compare with, and compiles
    nothing (a fresh process of its own cost an import of Earth2Studio). The
    measurement's own logging set-up is kept off this process's handlers."""
    from loguru import logger

    from earth2studio_compile.tools.bench import measure

    with monkeypatch.context() as m:
        m.setattr(type(logger), "remove", lambda *args, **kwargs: None)
        m.setattr(type(logger), "add", lambda *args, **kwargs: 0)
        measure.measure({**spec, "mode": "eager"})


def test_warm_start_in_a_fresh_process_with_an_empty_local_cache(tmp_path, monkeypatch):
    spec = {
        "model": "fcn",
        "size": "small",
        "device": "cpu",
        "steps": 2,
        "e2e_steps": 0,
        "reference": str(tmp_path / "eager.pt"),
    }
    root = tmp_path / "bundles"
    _eager_reference(spec, monkeypatch)
    cold = _measure(
        {**spec, "mode": "auto"}, tmp_path / "c.json", root, tmp_path / "local-1"
    )
    warm = _measure(
        {**spec, "mode": "auto"}, tmp_path / "w.json", root, tmp_path / "local-2"
    )
    (c,), (w,) = cold["report"]["regions"], warm["report"]["regions"]
    assert (c["cache"], c["artifact"]) == ("cold", "saved")
    assert (w["cache"], w["artifact"]) == ("warm", "loaded"), "kernels were rebuilt"
    for run in (cold, warm):
        assert run["rel_l2_first"] <= 1e-5 and run["rel_l2_last"] <= 1e-5
    print(
        f"first step: cold {cold['first_step_s']:.2f} s, "
        f"warm {warm['first_step_s']:.2f} s"
    )


def test_warm_start_does_not_start_compile_workers(bundles, monkeypatch):
    import torch._inductor.async_compile as async_compile

    seen = []
    real = async_compile.get_compile_threads

    def spy():
        seen.append(real())
        return seen[-1]

    monkeypatch.setattr(async_compile, "get_compile_threads", spy)
    model = zoo.build("toy")
    _, cold = toy_rollout(model)
    as_new_process()
    seen.clear()
    _, warm = toy_rollout(model)
    assert (cold.artifact, warm.artifact) == ("saved", "loaded")
    # Loading the cached kernels asks for the worker pool; on a warm start it must not
    # get one: nothing is left to build, and the workers would compete with the rollout.
    assert seen and set(seen) == {1}
