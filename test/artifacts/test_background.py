"""Background builds (earth2studio_compile.artifacts.background): when they are on,
the process started off the caller's step (the copy of the core it gets:
test_snapshot.py), old job directories swept, and where no build can start.

Background builds are on by default only on CUDA; these tests turn them on for
the CPU (``EARTH2STUDIO_COMPILE_BACKGROUND=on``, the ``background_on`` fixture).
The executor that runs eagerly meanwhile and switches to the artifact (with the
one real build) is tested in executors/test_executors_background.py, the build
process itself in test_build_process.py.
"""

from __future__ import annotations

import threading

import pytest
import torch
from tiny_cores import TinyModel

from earth2studio_compile import CompileSession
from earth2studio_compile.artifacts import background, store
from earth2studio_compile.metrics import rel_l2


def _eager(core, x):
    with torch.no_grad():
        return core(x)


def test_enabled_reads_the_environment(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(background.ENV, raising=False)
    assert not background.enabled(cpu) and background.enabled(cuda)
    monkeypatch.setenv(background.ENV, "off")
    assert not background.enabled(cuda)
    monkeypatch.setenv(background.ENV, "on")
    assert background.enabled(cpu)


def test_in_process_turns_background_builds_off_for_its_block_only(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setenv(background.ENV, "on")
    with background.in_process():
        assert not background.enabled(cuda)
    assert background.enabled(cuda)
    with pytest.raises(RuntimeError), background.in_process():
        raise RuntimeError("a failed judge")
    assert background.enabled(cuda)


def test_an_unpicklable_core_compiles_on_its_first_call(background_on):
    model = TinyModel()
    model.core.guard = threading.Lock()  # no build process can be given it
    x = torch.randn(4, 8)
    with CompileSession(model, regions=["core"], probe=False) as session:
        with torch.no_grad():
            out = model.core(x)
    [r] = session.report.regions
    assert r.status == "compiled" and r.executor == "dynamo", r
    assert any("cannot be handed to a build process" in d for d in r.declined), r
    assert rel_l2(out, _eager(model.core, x)) < 1e-5


def test_old_job_directories_are_swept(tmp_path):
    """A killed build process leaves its input (a copy of the weights): job
    directories older than a day go when the next job starts."""
    import os
    import time

    old, new = tmp_path / "old", tmp_path / "new"
    for d in (old, new):
        d.mkdir()
        (d / "job.pt").write_bytes(b"weights")
    day_ago = time.time() - background.STALE_S - 60
    os.utime(old, (day_ago, day_ago))
    assert background.sweep(tmp_path) == 1
    assert not old.exists() and (new / "job.pt").exists()


def test_no_build_lock_compiles_on_the_first_call(background_on, monkeypatch):
    """Where the file system has no flock, two processes could build the same
    artifact at once: no background build then, and no fallback either."""

    class NoFlock:
        def acquire(self, timeout=None):
            raise OSError("flock not supported")

    monkeypatch.setattr(store, "file_lock", lambda path: NoFlock())
    model = TinyModel()
    x = torch.randn(4, 8)
    with CompileSession(model, regions=["core"], probe=False) as session:
        with torch.no_grad():
            out = model.core(x)
    [r] = session.report.regions
    assert r.status == "compiled" and r.executor == "dynamo", r
    assert any("no build lock" in d for d in r.declined), r.declined
    assert rel_l2(out, _eager(model.core, x)) < 1e-5
