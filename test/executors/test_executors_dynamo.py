"""The Dynamo executor (earth2studio_compile.executors.dynamo) in a region: a
backend that fails, recompile storms, graph breaks and graph counts, one Dynamo
cache per region.

Most tests use a backend that compiles nothing (Dynamo still traces, guards and
recompiles), so they cost no Inductor build. Tests marked in their comment as
regressions failed before their fix (see CHANGELOG.md, "Fixed").
"""

from __future__ import annotations

import pytest
import torch
from conftest import FailingBackend, eager_backend, messages, run_inputs

from earth2studio_compile import CompileSession
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
