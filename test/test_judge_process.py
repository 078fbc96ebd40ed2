"""A judge's own process (earth2studio_compile.judge_process), end to end: a
cache's first process runs a Dynamo-path region eagerly, its judge compiles and
times the core in a child process, and the next process decides from the figures
it kept. One real child (imports, two compiles of the small SFNO: 30-90 s on 2
cores)."""

from __future__ import annotations

import torch
from aot_helpers import tiny_target
from tiny_cores import TinyCore

from earth2studio_compile import (
    CompileSession,
    example_input,
    judge_process,
    resident,
)
from earth2studio_compile.artifacts import background, judge, payoff
from earth2studio_compile.artifacts.store import file_lock
from earth2studio_compile.models import MODEL_TABLE
from earth2studio_compile.options import CompileOptions
from earth2studio_compile.spec import ModelSpec
from earth2studio_compile.tools import zoo


def no_backend(gm, example_inputs):
    """A compiler that fails (module level: a judge's payload is pickled)."""
    raise RuntimeError("no backend here")


def test_a_judge_whose_compile_fails_keeps_why(monkeypatch, tmp_path):
    """Its figures never come: without the record, every later process ran the
    region eagerly and launched the same judge again."""
    holder = f"{judge_process.Holder.__module__}.{judge_process.Holder.__qualname__}"
    monkeypatch.setitem(MODEL_TABLE, holder, ModelSpec(regions=("core",)))
    monkeypatch.setenv(background.ENV, "on")  # as on CUDA: the judge compiles here
    figures = tmp_path / "aot" / "payoff" / "f.json"
    session = {
        "spec": ModelSpec(regions=("core",)),
        "options": CompileOptions(backend=no_backend),
        "inference": True,
    }
    target = tiny_target(TinyCore())
    job = judge.prepare(target, (torch.randn(4, 8),), {}, tmp_path, figures, session)
    assert isinstance(job, judge.JudgeJob), job
    payload = job._payload | {"calls_per_step": 1.0}
    job.cancel()
    result = judge_process.judge(payload)
    assert not result["ok"], result
    assert payoff.recall(figures) is None
    assert "no backend here" in (payoff.recall_failure(figures) or ""), result


def eager_backend(gm, example_inputs):
    """A compiler that runs the graph as traced (module level: pickled)."""
    return gm.forward


def test_a_judge_calls_the_core_under_the_autocast_its_model_called_it_in(
    monkeypatch, tmp_path
):
    """AIFS's wrapper calls its processor under bfloat16 autocast, with bf16
    inputs: a judge that called the core without it computed bf16 inputs against
    fp32 weights ("mat1 and mat2 must have the same dtype") and kept no figures,
    and its session's target (read at its first call) had other keys than the
    forecast's. Its calls now run under the target's autocast."""
    import dataclasses

    holder = f"{judge_process.Holder.__module__}.{judge_process.Holder.__qualname__}"
    monkeypatch.setitem(MODEL_TABLE, holder, ModelSpec(regions=("core",)))
    monkeypatch.setenv(background.ENV, "on")
    figures = tmp_path / "aot" / "payoff" / "f.json"
    session = {
        "spec": ModelSpec(regions=("core",)),
        "options": CompileOptions(backend=eager_backend),
        "inference": True,
    }
    target = dataclasses.replace(tiny_target(TinyCore()), autocast="bfloat16")
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    job = judge.prepare(target, (x,), {}, tmp_path, figures, session)
    assert isinstance(job, judge.JudgeJob), job
    payload = job._payload | {"calls_per_step": 1.0}
    job.cancel()
    result = judge_process.judge(payload)
    assert payoff.recall_failure(figures) is None, result
    assert result["ok"], result


def test_a_first_process_runs_eagerly_and_its_judge_keeps_the_next_ones_figures(
    background_on, logs
):
    background.cancel()
    model = zoo.build("sfno")  # opaque spectral convolutions: the Dynamo path
    x, coords = example_input(model)
    with CompileSession(model) as first:
        first.expect(3)
        with torch.no_grad():
            outs = [model(x, coords)[0] for _ in range(3)]
    [r] = first.report.regions
    assert r.status == "eager" and r.executor is None, r
    assert "no figures yet" in r.reason, r.reason
    with torch.no_grad():
        assert torch.equal(outs[-1], model(x, coords)[0])  # eager: bitwise
    # This test's jobs: the list holds every job the process started.
    jobs = [
        j
        for j in background.wait(timeout=600)
        if isinstance(j, judge.JudgeJob) and j.artifact.is_relative_to(background_on)
    ]
    assert [j.poll() for j in jobs] == ["built"], [
        j.describe() + "\n" + j.log_tail(40) for j in jobs
    ]
    figures = payoff.recall(jobs[0].artifact)
    assert figures is not None and figures.calls_per_step == 1.0, figures
    assert figures.cost_s > 0
    # A later process: its first call decides from the judge's figures.
    resident.release()
    known = background.cancel()
    with CompileSession(model) as later:
        later.expect(1)
        with torch.no_grad():
            model(x, coords)
    [r] = later.report.regions
    assert r.status == "eager" and r.executor is None, r
    assert "compiling would not pay for itself in this call" in r.reason, r.reason
    assert not [j for j in background.cancel() if j not in known]  # no judge again
    # While another process judges it (no figures yet), eager too: no compile.
    jobs[0].artifact.unlink()
    resident.release()
    with file_lock(judge.judge_lock(jobs[0].artifact)):
        with CompileSession(model) as busy:
            busy.expect(1)
            with torch.no_grad():
                model(x, coords)
    [r] = busy.report.regions
    assert r.status == "eager" and judge.BUSY in r.reason, r
    assert not [j for j in background.cancel() if j not in known]
