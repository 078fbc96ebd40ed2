"""The background build's own process (earth2studio_compile.artifacts.build_process):
one job in, ``result.json`` out, whatever happened; no artifact under a key the
forecast would not look up, nor while another process builds the same one.

Its real build, in a child process, runs in
executors/test_executors_background.py; these call :func:`build_job` here on jobs
that end before building (it sets the global TF32 flags to the job's: each test
hands it this process's own).
"""

from __future__ import annotations

import json
import threading

import torch
from tiny_cores import LINEAR_PATCH, TinyCore

from earth2studio_compile.artifacts import build_job, build_process, verified
from earth2studio_compile.artifacts.aot_key import aot_root
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.snapshot import snapshot_module
from earth2studio_compile.artifacts.store import file_lock
from earth2studio_compile.patches import Patches, on_submodules
from earth2studio_compile.precision import tf32_enabled


def _target() -> RegionTarget:
    return RegionTarget.resolve(
        TinyCore(),
        owner="tiny_cores.TinyModel",
        region="core",
        device=torch.device("cpu"),
        precision=None,
    )


def _save_job(job, key, target, args, root) -> None:
    """What the forecast's process saves for its build process, in ``job``."""
    payload = {
        "key": key,
        "tf32": tf32_enabled(),  # this process's own: they stay as they are
        "target": target,
        "args": args,
        "kwargs": {},
        "root": root,
    }
    torch.save(payload, job / build_process.INPUT)


def test_the_build_process_refuses_a_key_the_forecast_would_not_find(tmp_path):
    """Parent and child must agree on the key (global TF32 flags are part of it
    with precision None): a child that computes another one says so and builds
    nothing."""
    target = _target()
    payload = {
        "key": "not-this-one",
        "tf32": tf32_enabled(),  # as they are: this process's flags stay
        "target": target,
        "args": (torch.randn(4, 8),),
        "kwargs": {},
        "root": tmp_path,
    }
    torch.save(payload, tmp_path / "job.pt")
    assert not build_process.build_job(tmp_path)
    result = (tmp_path / "result.json").read_text()
    assert "computes the key" in result, result
    assert not (tmp_path / "job.pt").exists()
    assert not (tmp_path / "aot").exists() or not any((tmp_path / "aot").iterdir())


def test_a_build_another_process_holds_the_lock_of_is_left_to_it(tmp_path):
    """One build per key at a time: with the artifact's lock taken, the job builds
    nothing and says why."""
    target, args = _target(), (torch.randn(4, 8),)
    key, _ = target.aot_key(args, {})
    job, root = tmp_path / "job", tmp_path / "cache"
    job.mkdir()
    artifact = aot_root(root) / key
    artifact.parent.mkdir(parents=True)
    _save_job(job, key, target, args, root)
    held = file_lock(build_process.lock_path(artifact))
    held.acquire()
    try:
        assert not build_process.build_job(job)
    finally:
        held.release()
    result = json.loads((job / build_process.RESULT).read_text())
    assert result["ok"] is False, result
    assert result["reason"] == "another process builds the same artifact", result
    assert result["seconds"] >= 0
    assert not (job / build_process.INPUT).exists()
    assert not artifact.exists()


def test_the_builds_of_one_cache_compile_one_at_a_time(tmp_path, monkeypatch):
    """A build waits while another build of the same cache holds the slot (a
    StormCast forecast starts two, an Aurora one four: compiling side by side
    they slowed the forecast's eager calls), builds once it is free, and frees
    it."""
    target, args = _target(), (torch.randn(4, 8),)
    key, _ = target.aot_key(args, {})
    job, root = tmp_path / "job", tmp_path / "cache"
    job.mkdir()
    directory = aot_root(root)
    directory.mkdir(parents=True)
    _save_job(job, key, target, args, root)
    building = threading.Event()

    def build_region(*args, **kwargs):
        building.set()
        return directory / key

    monkeypatch.setattr(build_process, "build_region", build_region)
    monkeypatch.setattr(
        verified, "seal_built", lambda *args: verified.Sealed(None, None)
    )
    other = file_lock(build_process.slot_path(directory))
    other.acquire()
    thread = threading.Thread(target=build_process.build_job, args=(job,))
    thread.start()
    try:
        assert not building.wait(1.0), "it built while another build held the slot"
    finally:
        other.release()
    thread.join(60)
    assert building.is_set() and not thread.is_alive()
    result = json.loads((job / build_process.RESULT).read_text())
    assert result["ok"], result
    other.acquire(timeout=0)  # the build let go of it
    other.release()


def test_a_job_that_cannot_be_read_leaves_a_result_saying_why(tmp_path):
    assert not build_process.build_job(tmp_path)  # no job.pt in it
    result = json.loads((tmp_path / build_process.RESULT).read_text())
    assert not result["ok"] and result["reason"].startswith("FileNotFoundError")


def test_the_build_lock_lies_beside_the_artifact(tmp_path):
    artifact = tmp_path / "aot" / "0123abcd"
    lock = build_process.lock_path(artifact)
    assert lock.parent == artifact.parent and lock != artifact
    assert lock.name.startswith(artifact.name)


def _built(tmp_path):
    """A build process's job for :func:`_target` run to its end in ``tmp_path``:
    the target, its first-call arguments, the cache root, the job's directory and
    the artifact's."""
    target, args = _target(), (torch.randn(4, 8),)
    key, _ = target.aot_key(args, {})
    job, root = tmp_path / "job", tmp_path / "cache"
    job.mkdir()
    _save_job(job, key, target, args, root)
    assert build_process.build_job(job)
    return target, args, root, job, aot_root(root) / key


def test_a_built_artifact_that_gives_eager_s_answer_is_sealed_for_its_weights(
    tmp_path, monkeypatch
):
    """The build process verifies what it built against eager on the forecast's
    first-call inputs and records the seal of the job's weights: the forecast's
    next process loads it without an eager call. An artifact that gives another
    answer, or a bf16 region holding submodules in fp32 (the session holds them),
    is not sealed."""
    target, args, root, job, artifact = _built(tmp_path)
    result = json.loads((job / build_process.RESULT).read_text())
    assert result["ok"] and result["sealed"] is None, result
    weights = verified.weights_print(target.module)
    assert verified.known(artifact, verified.seal(artifact, weights))

    (artifact / verified.FILE).unlink()
    monkeypatch.setattr(verified, "verify", lambda *a: "another answer")
    assert verified.seal_built(target, args, {}, root).why == "another answer"
    assert not (artifact / verified.FILE).exists()
    monkeypatch.undo()
    own = RegionTarget.resolve(
        target.module,
        owner="tiny_cores.TinyModel",
        region="core",
        device=torch.device("cpu"),
        precision="bf16",
        fp32_modules=("Linear",),
    )
    assert "fp32" in verified.seal_built(own, args, {}, root).why
    assert not (artifact / verified.FILE).exists()


def test_a_built_artifact_that_gives_another_answer_is_removed_and_refused(
    tmp_path, monkeypatch
):
    """What the build process built but gives another answer than eager on the
    forecast's inputs (torch 2.11's code for the zoo's FCN on the CPU): the job
    fails with the reason, the artifact is gone, and its key is refused, so the
    forecast's next processes neither load it nor build it again."""
    from earth2studio_compile.artifacts import refused

    monkeypatch.setattr(verified, "verify", lambda *a: "off by 2e-3")
    target, args = _target(), (torch.randn(4, 8),)
    key, _ = target.aot_key(args, {})
    job, root = tmp_path / "job", tmp_path / "cache"
    job.mkdir()
    _save_job(job, key, target, args, root)
    assert not build_process.build_job(job)
    result = json.loads((job / build_process.RESULT).read_text())
    reason = "its artifact gives another answer than eager (off by 2e-3)"
    assert not result["ok"] and result["reason"] == reason, result
    assert not (aot_root(root) / key).exists()
    assert refused.recall(aot_root(root), key) == reason


def test_sealing_an_artifact_whose_seal_is_held_runs_nothing(tmp_path, monkeypatch):
    """A build that finds its artifact already sealed for these weights (tools.build
    run again) records nothing new and calls neither the artifact nor eager."""
    target, args, root, _, artifact = _built(tmp_path)
    assert verified.known(
        artifact, verified.seal(artifact, verified.weights_print(target.module))
    )
    loaded = verified.load_runner(target, args, {}, cudagraphs=False, root=root)
    assert not isinstance(loaded, str), loaded
    calls = []
    monkeypatch.setattr(
        type(loaded), "__call__", lambda self, *a, **k: calls.append("artifact")
    )
    monkeypatch.setattr(verified, "verify", lambda *a: calls.append("eager"))
    assert verified.seal_built(target, args, {}, root, runner=loaded).why is None
    assert calls == [] and loaded.verified_earlier


def test_the_build_process_sets_the_table_s_patches_on_its_bare_copy(tmp_path):
    """The forecast's calls ran the table's patches on the core's submodules
    (Aurora's Swin blocks); the copy a build process gets is bare. Before, it
    built upstream's code, computed another key and built nothing: every
    background build of Aurora's Swin stages failed."""
    target = RegionTarget.resolve(
        TinyCore(),
        owner="tiny_cores.TinyModel",
        region="core",
        device=torch.device("cpu"),
        precision=None,
        patches=(LINEAR_PATCH,),
    )
    args = (torch.randn(4, 8),)
    bare, _ = target.aot_key(args, {})
    with Patches(on_submodules(target.patches, target.module)):
        key, _ = target.aot_key(args, {})
        copy = snapshot_module(target.module)
    assert key != bare and "forward" not in copy.a.__dict__
    job, root = tmp_path / "job", tmp_path / "cache"
    job.mkdir()
    child = RegionTarget(module=copy, **build_job.settings_of(target))
    _save_job(job, key, child, args, root)
    assert build_process.build_job(job), (job / build_process.RESULT).read_text()
    assert (aot_root(root) / key).is_dir()
    assert "forward" not in copy.a.__dict__
