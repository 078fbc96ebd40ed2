"""The background executor (earth2studio_compile.executors.background): eager
steps at once while the region's artifact is built in a child process, the switch
to it at a step boundary, eager results and one message when the build fails, a
short run's build launched as the session closes, and where it declines.

Background builds are on by default only on CUDA; these tests turn them on for
the CPU (the ``background_on`` fixture). One real build of a two-layer core (a
child process: import, export, AOTInductor; 20-60 s on 2 cores); the other tests
replace the build process with a stand-in job.
"""

from __future__ import annotations

import dataclasses

import torch
from conftest import messages
from tiny_cores import TinyCore, TinyModel

from earth2studio_compile import CompileSession, resident
from earth2studio_compile.artifacts import background
from earth2studio_compile.executors import BackgroundExecutor
from earth2studio_compile.metrics import rel_l2


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


def test_a_failed_build_keeps_eager_results_and_says_so_once(
    background_on, monkeypatch, logs
):
    from earth2studio_compile.executors import background as executor

    monkeypatch.setattr(executor, "LOOK_EVERY_S", 0.0)  # a look at every call
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


def test_a_build_still_running_at_the_end_is_reported(background_on, monkeypatch, logs):
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


def test_a_real_build_switches_at_a_step_boundary(background_on, logs):
    model = TinyModel()
    x = torch.randn(4, 8)
    ref = _eager(model.core, x)
    with CompileSession(model, regions=["core"], probe=False) as session:
        with torch.no_grad():
            first = model.core(x)
            # This test's jobs: the list holds every job the process started.
            jobs = [
                j
                for j in background.wait(timeout=600)
                if j.artifact.is_relative_to(background_on)
            ]
            second = model.core(x)
            third = model.core(x)
    assert torch.equal(first, ref)  # eager, at once
    assert [j.poll() for j in jobs] == ["built"], [j.describe() for j in jobs]
    [r] = session.report.regions
    assert r.status == "compiled" and r.executor == "background", r
    assert "compiled from step 2" in r.background, r.background
    # The build process verified its artifact and sealed it: the switch did not
    # call eager again.
    assert "in an earlier process" in r.background, r.background
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


def test_a_short_run_launches_its_build_when_the_session_closes(
    background_on, monkeypatch
):
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


def test_a_running_forecast_launches_one_build_at_a_time(background_on, monkeypatch):
    """Two regions past LAUNCH_AFTER_S: the second build waits while the first runs
    (each launch copies a core and starts a process: Aurora's six at once slowed
    its call), and launches as the session closes."""
    from tiny_cores import Blocks

    from earth2studio_compile.artifacts import build_job
    from earth2studio_compile.executors import background as executor

    background.cancel()  # no build of an earlier test counts as running here
    monkeypatch.setattr(build_job, "CHILD", "import time; time.sleep(120)")
    monkeypatch.setattr(executor, "LAUNCH_AFTER_S", 0.0)
    made = []
    start = background.start
    monkeypatch.setattr(
        background, "start", lambda *a, **k: made.append(start(*a, **k)) or made[-1]
    )
    model = Blocks(n=2)
    try:
        with CompileSession(model, regions=["blocks.0", "blocks.1"], probe=False):
            for _ in range(3):
                model.run_each()
            assert [j.waiting for j in made] == [False, True]
            assert background.building_here()
        assert [j.waiting for j in made] == [False, False]
    finally:
        background.cancel()
    assert not background.building_here()


def test_a_core_an_earlier_build_refused_goes_to_the_dynamo_path_without_a_build(
    background_on, monkeypatch, logs
):
    """An earlier process's build of the same key was refused (DLESyM's atmosphere
    decoder: 185 s on an H200, then refused, in every process): no build starts
    again, and the Dynamo path takes the region, as one no artifact can serve.
    Regression: it stayed eager for good, with a WARNING, in every later process
    (AIFS2ENS's processor and DLESyM's decoder were never compiled on a GPU);
    the Dynamo path's payoff gate decides where the workflow told its steps."""
    from earth2studio_compile.artifacts import refused
    from earth2studio_compile.artifacts.aot_key import aot_root

    started = []
    job = _Job(running=100, end="built")
    monkeypatch.setattr(background, "start", lambda *a, **k: started.append(k) or job)
    model = TinyModel()
    x = torch.randn(4, 8)
    with CompileSession(model, regions=["core"]) as first:
        with torch.no_grad():
            model.core(x)
    assert len(started) == 1  # no record yet: the build starts
    key = started[0]["key"]
    refused.remember(aot_root(background_on), key, "it updates its buffers in place")
    started.clear()
    resident.release()
    with CompileSession(model, regions=["core"]) as session:
        with torch.no_grad():
            outs = [model.core(x) for _ in range(3)]
    assert not started
    assert all(torch.equal(o, _eager(model.core, x)) for o in outs)
    [r] = session.report.regions
    assert r.status == "compiled" and r.executor == "dynamo", r
    [declined] = [d for d in r.declined if d.startswith("background")]
    assert "no ahead-of-time artifact can be built" in declined, r.declined
    assert "updates its buffers in place" in declined, r.declined
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")
    assert first.report.regions[0].executor == "background"


def test_a_running_build_is_looked_at_twice_a_second_not_at_every_call(
    background_on, monkeypatch
):
    """A look at another process's build takes its file lock: DLESyM calls its
    regions 520 times in a 20-step call. Within LOOK_EVERY_S the calls run
    eagerly on what the last look said."""
    from earth2studio_compile.executors import background as executor

    job = _Job(running=1000, end="built")
    monkeypatch.setattr(background, "start", lambda *a, **k: job)
    monkeypatch.setattr(executor, "LOOK_EVERY_S", 3600.0)
    model = TinyModel()
    x = torch.randn(4, 8)
    with CompileSession(model, regions=["core"]) as session:
        with torch.no_grad():
            outs = [model.core(x) for _ in range(20)]
    assert all(torch.equal(o, _eager(model.core, x)) for o in outs)
    assert job.polls <= 3, job.polls  # one look, its description, the close
    [r] = session.report.regions
    assert r.status == "building" and "still building" in r.background, r
