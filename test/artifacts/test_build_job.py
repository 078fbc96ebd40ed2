"""One background build as its starter sees it
(earth2studio_compile.artifacts.build_job): cancelled while it waits or while its
process runs, the process group gone and no artifact left.

The build process is replaced with a stand-in that sleeps (no compile here; the
real build is tested in test_build_process.py and the background executor's tests).
"""

from __future__ import annotations

import os
import time

import torch
from tiny_cores import TinyModel

from earth2studio_compile import CompileSession
from earth2studio_compile.artifacts import background, build_job
from earth2studio_compile.artifacts.store import META

_SLEEPER = "import time; time.sleep(120)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child not reaped yet is a zombie: gone for our purpose.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_running_build_is_cancelled_with_its_process(background_on, monkeypatch):
    monkeypatch.setattr(build_job, "CHILD", _SLEEPER)
    model = TinyModel()
    with CompileSession(model, regions=["core"], probe=False):
        with torch.no_grad():
            model.core(torch.randn(4, 8))
    jobs = background.wait(timeout=2)  # launched as the session closed
    job = jobs[-1]
    assert job.poll() == "running" and job.pid is not None
    start = time.monotonic()
    assert [j.poll() for j in background.cancel()][-1] == "failed"
    assert time.monotonic() - start < 10  # SIGTERM ends it, no grace period spent
    assert job.reason == "cancelled" and not _alive(job.pid)
    assert not (job.artifact / META).exists()


def test_a_waiting_build_is_never_launched_once_cancelled(background_on, monkeypatch):
    from earth2studio_compile.executors import background as executor

    monkeypatch.setattr(build_job, "CHILD", _SLEEPER)
    monkeypatch.setattr(executor, "LAUNCH_AFTER_S", 3600.0)
    model = TinyModel()
    with background.deferred():
        with CompileSession(model, regions=["core"], probe=False):
            with torch.no_grad():
                model.core(torch.randn(4, 8))
        job = background.cancel()[-1]
        assert job.poll() == "failed" and "before it was launched" in job.reason
    # The deferred block's end launches nothing for it.
    assert job.pid is None and job.poll() == "failed"


def test_the_core_is_copied_off_the_callers_step(background_on, monkeypatch):
    """The copy of the weights (300 MB for FCN) is the thread's, not the step's."""
    import threading

    seen: list[str] = []
    real = build_job.snapshot_module

    def spy(module):
        seen.append(threading.current_thread().name)
        return real(module)

    monkeypatch.setattr(build_job, "snapshot_module", spy)
    monkeypatch.setattr(build_job, "CHILD", "import sys; sys.exit(3)")
    model = TinyModel()
    with CompileSession(model, regions=["core"], probe=False):
        with torch.no_grad():
            model.core(torch.randn(4, 8))
    jobs = background.wait(timeout=60)
    assert seen and "MainThread" not in seen, seen
    assert jobs[-1].poll() == "failed" and "code 3" in jobs[-1].reason
