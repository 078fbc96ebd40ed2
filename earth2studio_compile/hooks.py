"""What a region changes on its module while installed, and puts back exactly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from earth2studio_compile._torch import MODULE_SLOT
from earth2studio_compile.opaque import OpaqueSubmodule, find_opaque
from earth2studio_compile.precision import KeepFp32
from earth2studio_compile.spec import ModelSpec


class Hooks:
    """What a region changes on its module while installed, and puts back.

    The module's call slot (the one ``nn.Module.compile()`` fills), and submodules
    wrapped inside it: fp32 islands under bf16, opaque operators. Under bf16 also
    the ``amp_mode`` flags of PhysicsNeMo's layers (StormCast's UNets), which
    refuse autocast unless set: bf16 is autocast, the mixed precision they allow
    with the flag set (without it a bf16 call raised, eager and compiled alike).

    Parameters
    ----------
    module : torch.nn.Module
        The region's module
    label : str
        The region's label, which names its opaque operators
    spec : ModelSpec
        The table entry that names the submodules' classes
    precision : str | None
        The region's precision: fp32 islands exist only under ``"bf16"``
    """

    def __init__(
        self,
        module: torch.nn.Module,
        label: str,
        spec: ModelSpec,
        precision: str | None,
    ) -> None:
        self.module = module
        self.installed = False
        self.opaque = [
            OpaqueSubmodule(m, f"{label}.{path}")
            for path, m in find_opaque(module, spec.opaque)
        ]
        self.fp32 = (
            [KeepFp32(m) for _, m in find_opaque(module, spec.fp32_modules)]
            if precision == "bf16"
            else []
        )
        self.amp = (
            [m for m in module.modules() if vars(m).get("amp_mode") is False]
            if precision == "bf16"
            else []
        )

    def install(self, call: Callable[..., Any]) -> None:
        """Route the module's calls to ``call``; wrap the submodules."""
        # Set through __dict__: nn.Module.__setattr__ would be fine for a plain
        # callable too, but this makes the single touched key explicit.
        self.module.__dict__[MODULE_SLOT] = call
        self.installed = True
        for m in self.amp:
            vars(m)["amp_mode"] = True
        # fp32 wrappers first: an opaque operator then calls the wrapped forward.
        for wrapper in self.fp32:
            wrapper.install()
        for op in self.opaque:
            op.install()

    def restore(self, call: Callable[..., Any]) -> None:
        """Put the module back exactly as it was: no slot left in its ``__dict__``."""
        if not self.installed:
            return
        if self.module.__dict__.get(MODULE_SLOT) is call:
            del self.module.__dict__[MODULE_SLOT]
        for op in reversed(self.opaque):
            op.restore()
        for wrapper in reversed(self.fp32):
            wrapper.restore()
        for m in self.amp:
            vars(m)["amp_mode"] = False
        self.installed = False
