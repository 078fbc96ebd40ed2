"""CompileSession: in-place compile, exact restore, plans, setup that fails whole.

Faults are injected where they really happen: in the compiler backend (a ``raise``
inside traced code would only be a graph break, run eagerly by Dynamo). What one
region does once installed is in ``test_region.py``.
"""

from __future__ import annotations

import earth2studio.run as upstream
import pytest
import torch
from conftest import (
    FailingBackend,
    assert_unchanged,
    eager_backend,
    messages,
    run_workflow,
    snapshot,
)

from earth2studio_compile import CompileSession, ModelSpec, register_model
from earth2studio_compile.metrics import rel_l2
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


def test_module_compiled_by_the_user_is_left_alone(logs):
    core = toy_core()
    core.net.compile(backend=eager_backend)
    mine = core.net.__dict__["_compiled_call_impl"]
    with CompileSession(core, regions=("net",)) as session:
        assert core.net.__dict__["_compiled_call_impl"] is mine
    assert core.net.__dict__["_compiled_call_impl"] is mine
    assert session.report.regions[0].status == "skipped"


# -- regressions (issue 12): setup, all or nothing, others' code, bad input ----------


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


def test_warmup_compiles_before_the_first_step():
    model = zoo.build("fcn")
    eager = run_workflow(upstream.deterministic, "deterministic", model)
    with pytest.raises(RuntimeError, match="inside an open session"):
        CompileSession(model).warmup()
    with CompileSession(model) as session:
        session.warmup()
        region = session.report.regions[0]
        assert (region.status, region.calls) == ("compiled", 1)
        compiled = run_workflow(upstream.deterministic, "deterministic", model)
    assert region.recompiles == 0 and region.calls == 3  # warm-up + 2 steps
    for key, value in eager.items():
        if value.dtype.is_floating_point:
            assert rel_l2(compiled[key], value) <= 1e-5, key
