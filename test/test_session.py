"""CompileSession: in-place compile, exact restore, fallback, storm and break detection.

Faults are injected where they really happen: in the compiler backend (a ``raise``
inside traced code would only be a graph break, run eagerly by Dynamo).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import FailingBackend, assert_unchanged, eager_backend, messages, snapshot

from earth2studio_compile import CompileSession
from earth2studio_compile.tools import zoo


def toy_core() -> torch.nn.Module:
    return zoo.ToyCore(4, 8).eval()


def test_compiles_in_place_and_restores_exactly(logs):
    model = zoo.build("toy")
    before = snapshot(model)
    x = torch.randn(2, 4, 16, 32)
    with torch.no_grad():
        expected = model.model(x)
    with CompileSession(model) as session:
        assert "_compiled_call_impl" in model.model.__dict__
        assert list(model.state_dict()) == list(before["state"])  # keys never change
        with torch.no_grad():
            out = model.model(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert_unchanged(model, before)
    region = session.report.regions[0]
    assert (region.model, region.region, region.status) == (
        "GridPrognostic",
        "model",
        "compiled",
    )
    assert region.graphs == 1 and region.graph_breaks == 0 and region.calls == 1
    assert region.compile_seconds > 0
    infos = messages(logs, "INFO")
    assert any(
        m.startswith("torch.compile: GridPrognostic.model: compiled") for m in infos
    )
    # after the session, calls are plain eager calls again
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        model.model(torch.randn(3, 4, 16, 32))
    assert counters["stats"]["unique_graphs"] == graphs


def test_backend_failure_at_first_call_falls_back(logs):
    core = toy_core()
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        expected = core(x)
    backend = FailingBackend(ok=0)
    with CompileSession(core, regions=("net",), backend=backend) as session:
        with torch.no_grad():
            first = core.net(x)
            second = core.net(x)
    assert torch.equal(first, core.net(x)) and torch.equal(second, first)
    torch.testing.assert_close(core(x), expected)
    region = session.report.regions[0]
    assert region.status == "eager" and region.eager_calls == 2
    assert "injected compiler failure" in region.reason
    assert backend.calls == 1  # no second attempt once fallen back
    warnings = messages(logs, "WARNING")
    assert len(warnings) == 1
    assert "ToyCore.net" in warnings[0] and "at its first call" in warnings[0]
    assert "injected compiler failure" in warnings[0] and "TORCH_LOGS" in warnings[0]


def test_backend_failure_at_a_later_recompile_falls_back(logs):
    core = toy_core()
    # The ensemble case: batches of 2, then a smaller last batch of 1.
    inputs = [torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8), torch.randn(1, 4, 8, 8)]
    with torch.no_grad():
        expected = [core(x) for x in inputs]
    with CompileSession(
        core, regions=("net",), backend=FailingBackend(ok=1)
    ) as session:
        with torch.no_grad():
            outs = [core(x) for x in inputs]
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(out, ref)
    region = session.report.regions[0]
    assert region.status == "eager" and region.calls == 3 and region.eager_calls == 1
    warnings = messages(logs, "WARNING")
    assert len(warnings) == 1 and "at call 3" in warnings[0]


def test_recompile_storm_is_detected(logs):
    core = toy_core()
    import torch._dynamo.config as dynamo_config

    shapes = [(1, 4, 8, 8 + 2 * i) for i in range(6)]
    inputs = [torch.randn(*s) for s in shapes]
    with torch.no_grad():
        expected = [core(x) for x in inputs]
    with dynamo_config.patch(recompile_limit=3):
        with CompileSession(
            core, regions=("net",), backend=eager_backend, dynamic=False
        ) as s:
            with torch.no_grad():
                outs = [core(x) for x in inputs]
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(out, ref)
    region = s.report.regions[0]
    assert region.status == "eager" and "recompile storm" in region.reason
    assert region.recompiles == 2
    assert any("recompile storm" in w for w in messages(logs, "WARNING"))


def test_graph_break_inside_core_is_reported(logs):
    class Breaking(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            x = self.lin(x)
            torch._dynamo.graph_break()
            return torch.relu(x)

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.core = Breaking()

    model = Holder()
    x = torch.randn(4, 8)
    with CompileSession(model, backend=eager_backend) as session:
        out = model.core(x)
    torch.testing.assert_close(out, model.core(x))
    region = session.report.regions[0]
    assert (
        region.status == "compiled" and region.graph_breaks >= 1 and region.graphs >= 2
    )
    assert any("graph break" in w for w in messages(logs, "WARNING"))


def test_missing_cpp_compiler_falls_back_without_tracing(logs):
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    core = toy_core()
    x = torch.randn(1, 4, 8, 8)
    frames = counters["frames"]["total"]
    with inductor_config.patch({"cpp.cxx": ("/nonexistent/g++",)}):
        with CompileSession(core, regions=("net",)) as session:
            with torch.no_grad():
                out = core(x)
    torch.testing.assert_close(out, core(x))
    assert counters["frames"]["total"] == frames  # nothing was traced
    region = session.report.regions[0]
    assert region.status == "eager" and "C++ compiler" in region.reason
    assert len(messages(logs, "WARNING")) == 1


def test_error_that_eager_also_raises_is_the_callers(logs):
    core = toy_core()
    with CompileSession(core, regions=("net",), backend=eager_backend) as session:
        with pytest.raises(RuntimeError):
            core(torch.randn(1, 3, 8, 8))  # wrong channel count: a user error
        with torch.no_grad():
            core(torch.randn(1, 4, 8, 8))
    region = session.report.regions[0]
    assert region.status == "compiled"  # the compiler was not at fault
    assert not messages(logs, "WARNING")


def test_smaller_batch_is_padded_not_recompiled():
    model = zoo.build("fcn")
    core = model.model
    big, small = torch.randn(2, 26, 16, 32), torch.randn(1, 26, 16, 32)
    with torch.no_grad():
        expected = core(small)
    with CompileSession(model, backend=eager_backend) as session:
        with torch.inference_mode():
            core(big)
            out = core(small)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    region = session.report.regions[0]
    assert region.padded_calls == 1 and region.recompiles == 0


def test_rollout_does_not_recompile_at_step_two():
    # The first input of a rollout is a normal tensor, later ones inference tensors.
    from collections import OrderedDict

    model = zoo.build("toy")
    coords = OrderedDict(
        {"time": np.array([np.datetime64("2024-01-01")])}
        | dict(list(model.input_coords().items())[1:])
    )
    x = torch.randn(*[len(v) for v in coords.values()])
    with CompileSession(model, backend=eager_backend) as session:
        for step, _ in enumerate(model.create_iterator(x, coords)):
            if step == 4:
                break
    region = session.report.regions[0]
    assert region.calls == 4 and region.recompiles == 0


def test_module_compiled_by_the_user_is_left_alone(logs):
    core = toy_core()
    core.net.compile(backend=eager_backend)
    mine = core.net.__dict__["_compiled_call_impl"]
    with CompileSession(core, regions=("net",)) as session:
        assert core.net.__dict__["_compiled_call_impl"] is mine
    assert core.net.__dict__["_compiled_call_impl"] is mine
    assert session.report.regions[0].status == "skipped"


def test_warns_when_compiled_is_slower_than_eager(logs):
    import time

    def slow_backend(gm, example_inputs):
        def run(*args):
            time.sleep(0.05)  # a compiled region that loses to eager
            return gm.forward(*args)

        return run

    model = zoo.build("toy")
    x = torch.randn(1, 4, 16, 32)
    with torch.no_grad():
        expected = model.model(x)
    with CompileSession(model, backend=slow_backend) as session, torch.no_grad():
        outs = [model.model(x) for _ in range(8)]
    region = session.report.regions[0]
    assert region.status == "compiled" and region.eager_calls == 0
    assert region.compiled_ms >= 50 and region.eager_ms < region.compiled_ms
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    slow = [m for m in messages(logs, "WARNING") if "runs slower compiled" in m]
    assert len(slow) == 1 and "compile=False" in slow[0]


def _probe_with(monkeypatch, seconds: list[float]):
    """A toy session of 8 calls whose probe reads ``seconds`` for calls 3 to 8
    (compiled and eager in turn) off an injected clock."""
    from earth2studio_compile.region import SpeedProbe

    now, durations, reads = [0.0], list(seconds), [0]

    def clock() -> float:
        reads[0] += 1
        if reads[0] % 2 == 0:  # each probe's second reading: its end
            now[0] += durations.pop(0)
        return now[0]

    monkeypatch.setattr(SpeedProbe, "clock", staticmethod(clock))
    model = zoo.build("toy")
    with CompileSession(model, backend=eager_backend) as session, torch.no_grad():
        for _ in range(8):
            model.model(torch.randn(1, 4, 16, 32))
    assert not durations
    return session.report


@pytest.mark.parametrize(
    "seconds, slower",
    [
        # One slow compiled call among noise: the ranges overlap.
        ([0.050, 0.010, 0.011, 0.012, 0.010, 0.011], False),
        # Every compiled call slower than every eager one.
        ([0.020, 0.010, 0.021, 0.012, 0.022, 0.011], True),
    ],
)
def test_speed_verdict_rests_on_interleaved_calls_and_their_ranges(
    monkeypatch, logs, seconds, slower
):
    report = _probe_with(monkeypatch, seconds)
    region = report.regions[0]
    assert region.compiled_ms == pytest.approx(1e3 * sorted(seconds[0::2])[1])
    assert region.eager_ms == pytest.approx(1e3 * sorted(seconds[1::2])[1])
    warned = [m for m in messages(logs, "WARNING") if "runs slower compiled" in m]
    assert len(warned) == int(slower)
    summary = report.summary()
    assert ("no measurable difference" in summary) is not slower
    assert f"({1e3 * min(seconds[0::2]):.2f}-{1e3 * max(seconds[0::2]):.2f})" in summary


def test_no_speed_verdict_in_short_sessions():
    model = zoo.build("toy")
    with CompileSession(model, backend=eager_backend) as session, torch.no_grad():
        for _ in range(5):
            model.model(torch.randn(1, 4, 16, 32))
    region = session.report.regions[0]
    assert region.compiled_ms is None and region.eager_ms is None
