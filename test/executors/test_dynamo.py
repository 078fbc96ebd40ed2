"""The Dynamo executor: CUDA graph trees are its own, so it marks their steps."""

from __future__ import annotations

import pytest
import torch
from conftest import eager_backend

from earth2studio_compile import CompileSession, executors
from earth2studio_compile.executors import DynamoExecutor, EagerExecutor, Measured
from earth2studio_compile.tools import zoo


@pytest.fixture
def marks(monkeypatch):
    """Each CUDA-graph-tree step mark."""
    made: list[int] = []
    monkeypatch.setattr(
        torch.compiler, "cudagraph_mark_step_begin", lambda: made.append(1)
    )
    return made


def _inputs(n=4):
    torch.manual_seed(0)
    return [torch.randn(2, 4, 16, 32) for _ in range(n)]


def _run(model, inputs):
    with CompileSession(model, backend=eager_backend) as session, torch.no_grad():
        outs = [model.model(x) for x in inputs]
    return session.report.regions[0], outs


def test_dynamo_on_cuda_graphs_marks_every_call(monkeypatch, marks):
    real_init, real_first = DynamoExecutor.__init__, DynamoExecutor.first_call
    real_call = DynamoExecutor.__call__
    ran: list[str] = []

    def with_graphs(self, target):
        real_init(self, target)
        self.cudagraphs = True  # graph trees need CUDA; the marks do not

    def first_call(self, args, kwargs, laps):
        ran.append("first")
        return real_first(self, args, kwargs, laps)

    def call(self, *args, **kwargs):
        ran.append("later")
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(DynamoExecutor, "__init__", with_graphs)
    monkeypatch.setattr(DynamoExecutor, "first_call", first_call)
    monkeypatch.setattr(DynamoExecutor, "__call__", call)
    region, _ = _run(zoo.build("toy"), _inputs())
    assert region.status == "compiled" and region.executor == "dynamo"
    # Every call Dynamo ran is a new step (the speed probe's eager call is not).
    assert ran[0] == "first" and len(ran) >= 3
    assert len(marks) == len(ran)


class _OwnGraph:
    """An executor that records CUDA graphs of its own (as an ahead-of-time
    runner does): outputs are overwritten by the next replay, no graph trees."""

    name = "aot"
    cudagraphs = True
    source = None
    not_compiled = None
    keepable = False
    compiling = False

    def __init__(self, target):
        self.eager = EagerExecutor(target.module)
        self.measured = Measured()

    def first_call(self, args, kwargs, laps):
        out = self(*args, **kwargs)
        laps.lap("first_run")
        return out

    def __call__(self, *args, **kwargs):
        return self.eager(*args, **kwargs)

    def detach(self):
        pass

    def release(self):
        pass


def test_an_executor_with_its_own_cuda_graph_is_not_marked(monkeypatch, marks):
    # Marking imports Inductor's graph trees: 27-35 ms of a fresh process's
    # first step on an H100 host, for nothing on the ahead-of-time path.
    monkeypatch.setattr(executors, "CANDIDATES", [_OwnGraph])
    model = zoo.build("toy")
    inputs = _inputs()
    with torch.no_grad():
        expected = [model.model(x) for x in inputs]
    region, outs = _run(model, inputs)
    assert region.status == "compiled" and region.calls == 4
    assert marks == []
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
