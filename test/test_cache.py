"""Warm start: the persistent compile cache and the warm-up helper.

The fresh-process test runs the benchmark's measurement module twice with empty
local Inductor caches, the second time with the first run's bundles: that is a
warm start on a new machine. It checks that no kernel is rebuilt (Inductor's own
hit/miss counts) rather than a wall-clock ratio; the ratio is the benchmark's job
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
import textwrap
from collections.abc import Callable
from pathlib import Path

import earth2studio.run as upstream
import pytest
import torch
from conftest import as_new_process, messages, run_workflow

from earth2studio_compile import CompileSession, cache
from earth2studio_compile.artifacts import bundles as store
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.__main__ import MEASURE


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
    assert base == cache.artifact_key(
        _fields(core, torch.ones(1, 4, 8, 16))
    )  # values don't matter
    assert base != cache.artifact_key(_fields(core, torch.zeros(2, 4, 8, 16)))
    assert base != cache.artifact_key(
        _fields(core, torch.zeros(1, 4, 8, 16, dtype=torch.float64))
    )
    assert base != cache.artifact_key(
        _fields(zoo.ToyCore(4, 16), torch.zeros(1, 4, 8, 16))
    )
    assert base != cache.artifact_key(
        _fields(core, torch.zeros(1, 4, 8, 16), torch="0.0")
    )
    assert base != cache.artifact_key(
        _fields(core, torch.zeros(1, 4, 8, 16), triton="0.0")
    )


def _toy_rollout(model, session_kwargs=None):
    x = torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(0))
    with CompileSession(model, **(session_kwargs or {})) as session, torch.no_grad():
        out = model.model(x)
    return out, session.report.regions[0]


def test_bundle_saved_then_loaded(bundles):
    model = zoo.build("toy")
    with torch.no_grad():
        expected = model.model(
            torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(0))
        )
    out, region = _toy_rollout(model)
    assert region.status == "compiled" and region.artifact == "saved"
    assert len(list(bundles.glob("*.tar"))) == 1
    as_new_process()
    out2, region2 = _toy_rollout(model)
    assert region2.artifact == "loaded" and region2.cache == "warm"
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2, expected, rtol=1e-5, atol=1e-5)


def test_corrupt_bundle_is_ignored_with_one_warning(bundles, logs):
    model = zoo.build("toy")
    expected, _ = _toy_rollout(model, {"cache": False})
    as_new_process()
    _toy_rollout(model)
    (path,) = bundles.glob("*.tar")
    path.write_bytes(b"not a tar file" * 100)
    as_new_process()
    out, region = _toy_rollout(model)
    assert region.status == "compiled"
    assert region.artifact.startswith("ignored: ") and region.artifact.endswith(
        "re-saved"
    )
    warnings = [m for m in messages(logs, "WARNING") if "compile cache bundle" in m]
    assert len(warnings) == 1 and str(path) in warnings[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_bundle_made_for_another_version_is_not_used(bundles, logs, monkeypatch):
    model = zoo.build("toy")
    _toy_rollout(model)
    (saved,) = bundles.glob("*.tar")
    as_new_process()
    real = cache._versions
    monkeypatch.setattr(cache, "_versions", lambda: {**real(), "torch": "9.9.9"})
    _, region = _toy_rollout(model)
    assert (
        region.artifact == "saved"
    )  # a different key: the old bundle is not looked up
    (other,) = set(bundles.glob("*.tar")) - {saved}
    # A bundle copied under the wrong name is caught by its own metadata.
    other.write_bytes(saved.read_bytes())
    as_new_process()
    _, region = _toy_rollout(model)
    assert region.artifact.startswith("ignored: ValueError: made for a different torch")
    assert any("made for a different torch" in m for m in messages(logs, "WARNING"))


@pytest.fixture(scope="module")
def saved_bundle(tmp_path_factory) -> Path:
    """One real bundle, from a cold compile of the toy model into an empty local
    Inductor cache so that it holds kernel files as well as torch's artifacts."""
    tmp = tmp_path_factory.mktemp("saved-bundle")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(cache.ENV, str(tmp / "root"))
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp / "local"))
        as_new_process()
        _, region = _toy_rollout(zoo.build("toy"))
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


_LOCAL_CACHE_PROBE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    # Importing Dynamo sets TORCHINDUCTOR_CACHE_DIR to torch's default.
    import torch
    import torch._dynamo
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    from earth2studio_compile import cache

    root, compile_ = Path(sys.argv[1]), sys.argv[2] == "compile"
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    local = cache.use_local_cache(root)
    if compile_:
        torch.compile(lambda x: x.sin() * 2 + 1)(torch.randn(8, 8))
    files = sorted(
        p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()
    )
    print(json.dumps({
        "default": default_cache_dir(), "before": before, "local": str(local),
        "env": os.environ["TORCHINDUCTOR_CACHE_DIR"], "inductor": cache_dir(),
        "triton": os.environ.get("TRITON_CACHE_DIR"), "files": files,
    }))
    """
)


def _probe_local_cache(root: Path, compile_: bool = False, **env: str) -> dict:
    # conftest sets TORCHINDUCTOR_CACHE_DIR for the suite; the child starts as a
    # user's process would, without it.
    cleared = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    child = {k: v for k, v in os.environ.items() if k not in cleared}
    checkout = str(Path(cache.__file__).resolve().parents[1])
    child["PYTHONPATH"] = os.pathsep.join([checkout, child.get("PYTHONPATH", "")])
    mode = "compile" if compile_ else "import"
    out = subprocess.run(
        [sys.executable, "-c", _LOCAL_CACHE_PROBE, str(root), mode],
        env={**child, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_local_cache_goes_under_the_package_root_not_torch_default(tmp_path):
    root = tmp_path / "root"
    seen = _probe_local_cache(root, compile_=True)
    assert seen["before"] == seen["default"]  # what torch did before any session
    assert seen["env"] == seen["inductor"] == seen["local"] == str(root / "inductor")
    # Inductor read the new value at the next compile: its graph and kernel land there.
    assert any(f.startswith("fxgraph/") for f in seen["files"])
    assert any(f.endswith(".so") for f in seen["files"])
    # A Triton cache that Inductor derived from its own default moves along.
    default = seen["default"]
    triton = os.path.join(default, "triton", "0")
    seen = _probe_local_cache(root, TRITON_CACHE_DIR=triton)
    assert seen["triton"] == str(root / "inductor" / "triton" / "0")


def test_local_cache_chosen_by_the_user_stays(tmp_path):
    mine = tmp_path / "mine"
    seen = _probe_local_cache(
        tmp_path / "root",
        TORCHINDUCTOR_CACHE_DIR=str(mine),
        TRITON_CACHE_DIR=str(mine / "t"),
    )
    assert seen["before"] == seen["env"] == seen["inductor"] == str(mine)
    assert seen["local"] == str(mine)
    assert seen["triton"] == str(mine / "t")
    assert not (tmp_path / "root").exists()


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
        compiled = run_workflow(upstream.deterministic, "deterministic", model)
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
        [sys.executable, "-m", MEASURE, json.dumps(spec), str(out)],
        check=True,
        env=env,
        timeout=900,
    )
    return json.loads(out.read_text())


def test_warm_start_in_a_fresh_process_with_an_empty_local_cache(tmp_path):
    spec = {
        "model": "fcn",
        "size": "small",
        "device": "cpu",
        "steps": 2,
        "e2e_steps": 0,
        "reference": str(tmp_path / "eager.pt"),
    }
    root = tmp_path / "bundles"
    _measure({**spec, "mode": "eager"}, tmp_path / "e.json", root, tmp_path / "local-e")
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
    _, cold = _toy_rollout(model)
    as_new_process()
    seen.clear()
    _, warm = _toy_rollout(model)
    assert (cold.artifact, warm.artifact) == ("saved", "loaded")
    # Loading the cached kernels asks for the worker pool; on a warm start it must not
    # get one: nothing is left to build, and the workers would compete with the rollout.
    assert seen and set(seen) == {1}


def test_a_root_that_cannot_be_a_directory_compiles_without_the_cache(
    tmp_path, monkeypatch, logs
):
    """A root under a regular file: the region still compiles (Inductor), with no
    persistence and one WARNING naming the root and the fix."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    root = blocker / "compile-cache"
    monkeypatch.setenv(cache.ENV, str(root))
    model = zoo.build("toy")
    with torch.no_grad():
        expected = model.model(
            torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(0))
        )
    for _ in range(2):  # one WARNING per root, not per session
        out, region = _toy_rollout(model)
        assert region.status == "compiled", region.reason
        assert region.artifact is None
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        as_new_process()
    (warning,) = messages(logs, "WARNING")
    assert str(root) in warning and "compile cache is off" in warning
    assert f"{cache.ENV} to a writable directory" in warning
    assert blocker.read_text() == "not a directory"


def test_a_bundle_owned_by_someone_else_is_refused(bundles, monkeypatch, logs):
    monkeypatch.delenv(cache.TRUSTED_ENV, raising=False)
    model = zoo.build("toy")
    assert _toy_rollout(model)[1].artifact == "saved"
    (bundle,) = bundles.glob("*.tar")
    if os.geteuid() == 0:
        os.chown(bundle, 65534, 65534)  # nobody
    else:
        # Only root can give a file away: be someone else instead.
        monkeypatch.setattr(cache, "_uid", lambda: os.geteuid() + 1)
    as_new_process()
    _, region = _toy_rollout(model)
    assert region.status == "compiled" and region.artifact.startswith(
        "ignored: not trusted"
    )
    (warning,) = messages(logs, "WARNING")
    assert "is owned by uid" in warning and "compiles its own" in warning
