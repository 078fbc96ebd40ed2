"""One background build as the process that started it sees it: a job.

A :class:`BuildJob` is made by :func:`.background.start` with its input (the first
call's arguments, the region's settings), waits or is launched at once; launching
copies the live module (:func:`.snapshot.snapshot_module`) and saves it on a thread,
then starts the build process (:mod:`.build_process`) in a session of its own, at
a lower CPU priority, with half the machine's cores for its compile workers (the
builds of a cache compile one at a time). The job is polled without blocking,
waited for, or cancelled.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from earth2studio_compile.artifacts.build_process import INPUT, RESULT, lock_path
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.snapshot import snapshot_module
from earth2studio_compile.artifacts.store import META, held

__all__ = ["CHILD", "BuildJob", "locked", "settings_of"]

_LOG = "build.log"

#: What a build process runs (``python -c CHILD JOB_DIR``). Not ``-m``: the package
#: has imported the module already (runpy warns).
CHILD = (
    "import sys; from earth2studio_compile.artifacts.build_process import main; "
    "sys.exit(main(sys.argv[1:]))"
)


def settings_of(target: RegionTarget) -> dict[str, Any]:
    """``target``'s fields but its module: what rebuilds it around another module
    (``RegionTarget(module=m, **settings_of(target))``)."""
    return {
        f.name: getattr(target, f.name)
        for f in dataclasses.fields(RegionTarget)
        if f.name != "module"
    }


class BuildJob:
    """One background build, as the process that started it sees it.

    Parameters
    ----------
    label, artifact, directory, pickler
        As the attributes of those names

    Attributes
    ----------
    label : str
        ``Model.region``
    artifact : Path
        Where the artifact will be (``<root>/aot/<key>``)
    directory : Path | None
        The job's directory (input, log, result); None when another process builds
        the same key and this job only watches for its artifact
    started : float
        ``time.monotonic()`` when the job was launched (or made, until then)
    pickler : ModuleType
        What saves the job for the build process (``torch.save``'s
        ``pickle_module``): :mod:`pickle` unless the module needs ``cloudpickle``
        (:func:`.snapshot.check_picklable`)
    """

    #: What its process runs instead of :data:`CHILD` (a judge's:
    #: :mod:`.judge`), None for a build
    child: str | None = None

    def __init__(
        self,
        label: str,
        artifact: Path,
        directory: Path | None,
        pickler: ModuleType = pickle,
    ) -> None:
        self.label = label
        self.artifact = artifact
        self.directory = directory
        self.pickler = pickler
        self.started = time.monotonic()
        self.finished: float | None = None
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._launch_error: str | None = None
        self._state = "running"
        self.reason: str | None = None
        self._thread: threading.Thread | None = None
        self._payload: dict[str, Any] | None = None

    @property
    def waiting(self) -> bool:
        """Made but not launched yet (:meth:`launch`)."""
        return self._payload is not None

    def launch(self) -> None:
        """Start the build now: a thread copies the module, saves the job and
        starts the build process. Nothing happens for a launched job."""
        payload, self._payload = self._payload, None
        if payload is None:
            return
        self.started = time.monotonic()
        self._thread = threading.Thread(
            target=_launch, args=(self, payload), name=f"build {self.label}"
        )
        self._thread.start()

    @property
    def log(self) -> Path | None:
        """The child's log (loguru and compiler output)."""
        return self.directory / _LOG if self.directory is not None else None

    @property
    def seconds(self) -> float:
        """Seconds since the job started, or that it took once finished."""
        end = self.finished if self.finished is not None else time.monotonic()
        return end - self.started

    def poll(self) -> str:
        """``"waiting"`` (not launched), ``"running"``, ``"built"`` or ``"failed"``
        (:attr:`reason` says why); never blocks."""
        if self.waiting:
            return "waiting"
        if self._state != "running":
            return self._state
        if self._launch_error is not None:
            return self._end("failed", self._launch_error)
        if self.directory is None:
            # Another process builds it: its artifact, or the lock freed without one.
            if (self.artifact / META).is_file():
                return self._end("built")
            if not locked(self.artifact):
                return self._end("failed", "another process's build left no artifact")
            return "running"
        if self._proc is None or self._proc.poll() is None:
            return "running"
        return self._read_result()

    def wait(self, timeout: float | None = None) -> str:
        """Launch the job if it waits, and wait for it to end (at most ``timeout``
        seconds); its state."""
        self.launch()
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._thread is not None:
            self._thread.join(timeout)
        while self.poll() == "running":
            if deadline is not None and time.monotonic() >= deadline:
                break
            if self._proc is not None:
                try:
                    self._proc.wait(0.5)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.5)
        return self.poll()

    def cancel(self) -> str:
        """Stop the build; its state after.

        A waiting job is never launched; a build process of this job is
        terminated with its compile workers (its own process group) and leaves no
        artifact (one is written whole or not at all). A build another process
        runs is left to it.

        Returns
        -------
        str
            ``"failed"`` (:attr:`reason`: cancelled), or the state it had reached
        """
        if self.waiting:
            self._payload = None
            return self._end("failed", "cancelled before it was launched")
        if self._thread is not None:
            self._thread.join()
        proc = self._proc
        if self._state != "running" or proc is None or proc.poll() is not None:
            return self.poll()
        _stop(proc)
        return self._end("failed", "cancelled")

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the child's log (empty without one)."""
        try:
            text = self.log.read_text(errors="replace") if self.log else ""
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def describe(self) -> str:
        """The job in words, for the report and its INFO line."""
        state = self.poll()
        if state == "built":
            return f"built in the background in {self.seconds:.1f} s ({self.artifact})"
        if state == "failed" and (self.reason or "").startswith("cancelled"):
            return f"background build {self.reason} after {self.seconds:.1f} s"
        if state == "failed":
            log = f"; log: {self.log}" if self.log is not None else ""
            took = f"{self.seconds:.1f} s"
            return f"background build failed after {took}: {self.reason}{log}"
        if state == "waiting":
            return (
                "to be built in the background when this run ends or has run a "
                f"while; its artifact goes to {self.artifact} for the next run"
            )
        pid = f", pid {self.pid}" if self.pid is not None else ""
        return (
            f"still building in the background ({self.seconds:.1f} s so far{pid}); "
            f"its artifact goes to {self.artifact} for the next run"
        )

    def _end(self, state: str, reason: str | None = None) -> str:
        self._state, self.reason = state, reason
        self.finished = time.monotonic()
        return state

    def _read_result(self) -> str:
        assert self.directory is not None
        try:
            result = json.loads((self.directory / RESULT).read_text())
        except Exception:  # the child died before it wrote one
            code = self._proc.returncode if self._proc is not None else None
            return self._end("failed", f"the build process ended with code {code}")
        if result.get("ok") and self._left():
            return self._end("built")
        return self._end("failed", str(result.get("reason") or "no artifact"))

    def _left(self) -> bool:
        """Whether what the job makes is there (an artifact: its ``meta.json``)."""
        return (self.artifact / META).is_file()


def locked(artifact: Path) -> bool:
    """Whether some process holds the build lock of ``artifact`` now."""
    return held(lock_path(artifact))


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # The child imports the model's classes by name, as this process found them.
    paths = [p for p in sys.path if p]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    cores = os.cpu_count() or 2
    # Half stay with the forecast (its steps, its writers, the copies' threads):
    # with all but two taken by builds, its eager calls slowed (.build_process).
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, cores // 2)))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _launch(job: BuildJob, payload: dict[str, Any]) -> None:
    """Copy the module, save it and start the child (on a thread: none of it is
    the step's)."""
    assert job.directory is not None
    try:
        target = payload["target"]
        with torch.inference_mode(False), torch.no_grad():  # this thread's modes
            snapshot = snapshot_module(target.module)
        payload["target"] = RegionTarget(module=snapshot, **settings_of(target))
        del target, snapshot
        torch.save(payload, job.directory / INPUT, pickle_module=job.pickler)
        del payload  # the copy's device memory goes back now
        with open(job.directory / _LOG, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", job.child or CHILD, str(job.directory)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_child_env(),
                # Its own session: Ctrl-C on the forecast and the forecast's exit
                # leave the build to finish for the next run.
                start_new_session=True,
            )
        job._proc, job.pid = proc, proc.pid
    except Exception as err:  # a full disk, no fork: the region stays eager
        job._launch_error = f"could not start the build ({type(err).__name__}: {err})"


def _stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Terminate ``proc``'s process group (it leads its own session), killing it
    after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
