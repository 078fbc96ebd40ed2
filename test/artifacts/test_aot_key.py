"""An artifact's key (earth2studio_compile.artifacts.aot_key): each change of what the
key hashes declines the artifact, checked without rebuilding.
"""

from __future__ import annotations

import copy

import pytest
import torch
from aot_helpers import aot_target, load

from earth2studio_compile.patches import MethodPatch, Patches, source_digest


def _patched_filter_forward(self, x):
    return x


@pytest.mark.parametrize(
    "change",
    ["structure", "source", "table patch", "precision", "shape", "torch_version"],
)
def test_each_key_change_declines(built, monkeypatch, request, change):
    """``table patch``: a model table's method patch on a submodule (as Aurora's
    Swin blocks get) changes the code a region traces; before, the key left out
    every forward this package sets, and an artifact built from upstream's code
    would have served the patched one."""
    base, _ = aot_target(built.core, built.owner).aot_key(built.args, built.kwargs)
    module, args, precision = built.core, built.args, "fp32"
    if change == "structure":
        module = copy.deepcopy(built.core)
        module.register_buffer("extra", torch.zeros(1))
    elif change == "source":
        filter_cls = type(built.core.blocks[0].filter)
        monkeypatch.setattr(filter_cls, "forward", _patched_filter_forward)
    elif change == "table patch":
        block_filter = built.core.blocks[0].filter
        patch = MethodPatch(
            "forward",
            _patched_filter_forward,
            source=source_digest(type(block_filter).forward),
            submodules=type(block_filter).__name__,
        )
        patches = Patches([(block_filter, patch)])
        patches.install()
        request.addfinalizer(patches.restore)
        assert "forward" in block_filter.__dict__
    elif change == "precision":
        precision = "bf16"
    elif change == "shape":
        args = (torch.cat([built.args[0]] * 2),)
    else:
        monkeypatch.setattr(torch, "__version__", "9.9.9")
    key, _ = aot_target(module, built.owner, precision).aot_key(args, built.kwargs)
    assert key != base
    reason = load(built, module=module, args=args, precision=precision)
    assert isinstance(reason, str)
    assert "no artifact" in reason
