"""What compiled code is given at a call: the call's device."""

import torch

from earth2studio_compile.staging import Call, first_device

META = torch.device("meta")


def test_first_device_is_the_first_tensor_arguments_even_nested_in_kwargs():
    x = torch.empty(2, device=META)
    assert first_device((1, "a"), {"state": {"h": x}}) == META
    assert first_device((x,), {}, torch.nn.Linear(2, 2)) == META


def test_first_device_falls_back_to_the_modules_parameters_then_buffers():
    linear = torch.nn.Linear(2, 2, device=META)
    assert first_device((1,), {"k": None}, linear) == META
    norm = torch.nn.BatchNorm1d(2, affine=False, device=META)  # buffers only
    assert not list(norm.parameters())
    assert first_device((), {}, norm) == META


def test_first_device_is_the_cpu_without_any_tensor():
    assert first_device((1,), {}) == torch.device("cpu")
    assert first_device((1,), {}, torch.nn.ReLU()) == torch.device("cpu")
    # A call's device ignores the module: Call.of has none to fall back on.
    assert Call.of((1,), {}).device == torch.device("cpu")
