"""The copy of a region's module a build process gets
(earth2studio_compile.artifacts.snapshot): the region's hooks left out, weights
copied, the structure picklable."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading

import torch
from tiny_cores import LINEAR_PATCH, TinyModel

from earth2studio_compile import CompileSession
from earth2studio_compile.artifacts import snapshot
from earth2studio_compile.patches import Patches, on_submodules


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
    assert snapshot.check_picklable({"module": model.core}, set()) is pickle
    model.core.guard = threading.Lock()  # no build process could be given it
    try:
        snapshot.check_picklable({"module": model.core}, set())
    except Exception as err:
        assert "lock" in str(err).lower(), err
    else:
        raise AssertionError("a lock passed the pickle check")
    # Skipped by id, it passes; tensors are never written (a 400 MB one here).
    skip = {id(model.core.guard)}
    snapshot.check_picklable({"module": model.core, "w": torch.empty(10**8)}, skip)


def test_a_module_holding_a_lambda_reaches_the_build_process(tmp_path):
    """Aurora's Swin attention holds ``lambda *args, **kwargs: 0`` for its unused
    LoRA layers: Python's pickle cannot take it, cloudpickle can, and another
    interpreter loads the job with ``torch.load`` alone, the lambda working."""
    model = TinyModel()
    model.core.extra = lambda *args, **kwargs: 2
    payload = {"module": model.core}
    pickler = snapshot.check_picklable(payload, set())
    assert pickler.__name__ == "cloudpickle"
    torch.save(payload, tmp_path / "job.pt", pickle_module=pickler)
    read = (
        "import sys, torch; p = torch.load(sys.argv[1], weights_only=False); "
        "print(p['module'].extra(1, k=2), type(p['module']).__name__)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run(
        [sys.executable, "-c", read, str(tmp_path / "job.pt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2", type(model.core).__name__]


def test_the_snapshot_leaves_the_table_s_patches_out():
    """A patch the table set on a submodule (a closure: not for Python's pickle)
    stays on the live module; the copy is bare, and the build process sets the
    target's patches itself."""
    model = TinyModel()
    with Patches(on_submodules((LINEAR_PATCH,), model)) as patches:
        assert len(patches.installed) == 2
        bound = model.core.a.__dict__["forward"]
        assert id(bound) in snapshot.installed(model.core)
        copy = snapshot.snapshot_module(model.core)
        assert model.core.a.__dict__["forward"] is bound
    assert "forward" not in copy.a.__dict__ and "forward" not in copy.b.__dict__
    assert snapshot.check_picklable(copy, set()) is pickle
