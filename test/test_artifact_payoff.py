"""Whether a first call loads its region's ahead-of-time artifact at all: what
loading it, its first run and recording its CUDA graph cost against what its calls
save within the session's steps (earth2studio_compile.artifacts.payoff, kept by
build() and by each session that ran the artifact; asked by payoff_gate).

FCN3 at its published size on an H200 (docs/bench/2026-12-02-h200-fortyeighth):
ten processor-block artifacts each saved 1 ms of 88 a call and cost 0.11 s to get
ready, and a 20-step ``compile=True`` call took 23.01 s against eager's 21.79."""

from __future__ import annotations

import shutil

import pytest
import torch

from earth2studio_compile import CompileSession, resident
from earth2studio_compile.artifacts import payoff
from earth2studio_compile.executors import aot as aot_executor


@pytest.fixture
def root(built, tmp_path, monkeypatch):
    """A copy of the built cache: the figures a test writes reach no other test."""
    copy = tmp_path / "cache"
    shutil.copytree(built.root, copy)
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(copy))
    resident.release()  # as a new process: no compiled code kept
    yield copy
    resident.release()


@pytest.fixture
def loads(monkeypatch):
    """One entry per artifact the executor loads."""
    loaded: list = []
    real = aot_executor.load_runner

    def counted(*args, **kwargs):
        loaded.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(aot_executor, "load_runner", counted)
    return loaded


def kept_at(root):
    """The one region's artifact figures under ``root``."""
    [path] = (root / "aot" / "payoff").glob("artifact-*.json")
    return path


def forecast(built, steps, calls):
    """``calls`` calls of the core in a fp32 session told ``steps`` steps."""
    with CompileSession(built.model, precision="fp32") as session:
        session.expect(steps)
        with torch.no_grad():
            for _ in range(calls):
                built.core(*built.args)
    [r] = session.report.regions
    return r


def test_build_keeps_what_its_artifact_costs_to_get_ready(root, built):
    """build() times the artifact as a region would, its load and first run
    included, and keeps what that costs beyond eager's calls at one call a step
    (no workflow has said how many yet)."""
    from earth2studio_compile import build

    path = kept_at(root)
    path.unlink()  # as after the first build: no workflow's calls per step
    build(built.model, precision="fp32")
    kept = payoff.recall(path)
    assert kept is not None
    assert kept.calls_per_step == 1.0
    assert kept.cost_s >= 0.0


def test_an_artifact_that_cannot_pay_within_the_steps_runs_eagerly(built, root, loads):
    """Figures that say the artifact costs more to get ready than its calls save
    within the session's steps: the region runs eagerly from its first call and
    never loads it (regression: it loaded the artifact and recorded its CUDA graph
    in every call, whatever the steps); told enough steps, it runs the artifact."""
    path = kept_at(root)
    payoff.keep(path, payoff.Payoff(0.5, 10.0, 1.0), "core")
    r = forecast(built, steps=3, calls=3)
    assert (r.status, r.executor, loads) == ("eager", None, []), r
    assert "compiling would not pay for itself in this call" in r.reason
    assert payoff.ARTIFACT_COST in r.reason
    assert r.phases["payoff"] >= 0.0 and r.first_call_seconds is None, r.phases

    resident.release()
    r = forecast(built, steps=10**6, calls=3)
    assert (r.status, r.executor) == ("compiled", "aot"), r
    assert loads


def test_a_session_that_ran_its_artifact_keeps_its_calls_per_step(built, root):
    """A session that ran the artifact keeps what it saved and cost at the
    session's own calls per step, for a later process's first call."""
    path = kept_at(root)
    path.unlink()
    r = forecast(built, steps=2, calls=4)
    assert (r.status, r.executor) == ("compiled", "aot"), r
    kept = payoff.recall(path)
    assert kept is not None
    assert kept.calls_per_step == 2.0
    assert kept.saved_ms == pytest.approx(r.eager_ms - r.compiled_ms)


def test_no_first_call_ahead_loads_an_artifact_that_cannot_pay(built, root, loads):
    """The first call ahead (the artifact loaded while the workflow fetches its
    data) asks the same figures: it loads nothing that the workflow's first call
    would not run, and that call runs the region eagerly."""
    payoff.keep(kept_at(root), payoff.Payoff(0.5, 10.0, 1.0), "core")
    with CompileSession(built.model) as session:
        session.expect(3)
        session.ahead(wait=True)
        assert not loads
        with torch.no_grad():
            built.core(*built.args)
    [r] = session.report.regions
    assert (r.status, r.executor, loads) == ("eager", None, []), r
    assert payoff.ARTIFACT_COST in r.reason


def test_build_says_from_how_many_steps_its_artifact_pays(root, built):
    """build()'s result (printed by tools.build) says what the artifact saves a
    call, what getting it ready costs and from how many steps compile=True runs
    it: the figures it keeps for the first call of a forecast."""
    from earth2studio_compile import build

    [again] = build(built.model, precision="fp32")  # present: timed and kept again
    kept = payoff.recall(kept_at(root))
    assert again.status == "present" and again.payoff is not None, again
    assert again.payoff.endswith(kept.verdict())
    assert f"{kept.saved_ms:.2f} ms saved a call" in again.payoff
