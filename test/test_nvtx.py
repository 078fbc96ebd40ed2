"""NVTX ranges quieted for the duration of each call of a region whose model's
entry sets ``quiet_nvtx``: the functions put back after every call, also one that
raises, and after nested and overlapping windows.

``range_push``/``range_pop`` are replaced here by functions that record their calls
(what a core's NVTX call reached); a backend that compiles nothing still has Dynamo
trace, so the region's calls run traced code.
"""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import eager_backend

from earth2studio_compile import CompileSession, nvtx, register_model
from earth2studio_compile.models import MODEL_TABLE

NVTX = torch.cuda.nvtx
NAMES = ("range_push", "range_pop", "range", "mark")


class Ranged(torch.nn.Module):
    """A core marking a layer with an NVTX range, as physicsnemo's HEALPix padding
    does where CUDA is available (work on both sides: a break there splits the
    graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(x)
        torch.cuda.nvtx.range_push("Ranged:lin")
        y = self.lin(x)
        torch.cuda.nvtx.range_pop()
        return y * 2


class RangedModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.core = Ranged()


@pytest.fixture
def recorded(monkeypatch):
    """``range_push``/``range_pop`` recording their calls; the list and the two."""
    calls: list[str] = []

    def push(msg: str) -> int:
        calls.append(msg)
        return 0

    def pop() -> int:
        calls.append("pop")
        return 0

    monkeypatch.setattr(NVTX, "range_push", push)
    monkeypatch.setattr(NVTX, "range_pop", pop)
    return calls, push, pop


@pytest.fixture
def model():
    """A fresh ``RangedModel``; its table entry is the test's, removed after."""
    yield RangedModel().eval()
    MODEL_TABLE.pop(f"{RangedModel.__module__}.{RangedModel.__qualname__}", None)


def _calls(model: RangedModel, session: CompileSession, n: int = 3) -> None:
    with session, torch.no_grad():
        for _ in range(n):
            model.core(torch.randn(2, 4))


def test_a_quiet_region_reaches_no_nvtx_function_and_restores_them_after_each_call(
    recorded, model
):
    calls, push, pop = recorded
    register_model(RangedModel, regions=("core",), quiet_nvtx=True)
    seen = []
    with CompileSession(model, backend=eager_backend) as session, torch.no_grad():
        for _ in range(3):
            model.core(torch.randn(2, 4))
            seen.append((NVTX.range_push, NVTX.range_pop))
    assert seen == [(push, pop)] * 3  # put back after each call, not at the end
    assert calls == []
    (region,) = session.report.regions
    assert region.status == "compiled" and region.graph_breaks == 0


def test_a_region_without_quiet_nvtx_reaches_them(recorded, model):
    # The control: the recording functions do see a region's calls.
    calls, _, _ = recorded
    register_model(RangedModel, regions=("core",))
    _calls(model, CompileSession(model, backend=eager_backend))
    # Three calls, and the first call's eager call beside it (the check against eager).
    assert calls == ["Ranged:lin", "pop"] * 4


def test_a_call_that_raises_restores_the_nvtx_functions(recorded, model):
    calls, push, pop = recorded
    register_model(RangedModel, regions=("core",), quiet_nvtx=True)
    with CompileSession(model, backend=eager_backend), torch.no_grad():
        with pytest.raises(RuntimeError):
            model.core(torch.randn(2, 3))  # wrong width: eager raises it too
        assert (NVTX.range_push, NVTX.range_pop) == (push, pop)
        with pytest.raises(RuntimeError):
            model.core(torch.randn(2, 3))
    assert (NVTX.range_push, NVTX.range_pop) == (push, pop)
    assert calls == []


def _real_nvtx_works() -> bool:
    try:
        NVTX.range_push("probe")
        NVTX.range_pop()
    except RuntimeError:  # a CPU-only build: "NVTX functions not installed"
        return False
    return True


@pytest.mark.skipif(not _real_nvtx_works(), reason="this torch build has no NVTX")
@pytest.mark.parametrize("quiet", [False, True])
def test_torch_nvtx_calls_break_the_graph_unless_quieted(model, quiet):
    """PyTorch's own ``range_push``/``range_pop`` (a CUDA build's work without a
    GPU) are what broke DLESyM's graphs on CUDA; quieted, one graph."""
    register_model(RangedModel, regions=("core",), quiet_nvtx=quiet)
    session = CompileSession(model, backend=eager_backend)
    _calls(model, session)
    (region,) = session.report.regions
    assert region.status == "compiled"
    assert (region.graph_breaks > 0) != quiet, region
    assert region.recompiles == 0, region


# -- the window itself ---------------------------------------------------------------


def _originals() -> tuple:
    return tuple(getattr(NVTX, n) for n in NAMES)


def test_nested_windows_restore_at_the_outermost_end():
    before = _originals()
    with nvtx.quiet(True):
        inside = _originals()
        assert not set(inside) & set(before)
        with nvtx.quiet(True):
            assert _originals() == inside  # the same no-ops: Dynamo's guards hold
        assert _originals() == inside
    assert _originals() == before
    with nvtx.quiet(True):
        assert _originals() == inside  # and the same in the next window
    with nvtx.quiet(False):
        assert _originals() == before


def test_the_no_ops_do_nothing_and_keep_range_a_context_manager():
    with nvtx.quiet(True):
        assert NVTX.range_push("x") == 0 and NVTX.range_pop() == 0
        assert NVTX.mark("x") is None
        with NVTX.range("a {}", 1):
            pass


def test_overlapping_windows_of_two_threads_restore_when_the_last_closes():
    before = _originals()
    opened, close_first = threading.Event(), threading.Event()
    seen = []

    def first() -> None:
        with nvtx.quiet(True):
            opened.set()
            close_first.wait(10)

    thread = threading.Thread(target=first)
    thread.start()
    assert opened.wait(10)
    with nvtx.quiet(True):
        close_first.set()
        thread.join(10)
        seen.append(_originals())  # the first window closed; this one is open
    assert not set(seen[0]) & set(before)
    assert _originals() == before


def test_a_window_that_raises_restores_them():
    before = _originals()
    with pytest.raises(KeyError), nvtx.quiet(True):
        raise KeyError("x")
    assert _originals() == before


def test_a_function_replaced_inside_the_window_is_left_as_replaced():
    before = _originals()

    def profiler_push(msg: str) -> int:
        return 1

    try:
        with nvtx.quiet(True):
            NVTX.range_push = profiler_push  # a profiler's, say
        assert NVTX.range_push is profiler_push
        assert _originals()[1:] == before[1:]
    finally:
        NVTX.range_push = before[0]
