"""Background builds (earth2studio_compile.artifacts.background and the
background executor): eager steps at once, the artifact built in a child process,
the switch at a step boundary.

Background builds are on by default only on CUDA; these tests turn them on for
the CPU (``EARTH2STUDIO_COMPILE_BACKGROUND=on``). One real build of a two-layer
core (a child process: import, export, AOTInductor; 20-60 s on 2 cores); the
other tests replace the build process with a stand-in job.
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch
from conftest import messages
from tiny_cores import TinyCore, TinyModel

from earth2studio_compile import CompileSession, resident
from earth2studio_compile.artifacts import background, build_process
from earth2studio_compile.executors import BackgroundExecutor
from earth2studio_compile.metrics import rel_l2


@pytest.fixture
def on(monkeypatch, tmp_path):
    """Background builds on, the persistent cache in a fresh directory."""
    monkeypatch.setenv(background.ENV, "on")
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    return tmp_path


def _eager(core, x):
    with torch.no_grad():
        return core(x)


class _Job:
    """A stand-in build job: running for ``running`` polls, then ``end``."""

    def __init__(
        self, running: int, end: str, reason: str = "boom", waiting: bool = False
    ) -> None:
        self.left, self.end, self.reason = running, end, reason
        self.polls = 0
        self.waiting, self.launches = waiting, []

    def launch(self) -> None:
        if self.waiting:
            self.launches.append(self.polls)
        self.waiting = False

    def poll(self) -> str:
        self.polls += 1
        if self.polls <= self.left:
            return "running"
        return self.end

    def describe(self) -> str:
        if self.poll() == "failed":
            return f"background build failed after 1.0 s: {self.reason}"
        return "still building in the background (1.0 s so far)"


def test_enabled_reads_the_environment(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(background.ENV, raising=False)
    assert not background.enabled(cpu) and background.enabled(cuda)
    monkeypatch.setenv(background.ENV, "off")
    assert not background.enabled(cuda)
    monkeypatch.setenv(background.ENV, "on")
    assert background.enabled(cpu)


def test_the_snapshot_leaves_the_regions_hooks_out(on):
    model = TinyModel()
    with CompileSession(model, regions=["core"], precision="bf16", probe=False):
        assert "_compiled_call_impl" in model.core.__dict__
        copy = background.snapshot_module(model.core)
    assert "_compiled_call_impl" not in copy.__dict__
    for a, b in zip(copy.parameters(), model.core.parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    # The copy pickles without the region (which holds locks and the report).
    pickle.loads(pickle.dumps(copy))


def test_an_unpicklable_core_compiles_on_its_first_call(on):
    model = TinyModel()
    model.core.scale = lambda t: t  # a lambda: no build process can unpickle it
    x = torch.randn(4, 8)
    with CompileSession(model, regions=["core"], probe=False) as session:
        with torch.no_grad():
            out = model.core(x)
    [r] = session.report.regions
    assert r.status == "compiled" and r.executor == "dynamo", r
    assert any("cannot be handed to a build process" in d for d in r.declined), r
    assert rel_l2(out, _eager(model.core, x)) < 1e-5


def test_a_failed_build_keeps_eager_results_and_says_so_once(on, monkeypatch, logs):
    job = _Job(running=2, end="failed")
    monkeypatch.setattr(background, "start", lambda *a, **k: job)
    model = TinyModel()
    xs = [torch.randn(4, 8) for _ in range(5)]
    with CompileSession(model, regions=["core"]) as session:
        with torch.no_grad():
            outs = [model.core(x) for x in xs]
    for x, out in zip(xs, outs):
        assert torch.equal(out, _eager(model.core, x))  # bitwise: eager ran
    [r] = session.report.regions
    assert r.status == "eager" and "boom" in r.reason, r
    assert r.eager_calls >= 2 and r.compiled_ms is None  # no probe of eager vs eager
    assert not messages(logs, "WARNING")
    summary = [m for m in messages(logs, "INFO") if "boom" in m]
    assert len(summary) == 1, messages(logs, "INFO")


def test_a_build_still_running_at_the_end_is_reported(on, monkeypatch, logs):
    job = _Job(running=100, end="built")
    monkeypatch.setattr(background, "start", lambda *a, **k: job)
    model = TinyModel()
    x = torch.randn(4, 8)
    with CompileSession(model, regions=["core"]) as session:
        with torch.no_grad():
            outs = [model.core(x) for _ in range(6)]
    assert all(torch.equal(o, _eager(model.core, x)) for o in outs)
    [r] = session.report.regions
    assert r.status == "building" and r.executor == "background", r
    assert r.compiled_ms is None
    text = session.report.summary()
    assert "ran eagerly, 6 calls" in text and "still building" in text, text
    assert not messages(logs, "WARNING")
    # The next session over the same model takes the job over.
    assert resident.kept_count() == 1


def test_a_real_build_switches_at_a_step_boundary(on, logs):
    model = TinyModel()
    x = torch.randn(4, 8)
    ref = _eager(model.core, x)
    with CompileSession(model, regions=["core"], probe=False) as session:
        with torch.no_grad():
            first = model.core(x)
            jobs = background.wait(timeout=600)
            second = model.core(x)
            third = model.core(x)
    assert torch.equal(first, ref)  # eager, at once
    assert [j.poll() for j in jobs] == ["built"], [j.describe() for j in jobs]
    [r] = session.report.regions
    assert r.status == "compiled" and r.executor == "background", r
    assert "compiled from step 2" in r.background, r.background
    assert r.phases["switch"] > 0 and r.phases["background_start"] >= 0
    assert rel_l2(second, ref) < 1e-5 and rel_l2(third, ref) < 1e-5
    assert not messages(logs, "WARNING")
    # A later session in this process runs it from its first call ...
    with CompileSession(model, regions=["core"], probe=False) as again:
        with torch.no_grad():
            assert rel_l2(model.core(x), ref) < 1e-5
    assert again.report.regions[0].reused is not None
    # ... and a new process finds the artifact in the cache.
    resident.release()
    with CompileSession(model, regions=["core"], probe=False) as fresh:
        with torch.no_grad():
            assert rel_l2(model.core(x), ref) < 1e-5
    [r] = fresh.report.regions
    assert r.status == "compiled" and r.executor == "aot", r


def test_the_executor_declines_where_it_cannot_build(monkeypatch, tmp_path):
    from earth2studio_compile.executors import Target
    from earth2studio_compile.report import RegionReport

    cpu = torch.device("cpu")
    target = Target.resolve(
        TinyCore(),
        owner="tiny_cores.TinyModel",
        region="core",
        device=cpu,
        precision=None,
        report=RegionReport("Tiny", "core"),
        artifacts=tmp_path / "artifacts",
    )
    monkeypatch.setenv(background.ENV, "off")
    assert "off on cpu" in BackgroundExecutor.build(target)
    monkeypatch.setenv(background.ENV, "on")
    assert isinstance(BackgroundExecutor.build(target), BackgroundExecutor)
    assert "opaque" in BackgroundExecutor.build(
        dataclasses.replace(target, opaque=True)
    )
    assert "cache is off" in BackgroundExecutor.build(
        dataclasses.replace(target, artifacts=None)
    )


def test_the_build_process_refuses_a_key_the_forecast_would_not_find(tmp_path):
    """Parent and child must agree on the key (global TF32 flags are part of it
    with precision None): a child that computes another one says so and builds
    nothing."""
    from earth2studio_compile.artifacts.key import RegionTarget
    from earth2studio_compile.precision import tf32_enabled

    target = RegionTarget.resolve(
        TinyCore(),
        owner="tiny_cores.TinyModel",
        region="core",
        device=torch.device("cpu"),
        precision=None,
    )
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


def test_the_core_is_copied_off_the_callers_step(on, monkeypatch):
    """The copy of the weights (300 MB for FCN) is the thread's, not the step's."""
    import threading

    seen: list[str] = []
    real = background.snapshot_module

    def spy(module):
        seen.append(threading.current_thread().name)
        return real(module)

    monkeypatch.setattr(background, "snapshot_module", spy)
    monkeypatch.setattr(background, "_CHILD", "import sys; sys.exit(3)")
    model = TinyModel()
    with CompileSession(model, regions=["core"], probe=False):
        with torch.no_grad():
            model.core(torch.randn(4, 8))
    jobs = background.wait(timeout=60)
    assert seen and "MainThread" not in seen, seen
    assert jobs[-1].poll() == "failed" and "code 3" in jobs[-1].reason


def test_a_short_run_launches_its_build_when_the_session_closes(on, monkeypatch):
    """Shorter than LAUNCH_AFTER_S: the build does not share the machine with the
    forecast; it starts as the session ends (for the next run)."""
    from earth2studio_compile.executors import background as executor

    job = _Job(running=100, end="built", waiting=True)
    made = []
    monkeypatch.setattr(background, "start", lambda *a, **k: made.append(k) or job)
    model = TinyModel()
    with CompileSession(model, regions=["core"]) as session:
        with torch.no_grad():
            for _ in range(4):
                model.core(torch.randn(4, 8))
        assert job.waiting and [k["launch"] for k in made] == [False]
    assert not job.waiting and len(job.launches) == 1
    assert session.report.regions[0].status == "building"
    # A run past LAUNCH_AFTER_S launches it at the next call.
    resident.release()
    job = _Job(running=100, end="built", waiting=True)
    monkeypatch.setattr(executor, "LAUNCH_AFTER_S", 0.0)
    with CompileSession(model, regions=["core"]):
        with torch.no_grad():
            model.core(torch.randn(4, 8))
            assert job.waiting
            model.core(torch.randn(4, 8))
            assert not job.waiting


def test_old_job_directories_are_swept(tmp_path):
    """A killed build process leaves its input (a copy of the weights): job
    directories older than a day go when the next job starts."""
    import os
    import time

    old, new = tmp_path / "old", tmp_path / "new"
    for d in (old, new):
        d.mkdir()
        (d / "job.pt").write_bytes(b"weights")
    day_ago = time.time() - background.STALE_S - 60
    os.utime(old, (day_ago, day_ago))
    assert background.sweep(tmp_path) == 1
    assert not old.exists() and (new / "job.pt").exists()


def test_no_build_lock_compiles_on_the_first_call(on, monkeypatch):
    """Where the file system has no flock, two processes could build the same
    artifact at once: no background build then, and no fallback either."""

    class NoFlock:
        def acquire(self, timeout=None):
            raise OSError("flock not supported")

    monkeypatch.setattr(background, "file_lock", lambda path: NoFlock())
    model = TinyModel()
    x = torch.randn(4, 8)
    with CompileSession(model, regions=["core"], probe=False) as session:
        with torch.no_grad():
            out = model.core(x)
    [r] = session.report.regions
    assert r.status == "compiled" and r.executor == "dynamo", r
    assert any("no build lock" in d for d in r.declined), r.declined
    assert rel_l2(out, _eager(model.core, x)) < 1e-5
