"""A region's first call (earth2studio_compile.first_call): what it costs, and the
first call started ahead of the workflow's on made-up inputs.

The region is driven through :class:`CompileSession` and its report is read, as in
test_region.py (the call path, the fallback); code kept from an earlier session is
tested in test_resident.py, a later call handed over to Dynamo in
executors/test_executors_aot.py.
"""

from __future__ import annotations

import time

import pytest
import torch

from earth2studio_compile import CompileSession
from earth2studio_compile.report import RegionReport
from earth2studio_compile.tools import zoo

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


# -- the first call ahead of the workflow's ----------------------------------------


def _aot_stand_in(monkeypatch, seen):
    """An eager executor that says it runs an ahead-of-time artifact and records on
    which thread, and on which input, its first call ran."""
    import threading

    from earth2studio_compile import executors, first_call

    class Artifact(executors.EagerExecutor):
        name = "aot"

        def first_call(self, args, kwargs, laps):
            seen.append((threading.current_thread().name, args[0].clone()))
            return super().first_call(args, kwargs, laps)

    def build(target):
        return Artifact(target.module)

    monkeypatch.setattr(executors, "CANDIDATES", [build])
    monkeypatch.setattr(first_call, "AotExecutor", type("Aot", (), {"build": build}))


def test_a_later_session_runs_its_first_call_ahead_on_made_up_inputs(
    monkeypatch, tmp_path
):
    """The first session's first call leaves a hint of its inputs; the next
    session's ``ahead()`` loads the artifact on its own thread, on inputs of those
    shapes, before the caller's first call, which finds the region compiled and
    gets its own answer; the caller's random state is untouched."""
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    seen: list = []
    _aot_stand_in(monkeypatch, seen)
    core, x = zoo.ToyCore(4, 8).eval(), torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        expected = core.net(x)
    with CompileSession(core, regions=("net",), probe=False):
        with torch.no_grad():
            core.net(x)
    assert [t for t, _ in seen] == ["MainThread"]
    assert list((tmp_path / "aot" / "hints").glob("*.json"))
    seen.clear()
    state = torch.get_rng_state()
    with CompileSession(core, regions=("net",), probe=False) as session:
        session.ahead()
        with torch.no_grad():
            outs = [core.net(x) for _ in range(2)]
    assert torch.equal(torch.get_rng_state(), state)
    [(thread, made_up)] = seen
    assert thread.startswith("first call ahead")
    assert made_up.shape == x.shape and not torch.equal(made_up, x)
    for out in outs:
        torch.testing.assert_close(out, expected)
    r = session.report.regions[0]
    assert (r.status, r.executor, r.calls) == ("compiled", "aot", 2)
    assert r.phases["ahead_wait"] >= 0.0 and r.first_call_seconds > 0


@pytest.mark.parametrize("why", ["no hint", "precision", "no cache"])
def test_no_first_call_ahead_without_a_hint_or_where_it_would_touch_globals(
    monkeypatch, tmp_path, why
):
    """Without a hint there is nothing to guess; a region with a precision sets
    PyTorch's global flags in its calls, which the workflow's thread would see."""
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    seen: list = []
    _aot_stand_in(monkeypatch, seen)
    core, x = zoo.ToyCore(4, 8).eval(), torch.randn(2, 4, 8, 8)
    if why != "no hint":
        with CompileSession(core, regions=("net",), probe=False):
            with torch.no_grad():
                core.net(x)
        seen.clear()
    kwargs = {"precision": "fp32"} if why == "precision" else {}
    if why == "no cache":
        kwargs["cache"] = False
    with CompileSession(core, regions=("net",), probe=False, **kwargs) as session:
        session.ahead()
        with torch.no_grad():
            core.net(x)
    assert [t for t, _ in seen] == ["MainThread"], (seen, list(tmp_path.rglob("*")))
    assert "ahead_wait" not in session.report.regions[0].phases
