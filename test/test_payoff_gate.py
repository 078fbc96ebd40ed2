"""Whether a Dynamo-path first call compiles (earth2studio_compile.payoff_gate):
eager while a judge finds the figures, its judge launched only with the calls per
step known, and ``probe=False`` compiling as before."""

from __future__ import annotations

import pytest
import torch

from earth2studio_compile import CompileSession, example_input
from earth2studio_compile.artifacts import background, judge
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
