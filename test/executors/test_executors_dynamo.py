"""The Dynamo executor (earth2studio_compile.executors.dynamo) in a region: a
backend that fails, recompile storms, graph breaks and graph counts, one Dynamo
cache per region; CUDA graph trees' step marks, which are Dynamo's alone.

Most tests use a backend that compiles nothing (Dynamo still traces, guards and
recompiles), so they cost no Inductor build. Tests marked in their comment as
regressions failed before their fix (see CHANGELOG.md, "Fixed").
"""

from __future__ import annotations

import pytest
import torch
from conftest import FailingBackend, eager_backend, messages, run_inputs
from tiny_cores import Blocks, Holds

from earth2studio_compile import CompileSession, executors
from earth2studio_compile.executors import DynamoExecutor, EagerExecutor, Measured
from earth2studio_compile.tools import zoo


def toy_core() -> torch.nn.Module:
    return zoo.ToyCore(4, 8).eval()


# -- a backend that fails --------------------------------------------------------


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


# -- a compiler that gives another answer ----------------------------------------


def _off_by_one(gm, example_inputs):
    """Compiles code whose answer is wrong: a miscompile (Triton 3.6 gave every
    element of Aurora's window partition wrong at its published size)."""

    def run(*args):
        return [o + 1 for o in gm.forward(*args)]

    return run


def test_a_wrong_compiled_answer_at_the_first_call_is_eagers(logs):
    """Regression: the Dynamo path returned whatever the compiled code gave (only
    artifacts were verified against eager). Now its first call is checked against
    one eager call on copies of the inputs: eager's answer, eager from then on,
    one WARNING naming the difference."""
    core = toy_core()
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        expected = core(x)
    with CompileSession(core, regions=("net",), backend=_off_by_one) as session:
        with torch.no_grad():
            first, second = core(x), core(x)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    region = session.report.regions[0]
    assert region.status == "eager" and region.eager_calls == 1, (
        session.report.summary()
    )
    assert "another answer than eager" in region.reason
    [warning] = messages(logs, "WARNING")
    assert "at its first call" in warning and "rel. L2" in warning


class _Stateful(torch.nn.Module):
    """Updates a buffer and its input in place and sets a plain tensor attribute
    anew (DLESyM's ConvGRU keeps its state so: ``self.h = ...``)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.h = torch.zeros(())

    def forward(self, x):
        self.count.add_(1)
        self.h = self.h + 1
        x.mul_(2)
        return x + self.count + self.h


def test_a_wrong_answer_leaves_eagers_state_once(logs):
    """After a wrong compiled first call, the buffer, the input and the attribute
    hold eager's update once: not the compiled call's, nor two updates."""
    owner = Holds(_Stateful())
    x = torch.ones(3)
    with CompileSession(owner, regions=("net",), backend=_off_by_one) as session:
        with torch.no_grad():
            out = owner(x)
    assert session.report.regions[0].status == "eager"
    assert float(owner.net.count) == 1.0 and float(owner.net.h) == 1.0
    assert torch.equal(x, torch.full((3,), 2.0))
    assert torch.equal(out, torch.full((3,), 4.0))


def test_a_right_answer_keeps_the_calls_own_state_once(logs):
    """Regression (b3d75a0, reverted): the eager call beside the first compiled
    one set the plain attribute a second time (DLESyM's forecast moved by 1.3e-2
    on the CPU). Two calls: two updates of each kind, each call eager's answer."""
    owner, eager = Holds(_Stateful()), Holds(_Stateful())
    x, y = torch.ones(3), torch.ones(3)
    with CompileSession(owner, regions=("net",), backend=eager_backend) as session:
        with torch.no_grad():
            outs = [owner(x) for _ in range(2)]
    with torch.no_grad():
        wants = [eager(y) for _ in range(2)]
    region = session.report.regions[0]
    assert region.status == "compiled" and "verify" in region.phases, region.phases
    assert float(owner.net.count) == 2.0 and float(owner.net.h) == 2.0
    assert all(torch.equal(o, w) for o, w in zip(outs, wants)) and torch.equal(x, y)
    assert not messages(logs, "WARNING")


def test_a_core_that_draws_random_numbers_is_not_judged_by_another_draw(logs):
    """A core that draws random numbers gives other numbers in any second call:
    the check would find every such core wrong. It is not checked, and the
    caller's generator advances by the compiled call's draws alone."""

    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)

    holder, x = Holds(Noisy()), torch.zeros(4)
    torch.manual_seed(0)
    with CompileSession(holder, regions=("net",), backend=eager_backend) as session:
        with torch.no_grad():
            out = holder(x)
    after = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(out, torch.rand(4)) and torch.equal(after, torch.rand(1))
    assert session.report.regions[0].status == "compiled", session.report.summary()
    assert not messages(logs, "WARNING")


def test_a_right_compiled_answer_stays_compiled(logs):
    core = toy_core()
    region = run_inputs(core, [torch.randn(2, 4, 8, 8)] * 2, backend=eager_backend)
    assert region.status == "compiled" and "verify" in region.phases, region.phases
    assert not messages(logs, "WARNING")


# -- graphs: breaks, counts, storms ---------------------------------------------


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


# -- CUDA graph trees' step marks ------------------------------------------------


@pytest.fixture
def marks(monkeypatch):
    """Each CUDA-graph-tree step mark."""
    made: list[int] = []
    monkeypatch.setattr(
        torch.compiler, "cudagraph_mark_step_begin", lambda: made.append(1)
    )
    return made


def _mark_inputs(n=4):
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
    region, _ = _run(zoo.build("toy"), _mark_inputs())
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
    inputs = _mark_inputs()
    with torch.no_grad():
        expected = [model.model(x) for x in inputs]
    region, outs = _run(model, inputs)
    assert region.status == "compiled" and region.calls == 4
    assert marks == []
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


# -- a side effect inside an activation checkpoint ---------------------------------


class _CheckpointedCache(torch.nn.Module):
    """As anemoi's SDPA wrapper in AIFS's processor: a tensor kept on a module at
    its first call, inside ``torch.utils.checkpoint``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.mask: torch.Tensor | None = None

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        if self.mask is None:
            self.mask = torch.ones(x.shape[-1])
        return self.lin(x) * self.mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)


def test_a_side_effect_inside_a_checkpoint_compiles_without_grad(logs):
    """Regression: Dynamo refuses a side effect inside an activation checkpoint,
    for the recompute in backward; so a fresh AIFS2ENS (its attention mask kept at
    its first call, inside the processor's checkpoint) fell back to eager under
    compile=True. Without grad there is no backward to replay it in: the region
    compiles, one graph, and gives eager's answer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(_CheckpointedCache()).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        expected = _CheckpointedCache().eval()
        expected.load_state_dict(model[0].state_dict())
        want = expected(x)
    with CompileSession(model, regions=("0",), backend=eager_backend) as session:
        with torch.inference_mode():
            got = model(x)
    region = session.report.regions[0]
    assert region.status == "compiled", session.report.summary()
    assert region.graphs == 1 and region.graph_breaks == 0
    assert not messages(logs, "WARNING")
    torch.testing.assert_close(got, want)
    assert model[0].mask is not None
