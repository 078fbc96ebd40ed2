"""The persistent compile cache (earth2studio_compile.cache): where its root and
Inductor's local cache go, the bundle key's fields, and roots it does not use (off,
not a directory, owned by someone else).

Bundles themselves (save, load, damage) are tested in artifacts/test_bundles.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from cache_helpers import toy_rollout
from conftest import as_new_process, messages

from earth2studio_compile import CompileSession, cache
from earth2studio_compile.cache import local_cache_source
from earth2studio_compile.tools import zoo


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


def test_bundle_made_for_another_version_is_not_used(bundles, logs, monkeypatch):
    model = zoo.build("toy")
    toy_rollout(model)
    (saved,) = bundles.glob("*.tar")
    as_new_process()
    real = cache._versions
    monkeypatch.setattr(cache, "_versions", lambda: {**real(), "torch": "9.9.9"})
    _, region = toy_rollout(model)
    assert (
        region.artifact == "saved"
    )  # a different key: the old bundle is not looked up
    (other,) = set(bundles.glob("*.tar")) - {saved}
    # A bundle copied under the wrong name is caught by its own metadata.
    other.write_bytes(saved.read_bytes())
    as_new_process()
    _, region = toy_rollout(model)
    assert region.artifact.startswith("ignored: ValueError: made for a different torch")
    assert any("made for a different torch" in m for m in messages(logs, "WARNING"))


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


def test_the_report_names_the_local_cache_that_made_a_compile_warm(
    tmp_path, monkeypatch
):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    assert "this package's" in local_cache_source(str(tmp_path / "inductor"))
    default = os.path.abspath(default_cache_dir())
    assert "PyTorch's default" in local_cache_source(default)
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", "off")
    assert "PyTorch's default" in local_cache_source(default)
    assert "TORCHINDUCTOR_CACHE_DIR" in local_cache_source(str(tmp_path / "mine"))


def test_cache_false_and_env_off_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "c"))
    _, region = toy_rollout(zoo.build("toy"), {"cache": False})
    assert region.artifact is None and not (tmp_path / "c").exists()
    with pytest.raises(TypeError, match="cache must be True or False"):
        CompileSession(zoo.build("toy"), cache="yes")


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
        out, region = toy_rollout(model)
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
    assert toy_rollout(model)[1].artifact == "saved"
    (bundle,) = bundles.glob("*.tar")
    if os.geteuid() == 0:
        os.chown(bundle, 65534, 65534)  # nobody
    else:
        # Only root can give a file away: be someone else instead.
        monkeypatch.setattr(cache, "_uid", lambda: os.geteuid() + 1)
    as_new_process()
    _, region = toy_rollout(model)
    assert region.status == "compiled" and region.artifact.startswith(
        "ignored: not trusted"
    )
    (warning,) = messages(logs, "WARNING")
    assert "is owned by uid" in warning and "compiles its own" in warning
