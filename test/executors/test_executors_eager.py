"""The eager executor (earth2studio_compile.executors.eager): the module's own call,
hooks included, past a region installed on the module; its first call is its first
run, and it keeps and claims nothing."""

from __future__ import annotations

import itertools

import torch
from tiny_cores import TinyCore

from earth2studio_compile.executors import EagerExecutor, Measured
from earth2studio_compile.metrics import Laps


def _hooked() -> tuple[TinyCore, list[str]]:
    """A core whose pre-hook doubles a positional input and whose hook adds one."""
    core, seen = TinyCore(), []

    def pre(module, args):
        seen.append("pre")
        return (2 * args[0],) if args else None

    def post(module, args, out):
        seen.append("post")
        return out + 1

    core.register_forward_pre_hook(pre)
    core.register_forward_hook(post)
    return core, seen


def test_the_first_call_is_the_first_run_of_the_modules_own_call():
    core, seen = _hooked()
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = core.forward(2 * x) + 1  # what the hooks make of forward
        ticks = itertools.count(1.0)
        laps = Laps(clock=lambda: next(ticks), start=0.0)
        seen.clear()
        out = EagerExecutor(core).first_call((x,), {}, laps)
    assert torch.equal(out, expected)
    assert seen == ["pre", "post"]
    assert laps.phases == {"first_run": 1.0}


def test_later_calls_pass_keywords_and_hooks_through():
    core, seen = _hooked()
    executor = EagerExecutor(core)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert torch.equal(executor(x=x), core.forward(x) + 1)
        assert torch.equal(executor(x), core.forward(2 * x) + 1)
    assert seen == ["pre", "post"] * 2


def test_it_calls_past_a_region_installed_on_the_module():
    """A region takes the module's calls through torch's compiled-call slot; the
    eager executor, which a region falls back to, must not call the region."""
    core = TinyCore()
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = core(x)
        core._compiled_call_impl = lambda *a, **k: "the region"
        assert core(x) == "the region"  # the slot is what a plain call takes
        assert torch.equal(EagerExecutor(core)(x), expected)


def test_it_compiles_nothing_and_keeps_nothing():
    core = TinyCore()
    executor = EagerExecutor(core)
    assert executor.name == "eager" and executor.module is core
    assert not (executor.cudagraphs or executor.compiling or executor.keepable)
    assert executor.source is None and executor.not_compiled is None
    with torch.no_grad():
        executor(torch.randn(4, 8))
    assert executor.measured == Measured()  # the region counts eager calls itself
    executor.detach()
    executor.release()
    assert executor.module is core
