"""A region's first call (earth2studio_compile.first_call): what it costs, tensor
state kept on the modules under CUDA graphs, an artifact's speed kept for later
processes. The first call ahead of the workflow's: test_first_call_ahead.py.

The region is driven through :class:`CompileSession` and its report is read, as in
test_region.py (the call path, the fallback); code kept from an earlier session is
tested in test_resident.py, a later call handed over to Dynamo in
executors/test_executors_aot.py.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from aot_helpers import aot_stand_in
from conftest import messages

from earth2studio_compile import CompileSession
from earth2studio_compile.probe import SpeedProbe
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


# -- tensor state kept on the modules, and CUDA graphs ------------------------------
class _RecurrentModel(torch.nn.Module):
    """A model whose region ``core`` keeps its state on a submodule."""

    def __init__(self, update: bool = True) -> None:
        super().__init__()
        from tiny_cores import RecurrentCore

        self.core = RecurrentCore(4, update)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.core(x)


def _held_on(module: torch.nn.Module) -> list[torch.Tensor]:
    return [
        v
        for m in module.modules()
        for v in vars(m).values()
        if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)
    ]


def _pool_executors(monkeypatch) -> list:
    """Every region runs an eager stand-in for CUDA graph trees while it may use
    CUDA graphs: the tensors its calls return or leave on the region's modules live
    in its "pool", which its next call overwrites (NaN), as a replay does. A region
    that asked for no CUDA graphs gets a plain eager executor. Returns the pools."""
    from earth2studio_compile import executors

    pools: list = []

    class Pool(executors.EagerExecutor):
        name, cudagraphs = "graphs", True

        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__(module)
            self.pool: list[torch.Tensor] = []
            pools.append(self.pool)

        def __call__(self, *args, **kwargs):
            for t in self.pool:
                t.fill_(float("nan"))
            before = {id(t) for t in _held_on(self.module)}
            out = super().__call__(*args, **kwargs)
            self.pool += [t for t in _held_on(self.module) if id(t) not in before]
            self.pool.append(out)
            return out

    class Plain(executors.EagerExecutor):
        name = "plain"

    def build(target):
        if target.report.no_cudagraphs is None:
            return Pool(target.module)
        return Plain(target.module)

    monkeypatch.setattr(executors, "CANDIDATES", [build])
    return pools


def _eager_outputs(xs: list[torch.Tensor], update: bool = True) -> tuple:
    torch.manual_seed(0)
    model = _RecurrentModel(update).eval()
    with torch.no_grad():
        return [model(x) for x in xs], model.core.cell.h.clone()


def test_state_kept_on_a_module_leaves_cuda_graphs_after_the_first_call(
    monkeypatch, logs
):
    # Regression: DLESyM's ConvGRU state (self.h = h_next) was left in CUDA-graph
    # memory; the next replay overwrote it, and the eager fallback read it too.
    pools = _pool_executors(monkeypatch)
    xs = [torch.randn(2, 4, 8, 8) for _ in range(4)]
    expected, expected_h = _eager_outputs(xs)
    torch.manual_seed(0)
    model = _RecurrentModel().eval()
    with CompileSession(model, probe=False) as session, torch.no_grad():
        outs = [model(x) for x in xs]
    for out, ref in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, ref)
    r = session.report.regions[0]
    assert (r.status, r.executor, r.recompiles) == ("compiled", "plain", 1), r
    assert r.no_cudagraphs == "its forward reassigns cell.h", r.no_cudagraphs
    assert "no CUDA graphs (its forward reassigns cell.h)" in session.report.summary()
    (info,) = [m for m in messages(logs, "INFO") if "compiled again at step" in m]
    assert "at step 2" in info and "without CUDA graphs: its forward" in info
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")
    # The state the user keeps is the module's own memory, not the pool's.
    h = model.core.cell.h
    assert not any(h is t for pool in pools for t in pool)
    torch.testing.assert_close(h, expected_h)


def test_state_a_cuda_graph_executor_leaves_later_is_taken_out_at_close(
    monkeypatch, logs
):
    # The cell replaces its placeholder only at a call of a new shape: not at the
    # first call, so the region keeps CUDA graphs; the session's close copies the
    # state out of the pool, and the user's next eager call reads it.
    pools = _pool_executors(monkeypatch)
    xs = [torch.randn(2, 4, 8, 8), torch.randn(1, 4, 8, 8)]
    torch.manual_seed(0)
    model = _RecurrentModel(update=False).eval()
    with torch.no_grad():
        model.core.cell.h = torch.zeros(2, 4, 8, 8)
        with CompileSession(model, probe=False) as session:
            outs = [model(x) for x in xs]
        later = model(xs[1])  # eager, after the session
    assert session.report.regions[0].no_cudagraphs is None
    h = model.core.cell.h
    assert h.shape == (1, 4, 8, 8) and not any(h is t for t in pools[0])
    for pool in pools:  # another replay: nothing of the module's is touched
        for t in pool:
            t.fill_(float("nan"))
    torch.testing.assert_close(model(xs[1]), later)
    torch.testing.assert_close(later, outs[1])
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")


@pytest.mark.gpu
def test_stateful_core_on_cuda_runs_without_cuda_graphs_and_matches_eager(
    logs, strict_fp32
):
    """A real session on CUDA: the first call (CUDA graphs, as reduce-overhead
    asks) replaces the cell's state; the region compiles again in Inductor's
    default mode, every step matches eager, no WARNING, and after the close the
    state survives other CUDA graphs' replays."""
    xs = [torch.randn(2, 4, 8, 8, device="cuda") for _ in range(5)]
    torch.manual_seed(0)
    eager = _RecurrentModel().eval().cuda()
    with torch.no_grad():
        expected = [eager(x) for x in xs]
    torch.manual_seed(0)
    model = _RecurrentModel().eval().cuda()
    with CompileSession(model, probe=False) as session, torch.no_grad():
        outs = [model(x) for x in xs]
    for step, (out, ref) in enumerate(zip(outs, expected, strict=True), start=1):
        torch.testing.assert_close(out, ref, msg=f"step {step}")
    r = session.report.regions[0]
    assert (r.status, r.executor, r.mode) == ("compiled", "dynamo", "inductor/default")
    assert (r.graphs, r.graph_breaks, r.recompiles) == (1, 0, 1), r
    assert r.no_cudagraphs == "its forward reassigns cell.h"
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")
    # Other compiled code replays CUDA graphs (a new tree step each call): the
    # module's state is not in their memory, and the user's eager call reads it.
    other = zoo.ToyCore(4, 8).eval().cuda()
    with CompileSession(other, regions=("net",), probe=False), torch.no_grad():
        for _ in range(3):
            other(torch.randn(2, 4, 8, 8, device="cuda"))
    torch.testing.assert_close(model.core.cell.h, eager.core.cell.h)
    with torch.no_grad():
        torch.testing.assert_close(model(xs[0]), eager(xs[0]))


def test_an_artifacts_speed_timed_in_one_process_stands_for_the_next_ones(
    monkeypatch, tmp_path, logs
):
    """The speed probe times eager calls in every process (each synchronised, the
    eager ones slower): for an artifact, its figures are kept beside it once judged
    and a later process's region reports them without timing again (regression:
    three eager calls and six device waits in every fresh process after build()).
    Every call takes a millisecond on the probe's clock: the figures say
    "slower" only where the test writes it (this CPU's verdict on the toy could
    say so at once)."""
    import itertools
    from types import SimpleNamespace

    artifact = tmp_path / "artifact"
    artifact.mkdir()
    runner = SimpleNamespace(path=artifact, device=torch.device("cpu"))
    aot_stand_in(monkeypatch, [], runner)
    timed: list = []
    shipped = SpeedProbe.time

    def counted(self, kind, *args, **kwargs):
        timed[-1].append(kind)
        return shipped(self, kind, *args, **kwargs)

    monkeypatch.setattr(SpeedProbe, "time", counted)
    ticks = itertools.count()
    monkeypatch.setattr(SpeedProbe, "clock", staticmethod(lambda: next(ticks) / 1e3))
    x = torch.randn(2, 4, 8, 8)
    reports = []
    for _ in range(2):  # a new module each time: nothing kept in this process
        core = zoo.ToyCore(4, 8).eval()
        timed.append([])
        with CompileSession(core, regions=("net",)) as session:
            with torch.no_grad():
                for _ in range(10):
                    core.net(x)
        reports.append(session.report.regions[0])
    first, later = reports
    # Three eager calls timed, after eager's own first call (untimed).
    assert timed[0].count("eager") == 4 and first.compiled_ms is not None
    assert not first.speed_earlier
    assert list(artifact.glob("speed-*.json"))
    assert timed[1] == [] and later.speed_earlier
    assert (later.compiled_ms, later.eager_ms) == (first.compiled_ms, first.eager_ms)
    assert later.compiled_range == first.compiled_range
    assert "(timed in an earlier process)" in session.report.summary()
    # Figures that say compiling does not pay off warn in the later process too.
    [kept] = artifact.glob("speed-*.json")
    figures = json.loads(kept.read_text())
    # (The verdict is judged again from the ranges when recalled: they say it.)
    slow = 2 * figures["eager_range"][1]
    kept.write_text(
        json.dumps(
            {
                **figures,
                "compiled_ms": slow,
                "compiled_range": [slow, slow],
                "slower": True,
            }
        )
    )
    core = zoo.ToyCore(4, 8).eval()
    with CompileSession(core, regions=("net",)) as session:
        with torch.no_grad():
            core.net(x)
    assert session.report.regions[0].slower
    warned = [
        m
        for m in messages(logs, "WARNING")
        if "runs slower compiled" in m and "timed in an earlier process" in m
    ]
    assert len(warned) == 1
    # A session that turns the probe off shows none of it.
    core = zoo.ToyCore(4, 8).eval()
    with CompileSession(core, regions=("net",), probe=False) as session:
        with torch.no_grad():
            core.net(x)
    off = session.report.regions[0]
    assert off.compiled_ms is None and not off.speed_earlier
