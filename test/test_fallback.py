"""The fallback: a region turns eager, the caller's step answered eagerly.

A compiled call that fails is run again eagerly and the region stays eager, with
one WARNING; an error eager raises too is the caller's; a reduced precision that
fails eagerly too gives way to the caller's. The speed probe's verdict is tested
in test_probe.py, the Dynamo executor's failures and storms in
executors/test_executors_dynamo.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import FailingBackend, eager_backend, messages, session_calls
from tiny_cores import Holds

from earth2studio_compile import CompileSession
from earth2studio_compile.precision import ENV
from earth2studio_compile.tools import zoo


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


def test_error_that_eager_also_raises_is_the_callers(logs):
    core = zoo.ToyCore(4, 8).eval()
    with CompileSession(core, regions=("net",), backend=eager_backend) as session:
        with pytest.raises(RuntimeError):
            core(torch.randn(1, 3, 8, 8))  # wrong channel count: a user error
        with torch.no_grad():
            core(torch.randn(1, 4, 8, 8))
    region = session.report.regions[0]
    assert region.status == "compiled"  # the compiler was not at fault
    assert not messages(logs, "WARNING")


def test_a_precision_that_fails_eagerly_too_falls_back_to_the_callers(logs):
    """Regression: StormCast's regression UNet in bf16 on the CPU raised at its
    first call, compiled, and again in the fallback's eager call, which keeps the
    region's precision: the forecast ended (2026-11-30). Now the region runs
    eagerly in the caller's precision, with one WARNING that says so, and its
    answer is eager's."""

    class Refuses(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.proj(x)
            if y.dtype != torch.float32:  # physicsnemo's check, after autocast
                raise ValueError(f"Expected the dtype to be float32, got {y.dtype}")
            return y

    x = torch.randn(2, 4)
    [want, _], got, session = session_calls(
        Holds(Refuses()), [x, x], backend=eager_backend, precision="bf16"
    )
    assert all(torch.equal(g, want) for g in got)
    region = session.report.regions[0]
    assert region.status == "eager" and region.precision is None, region
    assert region.eager_calls == 2 and region.precision_error is None
    [warning] = messages(logs, "WARNING")
    assert "in bf16 it fails eagerly too" in warning and ENV in warning


def test_fp32_that_fails_eagerly_too_falls_back_to_the_callers(logs):
    """A model whose own wrapper autocasts (FCN3's, AIFS's) hands a region bf16
    tensors; fp32's scope turns that autocast off inside the region, and its
    fp32 weights then refuse the bf16 input, compiled and eagerly: the fallback
    re-raised for fp32 alone, and the forecast ended (CPU, 2026-12-01). fp32 now
    gives way to the caller's settings as the reduced precisions do."""

    class Autocast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.net(x.to(torch.bfloat16)).float()

    x = torch.randn(2, 4)
    [want, _], got, session = session_calls(
        Autocast(), [x, x], backend=eager_backend, precision="fp32"
    )
    assert all(torch.equal(g, want) for g in got)
    region = session.report.regions[0]
    assert region.status == "eager" and region.precision is None, region
    [warning] = messages(logs, "WARNING")
    assert "in fp32 it fails eagerly too" in warning and ENV in warning


class _RunsOut(torch.nn.Module):
    """Its eager call raises CUDA's out-of-memory error once ``short`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.short = torch.nn.Linear(6, 4), False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling() and self.short:
            self.short = False
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate")
        return self.proj(x)


class _Pair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 6), _RunsOut()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def _runs_out_in_b(runs_out: dict[str, bool]):
    """A backend whose compiled code for ``b`` (its input is 2 x 6) runs out of
    memory once ``runs_out["now"]`` is set, as a CUDA graph's replay would."""

    def backend(gm, example_inputs):
        def run(*args):
            if runs_out["now"] and any(t.shape == (2, 6) for t in args):
                runs_out["now"] = False
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate")
            return gm.forward(*args)

        return run

    return backend


def test_out_of_memory_beside_compiled_code_frees_it_and_runs_eagerly(logs):
    """Regression: FCN3's surface decoder, running eagerly beside fifteen
    artifacts' CUDA graphs (64 GiB), ran out of device memory and the forecast
    ended, where eager alone runs (H200, 2026-12-01). Now every region of the
    session turns eager, their compiled code is dropped, and the call runs again
    eagerly: the caller's answer is eager's, with one WARNING."""
    runs_out = {"now": False}
    model, x = _Pair().eval(), torch.randn(2, 4)
    with torch.no_grad():
        want = model(x)
    backend = _runs_out_in_b(runs_out)
    with CompileSession(model, regions=("a", "b"), backend=backend) as session:
        with torch.no_grad():
            model(x)
            runs_out["now"] = model.b.short = True  # compiled, then eager
            got = model(x)
            after = model(x)
    assert torch.equal(got, want) and torch.equal(after, want)
    a, b = session.report.regions
    assert a.status == b.status == "eager"
    assert "out of device memory beside compiled code" in a.reason
    assert b.eager_calls == 2 and a.eager_calls == 1
    [warning] = messages(logs, "WARNING")
    assert "ran out of device memory at step 2" in warning
    assert "_Pair.a, _Pair.b" in warning and "no output is lost" in warning


def test_out_of_memory_of_a_region_that_keeps_state_is_the_callers():
    """A region whose forward reassigns tensors on its modules may have changed
    them before it ran out: a second call could update its state twice."""
    runs_out = {"now": False}
    model, x = _Pair().eval(), torch.randn(2, 4)
    backend = _runs_out_in_b(runs_out)
    with CompileSession(model, regions=("a", "b"), backend=backend) as session:
        with torch.no_grad():
            model(x)
            session.report.regions[1].no_cudagraphs = "its forward reassigns h"
            runs_out["now"] = model.b.short = True
            with pytest.raises(torch.OutOfMemoryError):
                model(x)


def test_out_of_memory_without_compiled_code_is_the_callers():
    """Nothing compiled holds memory (the region fell back at its first call):
    the error is eager's own, from the one eager call."""
    model, x = _Pair().eval(), torch.randn(2, 4)
    with CompileSession(model, regions=("b",), backend=FailingBackend()):
        with torch.no_grad():
            model(x)
            model.b.short = True
            with pytest.raises(torch.OutOfMemoryError):
                model(x)


def test_out_of_memory_in_the_probes_eager_call_stops_the_probe(logs, same_speed):
    """Regression: FCN3's decoder ran compiled, then the speed probe's eager call
    of it asked for 20.4 GiB beside the CUDA graphs' pools, and every region of
    the session turned eager from step 5 (H200, 2026-12-02). That eager call is
    the probe's, not the forecast's: the probe stops without a verdict and the
    call runs compiled, as the ones before it did; no WARNING."""
    model, x = _Pair().eval(), torch.randn(2, 4)
    with torch.no_grad():
        want = model(x)
    with CompileSession(model, regions=("a", "b"), backend=eager_backend) as session:
        with torch.no_grad():
            got = []
            for call in range(1, 13):
                # Call 4 is the probe's first eager call (after the compile, the
                # quiet call and one timed compiled call).
                model.b.short = call == 4
                got.append(model(x))
    assert all(torch.equal(g, want) for g in got)
    a, b = session.report.regions
    assert a.status == b.status == "compiled", session.report.summary()
    assert b.compiled_ms is None and b.eager_calls == 0
    assert b.probe_stopped.startswith("not timed against eager: its eager call ran")
    assert "at step 4" in b.probe_stopped
    assert a.compiled_ms is not None and a.probe_stopped is None
    assert "_Pair.b: compiled" in session.report.summary()
    assert f", {b.probe_stopped}" in session.report.summary()
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")
