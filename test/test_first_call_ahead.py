"""The first call ahead of the workflow's (earth2studio_compile.first_call_ahead): on
made-up inputs, only where an artifact for them is on disk, never waited for (the
workflow's calls run eagerly beside it), and never where it would touch global
settings; made-up inputs that fail verification warn nobody.

The region is driven through :class:`CompileSession` and its report is read, as in
test_first_call.py.
"""

from __future__ import annotations

import time

import pytest
import torch
from aot_helpers import aot_stand_in
from conftest import eager_backend, messages

from earth2studio_compile import CompileSession
from earth2studio_compile.tools import zoo

# -- the first call ahead of the workflow's ----------------------------------------


def test_a_later_session_runs_its_first_call_ahead_on_made_up_inputs(
    monkeypatch, tmp_path
):
    """The first session's first call leaves a hint of its inputs; the next
    session's ``ahead()`` loads the artifact on its own thread, on inputs of those
    shapes, before the caller's first call, which finds the region compiled and
    gets its own answer; the caller's random state is untouched."""
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    seen: list = []
    aot_stand_in(monkeypatch, seen)
    core, x = zoo.ToyCore(4, 8).eval(), torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        expected = core.net(x)
    with CompileSession(core, regions=("net",), probe=False):
        with torch.no_grad():
            core.net(x)
    assert [s.thread for s in seen] == ["MainThread"]
    assert list((tmp_path / "aot" / "hints").glob("*.json"))
    seen.clear()
    state = torch.get_rng_state()
    with CompileSession(core, regions=("net",), probe=False) as session:
        session.ahead(wait=True)
        with torch.no_grad():
            outs = [core.net(x) for _ in range(2)]
    assert torch.equal(torch.get_rng_state(), state)
    [first] = seen
    thread, made_up = first.thread, first.input
    assert thread.startswith("first call ahead")
    assert made_up.shape == x.shape and not torch.equal(made_up, x)
    for out in outs:
        torch.testing.assert_close(out, expected)
    r = session.report.regions[0]
    assert (r.status, r.executor, r.calls) == ("compiled", "aot", 2)
    assert r.phases["ahead_wait"] >= 0.0 and r.first_call_seconds > 0


def test_the_first_call_ahead_thread_ends_with_its_last_first_call(
    monkeypatch, tmp_path
):
    """The thread ends once its first calls have, not when the session closes.
    Regression: it lived through the workflow's steps with the OpenMP team its CPU
    kernels had made; more OpenMP threads than cores made libgomp's threads sleep
    between parallel regions instead of spinning, and every CPU step of the call
    waited to wake them (DLESyM small on 2 cores: the first compiled call 1.45 s,
    eager 0.84)."""
    import threading

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    seen: list = []
    aot_stand_in(monkeypatch, seen)
    core, x = zoo.ToyCore(4, 8).eval(), torch.randn(2, 4, 8, 8)
    with CompileSession(core, regions=("net",), probe=False):
        with torch.no_grad():
            core.net(x)
    seen.clear()

    def ahead_threads() -> list[str]:
        return [
            t.name
            for t in threading.enumerate()
            if t.name.startswith("first call ahead")
        ]

    with CompileSession(core, regions=("net",), probe=False) as session:
        session.ahead()
        deadline = time.monotonic() + 10.0
        while ahead_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not ahead_threads(), "the first call ahead's thread outlived its work"
        with torch.no_grad():
            core.net(x)
    assert seen and seen[0].thread.startswith("first call ahead")
    assert session.report.regions[0].status == "compiled"


def test_calls_while_the_first_call_ahead_runs_are_eager_and_do_not_wait(
    monkeypatch, tmp_path
):
    """The workflow never waits for the first call ahead: a call made while it
    still runs is eager (eager's answer, ``ahead_eager`` in the phases), the first
    call after it ended runs the artifact and, under CUDA graphs, records
    (regression: the workflow's first call waited). A first call ahead over
    before the workflow's first call also records, on its own thread: the
    workflow's calls only replay (regression: the workflow's first compiled call
    recorded, 0.16 s of FCN's first step on an H100)."""
    import threading

    from earth2studio_compile import executors, first_call_ahead

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    gate, runs = threading.Event(), []

    class Artifact(executors.EagerExecutor):
        name, cudagraphs = "aot", True

        def first_call(self, args, kwargs, laps):
            gate.wait(timeout=30)
            return super().first_call(args, kwargs, laps)

        def __call__(self, *args, **kwargs):
            runs.append(threading.current_thread().name)
            return super().__call__(*args, **kwargs)

    def build(target, made_up=False):
        return Artifact(target.module)

    monkeypatch.setattr(executors, "CANDIDATES", [build])
    monkeypatch.setattr(
        first_call_ahead, "AotExecutor", type("Aot", (), {"build": build})
    )
    core, x = zoo.ToyCore(4, 8).eval(), torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        expected = core.net(x)
    gate.set()
    with CompileSession(core, regions=("net",), probe=False) as session:
        with torch.no_grad():
            core.net(x)  # leaves the hint
            core.net(x)
    assert runs == ["MainThread"] * 2  # without a first call ahead: the second records
    assert "cudagraph_record" in session.report.regions[0].phases
    gate.clear()
    runs.clear()
    with CompileSession(core, regions=("net",), probe=False) as session:
        session.ahead()
        with torch.no_grad():
            start = time.perf_counter()
            beside = core.net(x)
            took = time.perf_counter() - start
            gate.set()
            session.ahead(wait=True)
            recorded = list(runs)
            runs.clear()
            after = [core.net(x) for _ in range(2)]
    assert took < 10, took  # the call did not wait for the gate
    torch.testing.assert_close(beside, expected)
    for out in after:
        torch.testing.assert_close(out, expected)
    assert runs == ["MainThread"] * 2
    # the first call ahead; not the recording, with the workflow's calls beside
    [thread] = recorded
    assert thread.startswith("first call ahead")
    r = session.report.regions[0]
    assert (r.status, r.executor, r.calls, r.eager_calls) == ("compiled", "aot", 3, 1)
    assert r.phases["ahead_eager"] > 0 and "cudagraph_record" in r.phases
    assert "3 calls, the first 1 eager while it loaded" in session.report.summary()
    # Over before the workflow's first call: that call replays.
    core = zoo.ToyCore(4, 8).eval()
    runs.clear()
    with CompileSession(core, regions=("net",), probe=False) as session:
        session.ahead(wait=True)
        with torch.no_grad():
            core.net(x)
    assert [t.startswith("first call ahead") for t in runs] == [True, True, False]
    r = session.report.regions[0]
    assert (r.status, r.calls, r.eager_calls) == ("compiled", 1, 0)
    assert "cudagraph_record" in r.phases and "ahead_eager" not in r.phases


@pytest.mark.parametrize("why", ["no hint", "precision", "no cache"])
def test_no_first_call_ahead_without_a_hint_or_where_it_would_touch_globals(
    monkeypatch, tmp_path, why
):
    """Without a hint there is nothing to guess; a region with a precision sets
    PyTorch's global flags in its calls, which the workflow's thread would see."""
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    seen: list = []
    aot_stand_in(monkeypatch, seen)
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
    assert [s.thread for s in seen] == ["MainThread"], (seen, list(tmp_path.rglob("*")))
    assert "ahead_wait" not in session.report.regions[0].phases


class _Exploding(torch.nn.Module):
    """``exp(100 x)``: finite for ``x <= 0``, infinite on much of normal noise."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((1,), 100.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.scale * x)


class _Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.core = _Exploding()


def _eager_artifact(monkeypatch) -> None:
    """Every region has an artifact on disk that gives eager's answer bit for bit
    where the inputs are at most 0 (a stand-in that calls the core's ``forward``),
    and 1 elsewhere: only the inputs it is verified on decide whether it passes
    (normal noise has positive values). Before infinities where eager has them
    counted as eager's answer, the stand-in was eager's everywhere and normal
    noise failed by overflowing."""
    from earth2studio_compile.executors import aot

    class Runner:
        path = "stand-in.pt2"
        phases = dict.fromkeys(("checksum", "aot_load", "bind"), 0.0)
        verified_earlier = False  # as an AotRunner's, until a known seal sets it

        def __init__(self, module: torch.nn.Module) -> None:
            self.module = module

        def __call__(self, x):
            out = self.module.forward(x)
            return torch.where(x > 0, torch.ones_like(out), out)

    monkeypatch.setattr(
        aot, "load_runner", lambda target, *a, **k: Runner(target.module)
    )


@pytest.mark.parametrize("inputs", ["finite", "overflowing"])
def test_made_up_inputs_ahead_that_fail_verification_warn_nobody(
    monkeypatch, tmp_path, logs, inputs
):
    """Made-up normal noise fails the artifact's verification: the first call
    ahead declines at DEBUG, and the caller's first call verifies on its own inputs,
    with no WARNING where they are at most 0 and one, from the caller's thread, where
    they are positive too (regression: the ahead thread warned first)."""
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    _eager_artifact(monkeypatch)
    finite = -torch.rand(4, 64)
    x = finite if inputs == "finite" else -10 * finite
    settings = {"regions": ("core",), "probe": False, "backend": eager_backend}
    model = _Holder()
    with CompileSession(model, **settings):
        with torch.no_grad():
            model.core(finite)  # runs the artifact, leaves a hint of its inputs
    logs.clear()
    model = _Holder()  # another instance: nothing kept for it, as in a new process
    with CompileSession(model, **settings) as session:
        session.ahead(wait=True)
        with torch.no_grad():
            out = model.core(x)
    torch.testing.assert_close(out, torch.exp(100 * x))
    warnings = [m for m in logs if m["level"].name == "WARNING"]
    r = session.report.regions[0]
    if inputs == "finite":
        assert not warnings, messages(logs, "WARNING")
        assert (r.status, r.executor) == ("compiled", "aot")
    else:
        assert [w["thread"].name for w in warnings] == ["MainThread"], warnings
        assert "another answer than eager" in warnings[0]["message"]
        assert (r.status, r.executor) == ("compiled", "dynamo")
    # The first call ahead ran, and declined: the caller's first call did not wait.
    made_up = [m for m in logs if "on made-up inputs" in m["message"]]
    assert [(m["thread"].name[:16], m["level"].name) for m in made_up] == [
        ("first call ahead", "DEBUG")
    ]
    assert "ahead_wait" not in r.phases


def test_a_region_its_model_calls_under_autocast_runs_its_first_call_ahead(
    monkeypatch, tmp_path
):
    """Its hint is kept under the autocast its model's wrapper calls it in (AIFS's),
    which the first call ahead's thread does not have: it found no hint, and the
    artifact loaded on the workflow's own first call. It now looks under each
    16-bit autocast, and checks the artifact against eager under the one found."""
    from aot_helpers import autocasting_model, built_then_run_from_its_artifact

    from earth2studio_compile import example_input, resident

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_BACKGROUND", "off")
    model = autocasting_model()
    built_then_run_from_its_artifact(model)
    resident.release()
    x, coords = example_input(model)
    with CompileSession(model) as session:
        session.ahead(wait=True)
        with torch.no_grad():
            model(x, coords)
    [r] = session.report.regions
    assert r.executor == "aot", session.report.summary()
    assert "ahead_wait" in r.phases, r.phases
