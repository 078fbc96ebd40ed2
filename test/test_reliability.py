"""Promises a hostile user once broke: never a different answer, never a lost model.

Each test here failed before its fix (see CHANGELOG.md, "Fixed"). Most use a backend
that compiles nothing (Dynamo still traces, guards and recompiles), so they cost no
Inductor build; the in-place test runs Inductor, because functionalized mutation is
what Inductor does with a state update.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from conftest import (
    TIME,
    FailingBackend,
    assert_unchanged,
    eager_backend,
    messages,
    run_inputs,
    snapshot,
)

from earth2studio_compile import CompileSession, ModelSpec, plan, register_model
from earth2studio_compile.models import MODEL_TABLE
from earth2studio_compile.tools import zoo


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


# -- 2. table entries found through a base class -------------------------------------
def test_subclass_adding_a_network_is_not_described_by_its_base_entry():
    from earth2studio.models.px import Persistence

    class LearnedPersistence(Persistence):
        def __init__(self) -> None:
            grid = zoo.Grid(8, 16)
            super().__init__(["t2m"], OrderedDict(lat=grid.lat, lon=grid.lon))
            self.net = torch.nn.Linear(4, 4)

    p = plan(LearnedPersistence())
    assert p.source == "generic" and [path for path, _ in p.targets] == ["net"]
    assert "subclass of Persistence" in p.spec.note
    # A subclass that only overrides coordinates is still what its entry describes.
    fcn = zoo.build("fcn")
    assert type(fcn) is not type(fcn).__mro__[1] and plan(fcn).source == "table"
    assert plan(zoo.build("persistence")).reason.startswith("no network")


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


# -- 5. setup errors -------------------------------------------------------------------
def test_option_of_the_wrong_type_is_refused_up_front():
    model = zoo.build("toy")
    with pytest.raises(TypeError, match=r"options\['max_autotune'\]"):
        CompileSession(model, options={"max_autotune": "yes"})


def test_error_while_setting_up_the_compile_falls_back(logs, monkeypatch):
    model = zoo.build("toy")
    x = torch.randn(1, 4, 16, 32)
    with torch.no_grad():
        expected = model.model(x)

    def broken_compile(*args, **kwargs):
        raise RuntimeError("injected setup failure")

    with CompileSession(model, backend=eager_backend) as session:
        monkeypatch.setattr(torch, "compile", broken_compile)
        with torch.no_grad():
            out = model.model(x)
    torch.testing.assert_close(out, expected)
    region = session.report.regions[0]
    assert region.status == "eager" and "injected setup failure" in region.reason
    assert len(messages(logs, "WARNING")) == 1


# -- 6. session entry is all or nothing ------------------------------------------------
def test_a_model_that_cannot_be_planned_leaves_the_others_intact(logs):
    class Lazy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.LazyLinear(4)

    first, lazy = zoo.build("toy"), Lazy()
    before = snapshot(first)
    with CompileSession(first, lazy, backend=eager_backend) as session:
        with torch.no_grad():
            first.model(torch.randn(1, 4, 16, 32))
            lazy.net(torch.randn(2, 3))  # eager: the lazy module initialises itself
    statuses = {r.label: r.status for r in session.report.regions}
    assert statuses == {"GridPrognostic.model": "compiled", "Lazy": "skipped"}
    assert "lazy" in session.report.regions[1].reason
    assert_unchanged(first, before)


def test_failure_while_installing_restores_every_model(monkeypatch):
    from earth2studio_compile.region import CompiledRegion

    first, second = zoo.build("toy"), zoo.build("toy", seed=1)
    before = snapshot(first)
    install = CompiledRegion.install

    def flaky(self):
        if self.module is second.model:
            raise RuntimeError("injected install failure")
        install(self)

    monkeypatch.setattr(CompiledRegion, "install", flaky)
    with pytest.raises(RuntimeError, match="injected install failure"):
        with CompileSession(first, second, backend=eager_backend):
            pass
    assert_unchanged(first, before)
    monkeypatch.setattr(CompiledRegion, "install", install)
    with CompileSession(first, backend=eager_backend) as session, torch.no_grad():
        first.model(torch.randn(1, 4, 16, 32))
    assert session.report.regions[0].status == "compiled"


# -- 7. a fallback leaves everybody else's compiled code alone -------------------------
def test_fallback_does_not_reset_the_users_compiled_code(logs):
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    user_fn = torch.compile(lambda t: torch.sin(t) * 2, backend=counting)
    t = torch.randn(8)
    user_fn(t)
    assert len(compiles) == 1
    model = zoo.build("toy")
    with CompileSession(model, backend=FailingBackend()) as session, torch.no_grad():
        model.model(torch.randn(1, 4, 16, 32))
    assert session.report.regions[0].status == "eager"
    user_fn(t)
    assert len(compiles) == 1, "the user's function was compiled again"
    # ...and the process still compiles new regions after the failure.
    with CompileSession(model, backend=eager_backend) as session, torch.no_grad():
        model.model(torch.randn(1, 4, 16, 32))
    assert session.report.regions[0].status == "compiled"


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


# -- 12. bad regions values name the parameter -----------------------------------------
@pytest.mark.parametrize("regions", [3, [None], [3], "model", [""]])
def test_bad_regions_name_the_parameter_and_the_fix(regions):
    model = zoo.build("toy")
    with pytest.raises(TypeError, match=r"regions.*(\(|'model')"):
        CompileSession(model, regions=regions)

    class Mine(torch.nn.Module):
        pass

    with pytest.raises(TypeError, match="regions"):
        register_model(Mine, regions=regions)
    with pytest.raises(TypeError, match="regions"):
        ModelSpec(regions=regions)
