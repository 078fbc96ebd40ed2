"""Many processes, one compile cache root: one compiles, the others load.

The multi-process tests start real processes (the small FCN, a few seconds of
imports each) and keep real compiles to a minimum: only the concurrent start uses
empty local Inductor caches; the others compile against the suite's warm one. What a
single process decides (stale locks, read-only and untrusted roots) is tested in this
process with the toy model.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import filelock
import numpy as np
import pytest
import torch
from conftest import messages

from earth2studio_compile import CompileSession, cache
from earth2studio_compile.artifacts import bundles
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.tools import zoo

CPU = torch.device("cpu")

# One process: the small FCN, eager then compiled on the same input; writes its
# report and how far the compiled output is from eager to the file named by its
# argument (its log goes to stdout: Earth2Studio routes loguru through tqdm.write).
WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from earth2studio_compile import CompileSession
    from earth2studio_compile.artifacts import bundles
    from earth2studio_compile.session import example_input
    from earth2studio_compile.tools import zoo

    hang = os.environ.get("E2SC_TEST_HANG")
    if hang:
        # Stands for a compile that never ends: the lock is held, nothing saved.
        def save(self):
            open(hang, "w").close()
            time.sleep(600)

        bundles.ArtifactCache.save = save
    model = zoo.build("fcn")
    x, coords = example_input(model, device="cpu")
    x.normal_(generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eager, _ = model(x, coords)
    with CompileSession(model) as session, torch.no_grad():
        out, _ = model(x, coords)
    (region,) = session.report.regions
    diff = (out - eager).abs().max().item()
    result = {"region": region.__dict__, "max_abs_diff": diff}
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
    """
)


# Child processes import the package this test imported, wherever it lies.
_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(Path(cache.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    ),
}


def _start(tmp_path: Path, name: str, root: Path, local: Path | None, **env: str):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    full = {**_ENV, cache.ENV: str(root), **env}
    if local is not None:
        full["TORCHINDUCTOR_CACHE_DIR"] = str(local)
        full["TRITON_CACHE_DIR"] = str(local / "triton")
    log = open(tmp_path / f"{name}.log", "w")
    result = tmp_path / f"{name}.json"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(result)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=full,
    )
    proc.log_path = tmp_path / f"{name}.log"  # type: ignore[attr-defined]
    proc.result_path = result  # type: ignore[attr-defined]
    return proc


def _result(proc) -> dict:
    proc.wait(timeout=600)
    log = proc.log_path.read_text()
    assert proc.returncode == 0, log
    result = json.loads(proc.result_path.read_text())
    result["log"] = log
    return result


def _warnings(log: str) -> list[str]:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log)  # Earth2Studio's sink colours
    return [
        line
        for line in plain.splitlines()
        if "| WARNING" in line and "earth2studio_compile" in line
    ]


def _held(lock_file: Path) -> bool:
    """Whether some process holds the lock (probing takes and drops it if not)."""
    if not lock_file.exists():
        return False
    probe = filelock.FileLock(lock_file, thread_local=False)
    try:
        probe.acquire(timeout=0)
    except filelock.Timeout:
        return True
    probe.release()
    return False


def test_concurrent_start_compiles_once_and_the_other_loads(tmp_path):
    """Two processes, empty local Inductor caches, one shared root."""
    root = tmp_path / "shared"
    procs = [_start(tmp_path, f"p{i}", root, tmp_path / f"local-{i}") for i in range(2)]
    results = [_result(p) for p in procs]
    artifacts = sorted(r["region"]["artifact"] for r in results)
    assert artifacts[1] == "saved", artifacts
    assert artifacts[0].startswith("loaded"), artifacts
    loader = next(r for r in results if r["region"]["artifact"] != "saved")
    assert loader["region"]["cache"] == "warm", "the loading process compiled too"
    assert len(list((root / "artifacts").glob("*.tar"))) == 1
    for r in results:
        assert r["region"]["status"] == "compiled"
        assert r["max_abs_diff"] <= 1e-4
        assert not _warnings(r["log"]), r["log"]


def test_a_killed_compiler_leaves_the_lock_to_a_waiting_process(tmp_path):
    root = tmp_path / "shared"
    marker = tmp_path / "holding"
    first = _start(tmp_path, "first", root, None, E2SC_TEST_HANG=str(marker))
    try:
        deadline = time.monotonic() + 900
        while not marker.exists():
            assert first.poll() is None, first.log_path.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        (lock_file,) = (root / "artifacts").glob("*.lock")
        assert _held(lock_file)
        second = _start(tmp_path, "second", root, None)
        while "waiting up to" not in second.log_path.read_text():
            assert second.poll() is None, second.log_path.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    result = _result(second)
    assert result["region"]["artifact"] == "saved"
    assert "ended without saving a bundle" in result["log"]
    assert result["max_abs_diff"] <= 1e-4
    # The dead holder's lock file is still on disk; the kernel freed the lock.
    assert lock_file.exists() and not _held(lock_file)


def _toy(session_kwargs=None):
    model = zoo.build("toy")
    x = torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model.model(x)
    torch._dynamo.reset()
    with CompileSession(model, **(session_kwargs or {})) as session, torch.no_grad():
        out = model.model(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    return session.report.regions[0]


@pytest.fixture
def root(tmp_path, monkeypatch):
    """The package cache on, rooted in a fresh directory; warnings as if in a
    fresh process."""
    path = tmp_path / "root"
    monkeypatch.setenv(cache.ENV, str(path))
    monkeypatch.delenv(cache.TRUSTED_ENV, raising=False)
    return path


def _bundle(module: torch.nn.Module, directory: Path) -> bundles.RegionBundle:
    target = RegionTarget.resolve(
        module, owner="m.Model", region="model", device=CPU, precision=None
    )
    bundle = bundles.RegionBundle(directory, target)
    x = torch.zeros(1, 4, 8, 16)
    assert bundle.load((x,), {}) is None
    return bundle


def test_a_stale_lock_file_does_not_block(root):
    """A lock file left on disk by a process long gone is no lock at all."""
    module = torch.nn.Conv2d(4, 4, 3)
    first = _bundle(module, root / "artifacts")
    assert first.path is not None
    lock_file = first.path.with_suffix(".lock")
    first.release()
    lock_file.write_text("left behind by a crashed run")
    assert not _held(lock_file)
    start = time.monotonic()
    second = _bundle(module, root / "artifacts")
    assert second.waited is None and time.monotonic() - start < cache.lock_timeout()
    assert _held(lock_file)  # this process compiles; others would wait
    second.release()
    assert not _held(lock_file)


def test_a_waiter_that_times_out_compiles_with_one_warning(root, monkeypatch, logs):
    module = torch.nn.Conv2d(4, 4, 3)
    holder = _bundle(module, root / "artifacts")
    monkeypatch.setenv(cache.LOCK_TIMEOUT_ENV, "0.5")
    waiter = _bundle(module, root / "artifacts")  # a second holder: it waited
    assert waiter.waited is None
    (warning,) = messages(logs, "WARNING")
    assert "Waited 0 s for another process" in warning
    assert cache.LOCK_TIMEOUT_ENV in warning
    holder.release()


def _read_only(path: Path):
    """Make ``path`` read-only for this process; returns how to undo it."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in (path, *path.rglob("*")) if p.is_dir()}
        for p in modes:
            p.chmod(modes[p] & ~0o222)
        return lambda: [p.chmod(m) for p, m in modes.items()]
    # root writes through permission bits: a read-only bind mount instead.
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)])
    if done.returncode:
        pytest.skip("running as root without the right to mount a read-only root")
    return lambda: subprocess.run(["umount", str(path)], check=True)


def test_a_read_only_root_compiles_with_one_warning(root, logs):
    (root / "artifacts").mkdir(parents=True)
    undo = _read_only(root)
    try:
        first = _toy()
        second = _toy()  # the next region, or the next rank on this root
    finally:
        undo()
    for region in (first, second):
        assert region.status == "compiled" and region.artifact is None
    (warning,) = messages(logs, "WARNING")
    assert "read-only" in warning and "Fix: make it writable" in warning
    assert not list((root / "artifacts").iterdir())


def test_a_read_only_root_still_serves_its_bundles(root, logs):
    assert _toy().artifact == "saved"
    undo = _read_only(root)
    try:
        region = _toy()
    finally:
        undo()
    assert region.artifact == "loaded" and region.cache == "warm"
    assert not messages(logs, "WARNING")


def test_a_world_writable_root_is_refused(root, logs):
    assert _toy().artifact == "saved"
    root.chmod(0o777)
    region = _toy()
    assert region.status == "compiled" and region.artifact.startswith(
        "ignored: not trusted"
    )
    (warning,) = messages(logs, "WARNING")
    assert f"{root.resolve()} is writable by others" in warning
    assert "chmod go-w" in warning and cache.TRUSTED_ENV in warning


def test_a_named_trusted_root_is_loaded(root, monkeypatch, logs):
    assert _toy().artifact == "saved"
    root.chmod(0o775)
    monkeypatch.setenv(cache.TRUSTED_ENV, str(root))
    assert _toy().artifact == "loaded"
    assert not messages(logs, "WARNING")


def test_an_untrusted_local_inductor_cache_is_not_used(root, monkeypatch, logs):
    (root / "inductor").mkdir(parents=True, mode=0o700)
    (root / "inductor").chmod(0o777)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    local = cache.use_local_cache(root)
    assert local != root / "inductor"
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") != str(root / "inductor")
    (warning,) = messages(logs, "WARNING")
    assert "is writable by others" in warning


def test_torchrun_recipe_compiles_once_and_matches_eager(tmp_path):
    """The user guide's recipe: 2 ranks (gloo), one shared root, one store each."""
    import zarr

    from earth2studio_compile.tools.recipes import ensemble_torchrun as recipe

    out, root = tmp_path / "compiled", tmp_path / "shared"
    members = 4  # 2 a rank: one batch size, so one region key for both
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            recipe.__name__,
            "--out",
            str(out),
            "--nensemble",
            str(members),
            "--nsteps",
            "2",
        ],
        env={**_ENV, cache.ENV: str(root)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    ranks = json.loads((out / "ranks.json").read_text())
    artifacts = sorted(a["artifact"] for r in ranks for a in r["regions"].values())
    assert len(artifacts) == 2 and artifacts[1] == "saved", artifacts
    assert artifacts[0].startswith("loaded"), artifacts
    assert len(list((root / "artifacts").glob("*.tar"))) == 1
    for rank in (0, 1):
        recipe.run_rank(rank, 2, tmp_path / "eager", members, 2, compile=False)
        compiled = zarr.open(str(out / f"rank{rank}.zarr"), mode="r")
        eager = zarr.open(str(tmp_path / "eager" / f"rank{rank}.zarr"), mode="r")
        assert sorted(compiled.array_keys()) == sorted(eager.array_keys())
        for name in eager.array_keys():
            a, b = compiled[name][:], eager[name][:]
            if np.issubdtype(b.dtype, np.floating):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)
            else:
                np.testing.assert_array_equal(a, b, err_msg=name)
