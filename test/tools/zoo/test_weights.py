"""The zoo's random weights (tools/zoo/weights.py and each entry's draws): every
layer of a zoo network matters.

A network initialised as for training may start with layers at zero: Aurora
zero-initialises its blocks' norm modulations, and the zoo's Aurora built that way
returned each Swin block's input unchanged, so the accuracy of its compiled stages
was never checked (a bf16 cost of 0.0 on an H200).
"""

from __future__ import annotations

import pytest
import torch

from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.zoo.weights import scramble


@pytest.mark.parametrize("name", zoo.MODELS)
def test_no_weight_matrix_of_a_zoo_network_is_zero(name):
    try:
        model = zoo.build(name)
    except ImportError as err:  # its package is installed for its own test job only
        pytest.skip(f"{name}: {err}")
    zeros = [
        n for n, p in model.named_parameters() if p.dim() > 1 and not p.detach().any()
    ]
    assert zeros == [], zeros


def test_scramble_redraws_zero_layers_and_keeps_scales_near_one():
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    torch.nn.init.zeros_(net[0].weight)
    scramble(net, torch.Generator().manual_seed(0))
    assert net[0].weight.any() and not net.training
    assert (net[1].weight - 1).abs().max() < 0.5
