"""Tensor state a region's modules keep on themselves (module_state.py): what a
call reassigned, and copying it out of a CUDA graph's memory. The region's use of
it (leaving CUDA graphs, the close) is tested in test_first_call.py."""

from __future__ import annotations

import torch
from tiny_cores import RecurrentCore

from earth2studio_compile.module_state import HeldTensors, describe, take_out


def test_a_call_that_reassigns_state_is_seen_buffers_and_parameters_alike():
    core = RecurrentCore(2)
    core.register_buffer("scale", torch.ones(1))
    held = HeldTensors(core)
    with torch.no_grad():
        core(torch.randn(1, 2, 4, 4))
        core.conv.weight.mul_(2)  # in place: the same tensor, not reassigned
    assert [h.path for h in held.changed()] == ["cell.h"]
    core.scale = torch.zeros(1)  # a buffer reassigned
    assert describe(held.changed()) == "scale, cell.h"


def test_take_out_copies_keeping_values_the_slot_and_inference():
    core = RecurrentCore(2)
    held = HeldTensors(core)
    with torch.inference_mode():
        core(torch.randn(1, 2, 4, 4))
    (state,) = held.changed()
    old = core.cell.h
    take_out([state])
    new = core.cell.h
    assert new is not old and torch.equal(new, old)
    assert new.is_inference() and "h" in vars(core.cell)


def test_describe_names_the_first_few():
    core = torch.nn.ModuleList(RecurrentCore(1) for _ in range(5))
    held = HeldTensors(core)
    with torch.no_grad():
        for c in core:
            c(torch.randn(1, 1, 2, 2))
    assert describe(held.changed()) == "0.cell.h, 1.cell.h, 2.cell.h and 2 more"
