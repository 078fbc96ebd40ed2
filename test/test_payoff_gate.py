"""Whether a Dynamo-path first call compiles (earth2studio_compile.payoff_gate):
eager while a judge finds the figures, its judge launched only with the calls per
step known, and ``probe=False`` compiling as before."""

from __future__ import annotations

import pytest
import torch
from conftest import messages

from earth2studio_compile import CompileSession, example_input, resident
from earth2studio_compile.artifacts import background, judge, payoff
from earth2studio_compile.tools import zoo


def test_an_interrupted_session_drops_its_judge(background_on, monkeypatch):
    """The calls per step are not known when a session ends in an exception: its
    judge is never launched (its figures would be wrong)."""
    background.cancel()
    model = zoo.build("sfno")
    x, coords = example_input(model)
    launched = []
    monkeypatch.setattr(background, "launch_later", launched.append)
    with pytest.raises(KeyboardInterrupt):
        with CompileSession(model) as session:
            session.expect(3)
            with torch.no_grad():
                model(x, coords)  # eager, a judge prepared
                monkeypatch.setattr(
                    model.model,
                    "forward",
                    lambda *a: (_ for _ in ()).throw(KeyboardInterrupt),
                )
                model(x, coords)
    [r] = session.report.regions
    assert r.status == "eager" and "no figures yet" in r.reason, r
    assert not launched
    jobs = [
        j
        for j in background.cancel()
        if isinstance(j, judge.JudgeJob) and j.artifact.is_relative_to(background_on)
    ]
    assert [j.reason for j in jobs] == ["cancelled before it was launched"]


def test_without_the_probe_a_region_compiles_with_no_figures(background_on):
    model = zoo.build("sfno")
    x, coords = example_input(model)
    with CompileSession(model, probe=False) as session:
        session.expect(3)
        with torch.no_grad():
            model(x, coords)
    [r] = session.report.regions
    assert (r.status, r.executor) == ("compiled", "dynamo"), r


def test_a_region_whose_judge_failed_runs_eagerly_without_another(
    background_on, monkeypatch, logs
):
    """A judge that kept no figures says why (judge_process): a later process runs
    the region eagerly with one WARNING, and launches no judge to the same end
    (before, each process judged it again)."""
    model = zoo.build("sfno")
    x, coords = example_input(model)
    launched: list = []
    monkeypatch.setattr(background, "launch_later", launched.append)
    with CompileSession(model) as first:
        first.expect(3)
        with torch.no_grad():
            model(x, coords)
    [job] = launched
    job.cancel()
    payoff.keep_failure(job.artifact, "BackendCompilerFailed: no backend", "core")
    resident.release()
    with CompileSession(model) as later:
        later.expect(3)
        with torch.no_grad():
            model(x, coords)
    [r] = later.report.regions
    assert r.status == "eager" and r.executor is None, r
    assert "an earlier process's judge could not" in r.reason, r.reason
    assert "no backend" in r.reason
    assert len(messages(logs, "WARNING")) == 1
    assert launched == [job]
