"""The region: one core's calls and its report.

A region hooks one core; these tests drive it through :class:`CompileSession` and
the workflows and read its report (its first call: test_first_call.py; its
fallback: test_fallback.py). Most use a
backend that compiles nothing (Dynamo still traces, guards and recompiles), so they
cost no Inductor build. Tests marked in their comment as regressions failed before
their fix (see CHANGELOG.md, "Fixed"). The Dynamo executor's failures and storms are
tested in executors/test_executors_dynamo.py, the speed probe in test_probe.py.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from conftest import TIME, eager_backend, messages
from tiny_cores import StatefulCore

from earth2studio_compile import CompileSession, register_model
from earth2studio_compile.models import MODEL_TABLE
from earth2studio_compile.tools import zoo


def toy_core() -> torch.nn.Module:
    return zoo.ToyCore(4, 8).eval()


# -- padding, rollouts -------------------------------------------------------------


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


# -- regressions (issue 12): in-place updates, what "compiled" means -------------


# -- 1. in-place updates of positional arguments -------------------------------------
class StatefulPrognostic(zoo.GridPrognostic):
    def __init__(self) -> None:
        grid = zoo.Grid(8, 16)
        super().__init__(StatefulCore(2), ["a", "b"], grid)
        self.register_buffer("state", torch.zeros(1, 2, 8, 16))

    @torch.inference_mode()
    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return self.model(x.reshape(-1, *shape[-3:]), self.state).reshape(shape)


def _stateful_rollout(compile: bool) -> tuple[dict, torch.Tensor]:
    from earth2studio.io import KVBackend

    from earth2studio_compile import run

    torch.manual_seed(0)
    model = StatefulPrognostic().eval()
    np.random.seed(0)
    io = KVBackend()
    run.deterministic(
        TIME, 4, model, zoo.random_source(model), io, verbose=False, compile=compile
    )
    return {k: v.clone() for k, v in io.root.items()}, model.state.clone()


def test_in_place_state_update_reaches_the_caller_through_the_workflow():
    eager, eager_state = _stateful_rollout(compile=False)
    compiled, compiled_state = _stateful_rollout(compile=True)
    from earth2studio_compile.run import last_report

    region = last_report().regions[0]
    assert region.status == "compiled", last_report().summary()
    assert float(eager_state.norm()) > 0
    torch.testing.assert_close(compiled_state, eager_state, rtol=1e-5, atol=1e-5)
    for name, ref in eager.items():
        torch.testing.assert_close(compiled[name], ref, rtol=1e-5, atol=1e-5, msg=name)


def test_in_place_update_of_a_padded_batch_reaches_the_caller():
    class Padded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.core = StatefulCore(2)

    register_model(Padded, regions=("core",), pad_batch=True)
    try:
        model = Padded()
        big = [torch.randn(2, 2, 4, 4), torch.zeros(2, 2, 4, 4)]
        small = [torch.randn(1, 2, 4, 4), torch.ones(1, 2, 4, 4)]
        ref = [t.clone() for t in small]
        with torch.no_grad():
            expected = model.core(*ref)
        with CompileSession(model, backend=eager_backend) as session:
            with torch.inference_mode():
                model.core(*big)
                out = model.core(*small)
        assert session.report.regions[0].padded_calls == 1
        torch.testing.assert_close(small[1], ref[1])  # the state was updated in place
        torch.testing.assert_close(out, expected)
    finally:
        del MODEL_TABLE[f"{Padded.__module__}.{Padded.__qualname__}"]


def test_an_output_that_is_a_copied_input_is_the_callers_tensor():
    class Identity(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor, state: torch.Tensor):
            state.add_(x * self.scale)
            return x + 1, state

    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.core = Identity()

    model, x, state = Holder(), torch.randn(3), torch.zeros(3)
    with CompileSession(model, backend=eager_backend) as session:
        with torch.inference_mode():
            _, out = model.core(x, state)
    assert session.report.regions[0].status == "compiled"
    assert out is state and torch.equal(state, x)


# -- 3. "compiled" means compiled code ran --------------------------------------------
def test_region_that_ran_no_compiled_code_is_not_reported_compiled(logs):
    model = zoo.build("toy")
    x = torch.randn(1, 4, 16, 32)
    with torch.no_grad():
        expected = model.model(x)
    with torch.compiler.set_stance("force_eager"):
        with CompileSession(model, backend=eager_backend) as session, torch.no_grad():
            out = model.model(x)
    torch.testing.assert_close(out, expected)
    region = session.report.regions[0]
    assert region.status == "eager" and "no compiled code" in region.reason
    assert "compiled" not in session.report.summary().split(":", 1)[1].split("(")[0]
    assert len(messages(logs, "WARNING")) == 1


# -- the second call of a CUDA-graph executor records its graph -------------------
def _graphs_executor(monkeypatch, decline_at: int | None = None) -> None:
    """Every region runs an eager stand-in that says it replays CUDA graphs; with
    ``decline_at``, the region's call of that number declines."""
    from earth2studio_compile import executors

    calls = [0]

    class Graphs(executors.EagerExecutor):
        name, cudagraphs = "graphs", True

        def __call__(self, *args, **kwargs):
            calls[0] += 1
            if calls[0] == decline_at:
                raise executors.Declined("built for other inputs")
            return super().__call__(*args, **kwargs)

    def build(target):
        return Graphs(target.module)

    monkeypatch.setattr(executors, "CANDIDATES", [build])


@pytest.mark.parametrize("decline_at", [None, 2], ids=["recorded", "declined"])
def test_the_second_call_of_a_cuda_graph_executor_is_timed_as_its_recording(
    monkeypatch, decline_at
):
    _graphs_executor(monkeypatch, decline_at)
    core, x = toy_core(), torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        expected = core.net(x)
    with CompileSession(core, regions=("net",), probe=False) as session:
        with torch.no_grad():
            outs = [core.net(x) for _ in range(3)]
    for out in outs:
        torch.testing.assert_close(out, expected)
    r = session.report.regions[0]
    assert (r.status, r.executor, r.calls) == ("compiled", "graphs", 3), r
    if decline_at is None:
        assert r.phases["cudagraph_record"] >= 0.0 and r.recompiles == 0
    else:  # handed over to a new executor: the recording is not timed
        assert "cudagraph_record" not in r.phases and r.recompiles == 1
