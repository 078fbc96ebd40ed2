"""The copy of a region's module a build process gets
(earth2studio_compile.artifacts.snapshot): the region's hooks left out, weights
copied, the structure picklable."""

from __future__ import annotations

import pickle

import torch
from tiny_cores import TinyModel

from earth2studio_compile import CompileSession
from earth2studio_compile.artifacts import snapshot


def test_the_snapshot_leaves_the_regions_hooks_out(background_on):
    model = TinyModel()
    with CompileSession(model, regions=["core"], precision="bf16", probe=False):
        assert "_compiled_call_impl" in model.core.__dict__
        copy = snapshot.snapshot_module(model.core)
    assert "_compiled_call_impl" not in copy.__dict__
    for a, b in zip(copy.parameters(), model.core.parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    # The copy pickles without the region (which holds locks and the report).
    pickle.loads(pickle.dumps(copy))


def test_the_pickle_check_skips_tensors_and_what_a_region_installed():
    model = TinyModel()
    model.core.scale = lambda t: t  # no build process could unpickle it
    try:
        snapshot.check_picklable({"module": model.core}, set())
    except Exception as err:
        assert "lambda" in str(err) or "pickle" in str(err).lower(), err
    else:
        raise AssertionError("a lambda passed the pickle check")
    # Skipped by id, it passes; tensors are never written (a 400 MB one here).
    skip = {id(model.core.scale)}
    snapshot.check_picklable({"module": model.core, "w": torch.empty(10**8)}, skip)
