"""The region: one core's first call and steady calls, its fallback, its report.

A region hooks one core; these tests drive it through :class:`CompileSession` and
the workflows and read its report. Most use a backend that compiles nothing (Dynamo
still traces, guards and recompiles), so they cost no Inductor build. Tests marked
in their comment as regressions failed before their fix (see CHANGELOG.md, "Fixed").
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
import pytest
import torch
from conftest import (
    TIME,
    FailingBackend,
    eager_backend,
    messages,
    run_inputs,
)

from earth2studio_compile import CompileSession, register_model
from earth2studio_compile.cache import local_cache_source
from earth2studio_compile.models import MODEL_TABLE
from earth2studio_compile.report import RegionReport
from earth2studio_compile.tools import zoo


def toy_core() -> torch.nn.Module:
    return zoo.ToyCore(4, 8).eval()


# -- the first call: what compiling costs ------------------------------------------


def test_first_call_phases_add_up_to_the_measured_first_step(logs):
    model = zoo.build("toy")
    x = torch.randn(1, 4, 16, 32)
    with CompileSession(model) as session:
        with torch.no_grad():
            start = time.perf_counter()
            model.model(x)
            measured = time.perf_counter() - start
            for _ in range(2):
                model.model(x)
    r = session.report.regions[0]
    assert r.status == "compiled"
    for phase in ("dynamo", "backend", "first_run"):
        assert r.phases[phase] > 0, phase
    assert r.first_call_seconds == pytest.approx(measured, rel=0.1)
    # Every phase is a named lap (test_report.py checks the sum).
    assert set(r.phases) <= set(RegionReport.FIRST_CALL)
    # The tests point Inductor at a directory of their own: the report says so,
    # rather than "warm cache" as if it were this package's (turned off here).
    assert "(TORCHINDUCTOR_CACHE_DIR," in session.report.summary()


def test_the_report_names_the_local_cache_that_made_a_compile_warm(
    tmp_path, monkeypatch
):
    from earth2studio_compile import _torch

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    assert "this package's" in local_cache_source(str(tmp_path / "inductor"))
    default = _torch.default_inductor_cache_dir()
    assert default is not None
    assert "PyTorch's default" in local_cache_source(default)
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", "off")
    assert "PyTorch's default" in local_cache_source(default)
    assert "TORCHINDUCTOR_CACHE_DIR" in local_cache_source(str(tmp_path / "mine"))


def _report(first: float, eager_ms: float, compiled_ms: float, calls: int):
    r = RegionReport("M", "core", status="compiled", calls=calls)
    r.phases.update(dynamo=first / 2, backend=first / 4, first_run=first / 4)
    r.eager_ms, r.compiled_ms = eager_ms, compiled_ms
    return r


def test_break_even_counts_the_calls_that_pay_for_the_compile():
    r = _report(first=1.0, eager_ms=10.0, compiled_ms=5.0, calls=8)
    # n calls cost 1.0 s + (n - 1) x 5 ms compiled against n x 10 ms eager.
    n = r.break_even_calls
    assert n is not None
    assert 1.0 + (n - 1) * 0.005 <= n * 0.010 + 1e-9
    assert 1.0 + (n - 2) * 0.005 > (n - 1) * 0.010
    assert f"pays for its compile after {n} calls (this run: 8)" in r.break_even_text
    r.calls = n
    assert "reached in this run" in r.break_even_text
    # CUDA-graph recording at the second call is a cost too.
    r.phases["cudagraph_record"] = 0.5
    assert r.break_even_calls is not None and r.break_even_calls > n
    slower = _report(first=1.0, eager_ms=5.0, compiled_ms=6.0, calls=8)
    assert slower.break_even_calls is None
    assert "does not pay" in slower.break_even_text


def test_speed_probe_can_be_turned_off():
    core = zoo.ToyCore(4, 8).eval()
    x = torch.randn(2, 4, 8, 8)
    with CompileSession(core, regions=("net",), backend=eager_backend) as on:
        with torch.no_grad():
            for _ in range(8):
                core.net(x)
    with CompileSession(
        core, regions=("net",), backend=eager_backend, probe=False
    ) as off:
        with torch.no_grad():
            for _ in range(8):
                core.net(x)
    assert on.report.regions[0].eager_ms is not None
    assert on.report.regions[0].compiled_ms is not None
    assert off.report.regions[0].eager_ms is None
    assert off.report.regions[0].compiled_ms is None
    with pytest.raises(TypeError, match="probe"):
        CompileSession(core, probe="no")


def test_a_fallback_reports_the_time_spent_before_it(logs):
    core = zoo.ToyCore(4, 8).eval()
    x = torch.randn(2, 4, 8, 8)
    with CompileSession(core, regions=("net",), backend=FailingBackend()) as session:
        with torch.no_grad():
            core.net(x)
    r = session.report.regions[0]
    assert r.status == "eager"
    assert r.phases["before_fallback"] > 0
    assert r.compile_seconds == pytest.approx(r.phases["before_fallback"])
    (warning,) = messages(logs, "WARNING")
    assert f"at its first call after {r.phases['before_fallback']:.1f} s" in warning


# -- fallback, storms, padding, speed verdict -----------------------------------------


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
    region = run_inputs(core, inputs, backend=FailingBackend(ok=1))
    assert region.status == "eager" and region.calls == 3 and region.eager_calls == 1
    warnings = messages(logs, "WARNING")
    assert len(warnings) == 1 and "at step 3" in warnings[0]


def test_recompile_storm_is_detected(logs):
    core = toy_core()
    import torch._dynamo.config as dynamo_config

    shapes = [(1, 4, 8, 8 + 2 * i) for i in range(6)]
    inputs = [torch.randn(*s) for s in shapes]
    with dynamo_config.patch(recompile_limit=3):
        region = run_inputs(core, inputs, backend=eager_backend, dynamic=False)
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


# -- regressions (issue 12): in-place updates, what "compiled" means, storms -------


# -- 1. in-place updates of positional arguments -------------------------------------
class StatefulCore(torch.nn.Module):
    """A recurrent core: updates the state it is handed, in place."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.mix = torch.nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        state.mul_(0.5).add_(x)
        return self.mix(x) + state


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


def test_graph_counts_are_the_regions_own():
    from torch._dynamo.utils import counters

    def noisy_backend(gm, example_inputs):
        # Another thread's compile, as Dynamo's process-wide counters see it.
        counters["stats"]["unique_graphs"] += 1
        counters["graph_break"]["elsewhere"] += 1
        return gm.forward

    model = zoo.build("toy")
    with CompileSession(model, backend=noisy_backend) as session, torch.no_grad():
        model.model(torch.randn(1, 4, 16, 32))
    region = session.report.regions[0]
    assert (region.status, region.graphs, region.graph_breaks) == ("compiled", 1, 0)


# -- 4. one Dynamo cache per region ----------------------------------------------------
class Blocks(torch.nn.Module):
    """Blocks of one class and different widths: each needs its own compiled code."""

    def __init__(self, n: int = 12, start: int = 4) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Linear(start + i, start + i) for i in range(n)
        )

    def run_each(self) -> list[torch.Tensor]:
        with torch.no_grad():
            return [b(torch.ones(2, b.in_features)) for b in self.blocks]


def test_more_regions_than_the_recompile_limit_each_compile_once(logs):
    import torch._dynamo.config as dynamo_config

    model = Blocks()
    assert len(model.blocks) > dynamo_config.recompile_limit
    with CompileSession(model, backend=eager_backend) as session:
        outs = model.run_each()
    for out, ref in zip(outs, model.run_each()):
        torch.testing.assert_close(out, ref)
    statuses = {r.status for r in session.report.regions}
    assert len(session.report.regions) == 12 and statuses == {"compiled"}
    assert all(r.recompiles == 0 and r.graphs == 1 for r in session.report.regions)
    assert not messages(logs, "WARNING")


def test_many_sessions_in_one_process_each_compile(logs):
    for k in range(3):
        model = Blocks(4, start=4 + 4 * k)
        with CompileSession(model, backend=eager_backend) as session:
            model.run_each()
        assert {r.status for r in session.report.regions} == {"compiled"}
    # Two sessions open at once, on different models.
    a, b = Blocks(3, start=20), Blocks(3, start=23)
    with CompileSession(a, backend=eager_backend) as sa:
        with CompileSession(b, backend=eager_backend) as sb:
            a.run_each()
            b.run_each()
    regions = [*sa.report.regions, *sb.report.regions]
    assert {r.status for r in regions} == {"compiled"}
    assert not messages(logs, "WARNING")


# -- 8. storms are found early ---------------------------------------------------------
def test_storm_is_caught_at_the_fourth_recompile(logs):
    from earth2studio_compile.region import RECOMPILE_LIMIT

    inputs = [torch.randn(1, 4, 8, 8 + 2 * i) for i in range(7)]
    core = zoo.ToyCore(4, 8).eval()
    # No probe: its eager calls would leave gaps in the run of recompiles.
    region = run_inputs(core, inputs, backend=eager_backend, dynamic=False, probe=False)
    assert region.status == "eager" and "recompile storm" in region.reason
    assert region.recompiles == RECOMPILE_LIMIT - 1 == 3
    assert region.eager_calls == len(inputs) - RECOMPILE_LIMIT


@pytest.mark.parametrize(
    "shapes",
    [
        [(2, 4, 8, 8), (2, 4, 8, 8), (1, 4, 8, 8)],  # an ensemble's smaller last batch
        [(b, 4, 8, 8) for b in (4, 2, 3, 5, 1)],  # many batch sizes
        [(1, 4, 8, w) for w in (8, 10, 12, 14, 16)],  # many grids
        [(2, 4, 8, 8), (1, 4, 8, 8), (2, 4, 8, 10), (3, 4, 8, 12), (1, 4, 8, 14)],
    ],
    ids=["last-batch", "batches", "grids", "both"],
)
def test_legitimate_shape_changes_are_not_storms(shapes, logs):
    core = zoo.ToyCore(4, 8).eval()
    with CompileSession(core, regions=("net",), backend=eager_backend) as s:
        with torch.inference_mode():
            for shape in shapes:
                core(torch.randn(*shape))
    region = s.report.regions[0]
    # Counts vary with Dynamo's remembered dynamic dims (PGO); never a storm.
    assert region.status == "compiled", s.report.summary()
    assert not messages(logs, "WARNING")
