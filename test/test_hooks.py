"""What a region changes on its module while installed (earth2studio_compile.hooks),
and that it puts everything back exactly."""

from __future__ import annotations

import torch

from earth2studio_compile.hooks import Hooks
from earth2studio_compile.models import ModelSpec


class _Core(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(4)
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def test_install_routes_calls_and_restore_leaves_the_module_as_it_was():
    core = _Core()
    before = dict(core.__dict__), dict(core.norm.__dict__)
    hooks = Hooks(core, "Model.core", ModelSpec(regions=("core",)), precision=None)
    calls = []

    def routed(*args, **kwargs):
        calls.append(args)
        return "routed"

    hooks.install(routed)
    assert core(torch.ones(1, 4)) == "routed" and len(calls) == 1
    hooks.restore(routed)
    assert dict(core.__dict__) == before[0] and dict(core.norm.__dict__) == before[1]
    assert isinstance(core(torch.ones(1, 4)), torch.Tensor)
    hooks.restore(routed)  # a second restore changes nothing


def test_fp32_islands_exist_only_under_bf16_and_are_undone():
    spec = ModelSpec(regions=("core",), fp32_modules=("LayerNorm",))
    assert Hooks(_Core(), "M.core", spec, precision="tf32").fp32 == []
    core = _Core()
    forward = core.norm.forward
    hooks = Hooks(core, "M.core", spec, precision="bf16")
    assert len(hooks.fp32) == 1
    hooks.install(lambda *a, **k: None)
    assert core.norm.forward != forward  # wrapped while installed
    hooks.restore(lambda *a, **k: None)
    assert core.norm.forward == forward and "forward" not in core.norm.__dict__


def test_a_slot_someone_else_replaced_is_left_to_them():
    core = _Core()
    hooks = Hooks(core, "M.core", ModelSpec(regions=("core",)), precision=None)
    ours = lambda *a, **k: "ours"  # noqa: E731
    hooks.install(ours)
    slot = next(k for k in core.__dict__ if core.__dict__[k] is ours)
    theirs = lambda *a, **k: "theirs"  # noqa: E731
    core.__dict__[slot] = theirs
    hooks.restore(ours)
    assert core.__dict__[slot] is theirs and not hooks.installed


class _AmpChecked(torch.nn.Module):
    """PhysicsNeMo's layers (StormCast's UNets): autocast refused unless
    ``amp_mode`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.amp_mode = False
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu") and not self.amp_mode:
            raise RuntimeError("amp_mode=False but torch autocast is enabled on: cpu")
        return self.proj(x)


def test_a_bf16_session_sets_physicsnemos_amp_mode_and_puts_it_back():
    """Regression: StormCast with precision="bf16" raised at its first call, and
    its eager fallback (in bf16 too) raised again (2026-11-30, CPU): bf16 is
    autocast, which PhysicsNeMo's layers refuse without ``amp_mode``."""
    from conftest import eager_backend, session_calls
    from tiny_cores import Holds

    owner, x = Holds(_AmpChecked()), torch.randn(2, 4)
    [want, _], got, session = session_calls(
        owner, [x, x], backend=eager_backend, precision="bf16"
    )
    assert session.report.regions[0].status == "compiled", session.report.summary()
    assert all(g.dtype == torch.float32 for g in got)
    assert (got[0] - want).norm() / want.norm() < 3e-2
    assert owner.net.amp_mode is False and "amp_mode" in vars(owner.net)
    spec = ModelSpec(regions=("net",))
    assert Hooks(Holds(_AmpChecked()), "M.net", spec, "tf32").amp == []
