"""The table's method patches: bitwise equal to upstream, set only while a session runs.

DLWP's ``get_cosine_zenith_fields`` computes one zenith field per distinct time
instead of one per member; ``_prepare_input``'s output and whole ensembles must stay
``torch.equal`` to upstream's, and the model must come back exactly as it was.
"""

from __future__ import annotations

import dataclasses
import types
from collections import OrderedDict
from datetime import timedelta as dt

import earth2studio.run as upstream
import numpy as np
import pytest
import torch
from conftest import assert_unchanged, eager_backend, messages, snapshot
from earth2studio.models.px import dlwp as dlwp_module

from earth2studio_compile import CompileSession, run
from earth2studio_compile.models import MODEL_TABLE, ModelSpec
from earth2studio_compile.patches import (
    DLWP_ZENITH,
    MethodPatch,
    dlwp_cosine_zenith_fields,
    patch_of,
    rolled,
    source_digest,
)
from earth2studio_compile.planning import table_patches
from earth2studio_compile.tools import zoo

KEY = "earth2studio.models.px.dlwp.DLWP"
NAME = "get_cosine_zenith_fields"
TIMES = {
    "one": ["2024-01-01T00:00"],
    "two": ["2024-01-01T00:00", "2024-06-30T17:30"],
    "repeated": ["2024-03-01T06:00", "2024-03-01T12:00", "2024-03-01T06:00"],
}


@pytest.fixture
def zenith_calls(monkeypatch):
    """How many zenith fields upstream's ``cos_zenith_angle`` computed."""
    calls = []
    real = dlwp_module.cos_zenith_angle

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(dlwp_module, "cos_zenith_angle", counted)
    return calls


def test_the_patch_is_for_the_installed_dlwp():
    # A new upstream version must be read again before the patch applies to it.
    assert source_digest(dlwp_module.DLWP.get_cosine_zenith_fields) == (
        DLWP_ZENITH.source
    )
    assert MODEL_TABLE[KEY].patches == (DLWP_ZENITH,)


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("times", list(TIMES))
def test_prepare_input_is_bitwise_upstreams(batch, times, zenith_calls):
    model = zoo.build("dlwp")
    coords = OrderedDict(time=np.array(TIMES[times], dtype="datetime64[ns]"))
    face = model.latgrid.shape[-1]
    x = torch.randn(batch, len(coords["time"]), 2, 7, 6, face, face)
    ref = model._prepare_input(x, coords)
    assert len(zenith_calls) == 2 * x.shape[0] * x.shape[1]  # upstream: per sample
    zenith_calls.clear()
    model.get_cosine_zenith_fields = types.MethodType(dlwp_cosine_zenith_fields, model)
    out = model._prepare_input(x, coords)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert out.is_contiguous() and torch.equal(out, ref)
    # Once per distinct time and lead time, whatever the batch.
    assert len(zenith_calls) == 2 * len(set(TIMES[times]))


def _ensemble(workflow, model, **kwargs):
    from earth2studio.io import ZarrBackend
    from earth2studio.perturbation import Gaussian

    np.random.seed(0)
    torch.manual_seed(0)
    io = ZarrBackend()
    workflow(
        ["2024-01-01T00:00", "2024-01-01T06:00"],
        2,
        5,
        model,
        zoo.random_source(model),
        io,
        Gaussian(noise_amplitude=0.05, seed=0),
        batch_size=2,
        device=torch.device("cpu"),
        verbose=False,
        **kwargs,
    )
    return {k: np.asarray(io.root[k][:]) for k in io.root.array_keys()}


def test_ensemble_with_the_patch_is_bitwise_upstreams(monkeypatch, zenith_calls):
    """5 members in batches of 2 (an uneven last batch), 2 times, 2 steps: every
    array of our ``compile=True`` workflow equals upstream's eager one bitwise. The
    core runs eagerly (the entry without regions), so only the patch differs."""
    model = zoo.build("dlwp")
    expected = _ensemble(upstream.ensemble, model)
    upstream_calls = len(zenith_calls)
    zenith_calls.clear()
    eager_core = dataclasses.replace(
        MODEL_TABLE[KEY],
        regions=(),
        covers=("model",),
        reason="the core eager, for a bitwise test",
    )
    monkeypatch.setitem(MODEL_TABLE, KEY, eager_core)
    before = snapshot(model)
    got = _ensemble(run.ensemble, model, compile=True)
    assert [r.status for r in run.last_report().regions] == ["skipped"]
    assert_unchanged(model, before)
    assert NAME not in model.__dict__
    # Per call: 2 distinct times x 2 lead times, not x the batch's members.
    assert 0 < len(zenith_calls) < upstream_calls
    assert got.keys() == expected.keys() and len(expected) > 4
    for name, ref in expected.items():
        assert got[name].dtype == ref.dtype, name
        np.testing.assert_array_equal(got[name], ref, err_msg=name, strict=True)


def test_set_on_the_instance_in_a_session_and_removed_after(zenith_calls):
    model = zoo.build("dlwp")
    before = snapshot(model)
    x, coords = (
        torch.randn(4, 1, 2, 7, 6, 8, 8),
        OrderedDict(time=np.array(TIMES["one"], dtype="datetime64[ns]")),
    )
    with CompileSession(model, backend=eager_backend):
        assert NAME in model.__dict__  # the instance's, never the class's
        assert dlwp_module.DLWP.__dict__[NAME] is not dlwp_cosine_zenith_fields
        inside = model._prepare_input(x, coords)
        assert len(zenith_calls) == 2
    assert_unchanged(model, before)
    assert NAME not in model.__dict__
    zenith_calls.clear()
    assert torch.equal(model._prepare_input(x, coords), inside)
    assert len(zenith_calls) == 8  # upstream's again


def test_a_session_computes_each_time_once_across_steps(zenith_calls):
    """A rollout asks for its initial times' fields at every step: the session keeps
    the first result and hands out copies, bitwise upstream's; a caller writing to
    one changes no later one; new times or a grid written to are computed anew."""
    model = zoo.build("dlwp")
    x = torch.randn(4, 1, 2, 7, 6, 8, 8)
    coords = OrderedDict(time=np.array(TIMES["one"], dtype="datetime64[ns]"))
    expected = model._prepare_input(x, coords)
    zenith_calls.clear()
    with CompileSession(model, backend=eager_backend):
        times = np.tile(coords["time"], 4)  # as _prepare_input asks, per member
        first = model.get_cosine_zenith_fields(times, -dt(hours=6), "cpu")
        first.fill_(7.0)  # the caller's copy, not the kept one
        outs = [model._prepare_input(x, coords) for _ in range(3)]
        assert len(zenith_calls) == 2  # -6 h and 0 h, once each
        other = OrderedDict(time=np.array(TIMES["two"], dtype="datetime64[ns]"))
        model._prepare_input(torch.randn(1, 2, 2, 7, 6, 8, 8), other)
        assert len(zenith_calls) == 2 + 2 * 2
        with torch.no_grad():
            model.latgrid.add_(0.0)  # same values, a new version: computed again
        assert torch.equal(model._prepare_input(x, coords), expected)
        assert len(zenith_calls) == 2 + 2 * 2 + 2
    assert all(torch.equal(out, expected) for out in outs)
    assert NAME not in model.__dict__


def test_compile_false_leaves_upstreams_method(zenith_calls, monkeypatch):
    model = zoo.build("dlwp")
    seen = []
    original = dlwp_module.DLWP._prepare_input

    def spy(self, *args):
        seen.append(NAME in self.__dict__)
        return original(self, *args)

    monkeypatch.setattr(dlwp_module.DLWP, "_prepare_input", spy)
    _ensemble(run.ensemble, model, compile=False)
    assert seen and not any(seen)


def test_a_failing_patch_falls_back_to_upstream_with_one_warning(monkeypatch, logs):
    def broken(self, *args, **kwargs):
        raise RuntimeError("injected patch failure")

    patch = dataclasses.replace(DLWP_ZENITH, replacement=broken)
    monkeypatch.setitem(
        MODEL_TABLE, KEY, dataclasses.replace(MODEL_TABLE[KEY], patches=(patch,))
    )
    model = zoo.build("dlwp")
    before = snapshot(model)
    x = torch.randn(3, 1, 2, 7, 6, 8, 8)
    coords = OrderedDict(time=np.array(TIMES["one"], dtype="datetime64[ns]"))
    expected = model._prepare_input(x, coords)
    with CompileSession(model, backend=eager_backend):
        outs = [model._prepare_input(x, coords) for _ in range(3)]
        assert NAME not in model.__dict__  # upstream's from the first failure on
    assert all(torch.equal(out, expected) for out in outs)
    warnings = [m for m in messages(logs, "WARNING") if NAME in m]
    assert len(warnings) == 1 and "injected patch failure" in warnings[0]
    assert_unchanged(model, before)


def test_other_code_keeps_its_own_method():
    """A subclass that overrides the method, or an instance that sets its own, is
    not what the patch was written for."""

    class Own(dlwp_module.DLWP):
        def get_cosine_zenith_fields(self, times, lead_time, device="cuda"):
            return super().get_cosine_zenith_fields(times, lead_time, device)

    model = zoo.build("dlwp")
    cls = type(model)
    model.__class__ = type("Sub", (Own, cls), {})
    with CompileSession(model, backend=eager_backend):
        assert NAME not in model.__dict__
    own = types.MethodType(dlwp_module.DLWP.get_cosine_zenith_fields, model)
    model.__class__ = cls
    model.__dict__[NAME] = own
    with CompileSession(model, backend=eager_backend):
        assert model.__dict__[NAME] is own
    assert model.__dict__[NAME] is own


def test_a_spec_takes_only_method_patches():
    with pytest.raises(TypeError, match="MethodPatch"):
        ModelSpec(regions=("model",), patches=("get_cosine_zenith_fields",))


@pytest.mark.parametrize(
    ("shifts", "dims"),
    [
        ((-1, -3, -6), (1, 2, 3)),
        ((1, 3, 6), (1, 2, 3)),
        ((0, 7), (0, 2)),
        ((-9,), (3,)),
    ],
)
def test_rolled_is_torch_roll_bit_for_bit(shifts, dims):
    """Aurora's patch shifts by slices concatenated: the same values as
    ``torch.roll``, for shifts up and down, zero and past a dimension's size."""
    x = torch.randn(2, 4, 6, 8, 3)
    assert torch.equal(rolled(x, shifts, dims), torch.roll(x, shifts, dims))


class _Inner(torch.nn.Module):
    def forward(self, x):
        return x + 1


def _inner_plus_two(self, x):
    return x + 2


def test_a_patch_for_submodules_is_set_on_each_and_removed(monkeypatch):
    """A patch naming ``submodules`` is set on every submodule of that class (the
    model's own method is left), and removed when the session ends."""
    model = zoo.build("dlwp")
    inner = [_Inner(), _Inner()]
    model.extra = torch.nn.ModuleList(inner)
    patch = MethodPatch(
        "forward",
        _inner_plus_two,
        source=source_digest(_Inner.forward),
        submodules="_Inner",
    )
    spec = dataclasses.replace(MODEL_TABLE[KEY], patches=(patch,))
    monkeypatch.setitem(MODEL_TABLE, KEY, spec)
    assert [m for m, _ in table_patches(model)] == inner
    with CompileSession(model, backend=eager_backend):
        for m in inner:
            assert patch_of(m.__dict__["forward"]) is patch
            assert torch.equal(m(torch.zeros(1)), torch.full((1,), 2.0))
        assert "forward" not in model.__dict__
    assert all("forward" not in m.__dict__ for m in inner)
