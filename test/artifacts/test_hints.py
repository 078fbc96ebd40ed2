"""Hints of a region's first call: its inputs' structure kept, made-up inputs of the
same shapes given back, never the caller's random state or values."""

from __future__ import annotations

import json

import pytest
import torch

from earth2studio_compile.artifacts.hints import hint_path, recall, remember
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.tools import zoo


def _target(module=None):
    return RegionTarget.resolve(
        module if module is not None else zoo.ToyCore(4, 8).eval(),
        owner="tests.Toy",
        region="net",
        device=torch.device("cpu"),
        precision=None,
    )


def test_a_first_calls_inputs_come_back_made_up_with_their_shapes(tmp_path):
    target = _target()
    x, steps = torch.randn(2, 4, 8, 8), torch.arange(3)
    remember(target, tmp_path, (x,), {"steps": steps, "extra": [x[:1]]})
    text = hint_path(target, tmp_path).read_text()
    assert str(float(x.flatten()[0])) not in text  # shapes, never values
    state = torch.get_rng_state()
    args, kwargs, inference = recall(target, tmp_path)
    assert torch.equal(torch.get_rng_state(), state)
    assert args[0].shape == x.shape and args[0].dtype == x.dtype
    assert not torch.equal(args[0], x) and args[0].std() > 0.5
    assert kwargs["steps"].dtype == torch.int64 and not kwargs["steps"].any()
    assert kwargs["extra"][0].shape == (1, 4, 8, 8) and inference is False


def test_made_up_inputs_are_laid_out_as_the_first_calls(tmp_path):
    """The made-up call's artifact key then is the real call's (the layouts are in
    it), and the artifact reads the real inputs without a copy."""
    target = _target()
    x = torch.randn(8, 4).t()  # dense, transposed
    remember(target, tmp_path, (x, x[:1].expand(4, 8)), {})
    (made, expanded), _, _ = recall(target, tmp_path)
    assert made.stride() == x.stride() and made.std() > 0.5
    assert expanded.is_contiguous()  # an expanded input's build is of its clone
    assert (
        target.aot_key((made, expanded), {})[0]
        == target.aot_key((x, x[:1].expand(4, 8)), {})[0]
    )


def test_made_up_inputs_are_made_on_the_device_in_their_dtype(tmp_path, monkeypatch):
    """Drawn where the first call ahead runs, in their dtype: never drawn on the
    host and copied over (on a GPU, FCN's took most of a second), nor cast."""
    target = _target()
    remember(target, tmp_path, (torch.randn(2, 4, 8, 8).half(), torch.arange(3)), {})
    moved = []
    to = torch.Tensor.to
    monkeypatch.setattr(
        torch.Tensor, "to", lambda t, *a, **k: moved.append(a) or to(t, *a, **k)
    )
    (x, steps), _, _ = recall(target, tmp_path)
    assert not moved
    assert x.dtype == torch.float16 and x.device == target.device and x.std() > 0.5
    assert steps.dtype == torch.int64 and steps.device == target.device


@pytest.mark.gpu
def test_made_up_inputs_on_cuda_leave_every_random_state_alone(tmp_path):
    """On CUDA too, a generator of their own: neither the host's random state
    nor the device's moves."""
    target = RegionTarget.resolve(
        zoo.ToyCore(4, 8).eval().cuda(),
        owner="tests.Toy",
        region="net",
        device=torch.device("cuda"),
        precision=None,
    )
    remember(target, tmp_path, (torch.randn(2, 4, 8, 8, device="cuda"),), {})
    states = torch.get_rng_state(), torch.cuda.get_rng_state()
    (x,), _, _ = recall(target, tmp_path)
    assert x.is_cuda and x.shape == (2, 4, 8, 8) and x.std() > 0.5
    assert torch.equal(torch.get_rng_state(), states[0])
    assert torch.equal(torch.cuda.get_rng_state(), states[1])


def test_a_call_made_in_inference_mode_elsewhere_is_kept_as_such(tmp_path):
    """build() captures the core's call inside the model's inference mode and keeps
    its hint after it: the mode is the call's, not the one around remember()."""
    target = _target()
    x = torch.randn(2, 4, 8, 8)
    remember(target, tmp_path, (x,), {}, inference=True)
    assert recall(target, tmp_path)[2] is True
    with torch.inference_mode():
        remember(target, tmp_path, (x,), {}, inference=False)
    assert recall(target, tmp_path)[2] is False
    with torch.inference_mode():
        remember(target, tmp_path, (x,), {})
    assert recall(target, tmp_path)[2] is True


def test_what_is_not_kept_or_not_readable_gives_nothing(tmp_path):
    target = _target()
    remember(target, tmp_path, (torch.ones(1), 2.0), {})  # a number: not kept
    assert recall(target, tmp_path) is None
    assert hint_path(target, None) is None and recall(target, None) is None
    remember(target, tmp_path, (torch.ones(1),), {})
    path = hint_path(target, tmp_path)
    path.write_text("{not json")
    assert recall(target, tmp_path) is None
    path.write_text(json.dumps({"format": 0}))
    assert recall(target, tmp_path) is None


def test_another_size_of_the_core_is_another_region(tmp_path):
    small, large = _target(zoo.ToyCore(4, 8)), _target(zoo.ToyCore(4, 16))
    assert hint_path(small, tmp_path) != hint_path(large, tmp_path)
    remember(small, tmp_path, (torch.ones(1, 4, 8, 8),), {})
    assert recall(large, tmp_path) is None


def test_a_build_in_tf32_leaves_the_hint_a_forecast_under_the_tf32_flags_finds(
    tmp_path,
):
    """The hint is keyed by what the region computes in, as its artifact is:
    build(precision="tf32") leaves the one a forecast's region under PyTorch's TF32
    flags looks for (regression: it found none, so the first process after the
    build ran the artifact's first run at its first step,
    docs/bench/2026-11-28-h200-twentieth); with the flags off it is another."""
    from earth2studio_compile.precision import scope

    cuda, module = torch.device("cuda"), zoo.ToyCore(4, 8).eval()

    def target(precision):
        return RegionTarget.resolve(
            module, owner="tests.Toy", region="net", device=cuda, precision=precision
        )

    built = hint_path(target("tf32"), tmp_path)
    with scope("tf32", torch.device("cpu")):
        assert hint_path(target(None), tmp_path) == built
    with scope("fp32", torch.device("cpu")):
        assert hint_path(target(None), tmp_path) != built
