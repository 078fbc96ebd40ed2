"""A Dynamo-path region's compile judged off the forecast's path
(earth2studio_compile.artifacts.judge): when a first call may leave the region
eager for a judge, and the waiting job a session's end launches."""

from __future__ import annotations

import json

import torch
from aot_helpers import tiny_target
from tiny_cores import TinyCore

from earth2studio_compile.artifacts import background, judge
from earth2studio_compile.artifacts.build_process import RESULT
from earth2studio_compile.artifacts.store import file_lock


def test_no_judge_without_a_cache_or_background_processes(monkeypatch, tmp_path):
    target = tiny_target(TinyCore())
    monkeypatch.setenv(background.ENV, "off")
    assert judge.unjudged(target, tmp_path) is None  # compiles to find out
    monkeypatch.setenv(background.ENV, "on")
    assert judge.unjudged(target, None) is None
    assert "background process" in judge.unjudged(target, tmp_path)


def test_a_prepared_judge_waits_for_its_calls_per_step(monkeypatch, tmp_path):
    background.cancel()
    target = tiny_target(TinyCore())
    figures = tmp_path / "aot" / "payoff" / "f.json"
    session = {"spec": None, "options": None, "inference": True}
    job = judge.prepare(target, (torch.randn(4, 8),), {}, tmp_path, figures, session)
    assert isinstance(job, judge.JudgeJob) and job.waiting, job
    job.set_calls_per_step(2.0)
    assert job._payload["calls_per_step"] == 2.0
    assert job._payload["calls"] == judge.JUDGE_CALLS
    # One judge per figures file: this process's own, not launched yet ...
    assert (
        judge.prepare(target, (torch.randn(4, 8),), {}, tmp_path, figures, session)
        == judge.BUSY
    )
    # ... and another process holding its lock.
    assert job in background.cancel()  # tracked: wait() and cancel() take it
    lock = file_lock(judge.judge_lock(figures))
    with lock:
        again = judge.prepare(
            target, (torch.randn(4, 8),), {}, tmp_path, figures, session
        )
    assert again == judge.BUSY
    assert job.poll() == "failed" and not job.waiting  # never launched


def test_a_judge_is_done_when_its_figures_are_there(tmp_path):
    figures = tmp_path / "f.json"
    job = judge.JudgeJob("M.core", figures, tmp_path)
    (tmp_path / RESULT).write_text(json.dumps({"ok": True}))
    assert job._read_result() == "failed"  # ok, but no figures file
    job = judge.JudgeJob("M.core", figures, tmp_path)
    figures.write_text("{}")
    assert job._read_result() == "built"
    assert "judged in the background" in job.describe()
