"""Build a region's ahead-of-time artifact in a child process, off the forecast's path.

A cold ``compile=True`` call used to stop at its first step for the whole compile
(27-50 s on an H100) before the forecast went on, so a short forecast took longer
than without compiling. Now a region with no artifact runs eagerly at once and
:func:`start` hands a copy of its core to a child process, which exports it and
compiles it with AOTInductor (:func:`~earth2studio_compile.artifacts.aot_build.
build_region`) into the persistent cache. The region switches to the artifact at a
step boundary once it is there and verified
(:mod:`earth2studio_compile.executors.background`); a process started later finds
it as if ``build()`` had run.

Why a child process and not a thread: the build changes process-wide torch state
(non-strict export swaps the module's parameters for fake ones while it traces;
Inductor reads the global TF32 flags while it lowers), which a thread would change
under the forecast's own eager steps; a thread would also hold the GIL for most of
the build's Python work (tracing, lowering) that the steps need. The child runs at
a lower CPU priority (``nice`` 10), with half the machine's cores for its compile
workers, one build of a cache at a time (the others wait), and holds its own
CUDA context plus a copy of the core's weights while it builds
(:mod:`.build_process`). It outlives the process that
started it (its own session), so a short forecast still leaves the artifact for the
next run; :func:`wait` waits for the ones this process started and
:func:`cancel` stops them. A job's own life (launch, poll, cancel) is
:mod:`.build_job`'s.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from loguru import logger

from earth2studio_compile.artifacts.aot_build import detached
from earth2studio_compile.artifacts.aot_key import aot_root
from earth2studio_compile.artifacts.build_job import BuildJob, locked, settings_of
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.snapshot import check_picklable, installed
from earth2studio_compile.cache import make_private_dir
from earth2studio_compile.precision import tf32_enabled

__all__ = [
    "ENV",
    "BuildJob",
    "building_here",
    "cancel",
    "deferred",
    "enabled",
    "in_process",
    "launch_later",
    "make_job",
    "settings_of",
    "start",
    "started",
    "track",
    "wait",
]

Job = TypeVar("Job", bound=BuildJob)

#: ``auto`` (the default: on CUDA devices), ``on`` or ``off``.
ENV = "EARTH2STUDIO_COMPILE_BACKGROUND"
_JOBS = ".jobs"
_started: list[BuildJob] = []
_started_lock = threading.Lock()

#: Builds whose launch waits for the end of a :func:`deferred` block.
_held: contextvars.ContextVar[list[BuildJob] | None] = contextvars.ContextVar(
    "earth2studio_compile_held_builds", default=None
)


#: Set inside :func:`in_process`: no region launches a child.
_in_process: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "earth2studio_compile_in_process", default=False
)


@contextlib.contextmanager
def in_process() -> Iterator[None]:
    """Inside this block :func:`enabled` is False: regions compile (and are
    judged) in this process, as with ``EARTH2STUDIO_COMPILE_BACKGROUND=off``.

    :func:`~earth2studio_compile.build` judges a Dynamo-path region in a session
    of its own calls: a region of that session must compile there, not run
    eagerly while a child judges it (ACE2 at published size was "skipped: not
    judged" on an H200). The environment is left alone: other threads and the
    children keep the caller's setting.
    """
    token = _in_process.set(True)
    try:
        yield
    finally:
        _in_process.reset(token)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold back the builds a closing session launches until the block ends.

    A short run's build is launched as its session closes (:func:`launch_later`).
    A workflow closes the session before its writers have finished: the build's
    copy of the weights and their save to disk (300 MB for FCN) would share the
    disk and the interpreter with the last writes, on the caller's clock. Inside
    this block they wait for its end, also when it raises (the artifact is for
    the next run).
    """
    held: list[BuildJob] = []
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)
        for job in held:
            job.launch()


def launch_later(job: BuildJob) -> None:
    """Launch ``job`` now, or at the end of the enclosing :func:`deferred` block.

    Parameters
    ----------
    job : BuildJob
        A job made with ``launch=False`` (launching a launched one does nothing)
    """
    held = _held.get()
    if held is None:
        job.launch()
    else:
        held.append(job)


def enabled(device: torch.device) -> bool:
    """Whether a region on ``device`` builds in the background (see :data:`ENV`).

    Parameters
    ----------
    device : torch.device
        Device of the region's first call

    Returns
    -------
    bool
        ``on``: always; ``off``: never; ``auto`` (or unset): on CUDA, where the
        child's compile workers have cores to spare and the artifact runs CUDA
        graphs
    """
    if _in_process.get():
        return False
    value = os.environ.get(ENV, "auto").strip().lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    if value not in ("", "auto"):
        logger.warning(f"{ENV}={value!r} is not auto, on or off: using auto.")
    return device.type == "cuda"


def start(
    target: RegionTarget,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    root: Path | None,
    launch: bool = True,
    key: str | None = None,
) -> BuildJob | str:
    """Start building ``target``'s artifact for these inputs in a child process.

    What runs here, on the caller's step (about 20 ms for FCN): the key, a copy
    of the inputs and a check that the module can be pickled (its structure, not
    its tensors). A thread copies the module (without the region's hooks), saves
    it and starts the child: those release the GIL for all but milliseconds.

    Parameters
    ----------
    target : RegionTarget
        The region (its module's hooks may be installed) and its settings
    args, kwargs : tuple, dict
        The first call's arguments
    root : Path | None
        Cache root (None: :func:`~earth2studio_compile.cache_root`)
    launch : bool, optional
        Launch it now; False makes a waiting job, launched by
        :meth:`BuildJob.launch` (a run too short to gain from the build then
        does not share the machine with it), by default True
    key : str | None, optional
        The artifact's key where the caller has it, by default computed here

    Returns
    -------
    BuildJob | str
        The job, or why no background build can start (the region then compiles
        on its first call as before)
    """
    directory = aot_root(root)
    if directory is None:
        return "the compile cache is off"
    label = target.label
    key = key or target.aot_key(args, kwargs)[0]
    artifact = directory / key
    make_private_dir(directory)
    try:
        busy = locked(artifact)
    except OSError as err:  # no flock here: no lock to keep two builds apart
        return f"no build lock on this file system ({err})"
    if busy:
        logger.debug(f"{label}: another process builds {artifact}; watching for it")
        return BuildJob(label, artifact, None)
    # With precision None the build follows PyTorch's global TF32 flags (they are
    # part of the key, and Inductor bakes them into kernels).
    job = make_job(
        BuildJob, target, args, kwargs, directory, artifact, key, key=key, root=root
    )
    if isinstance(job, BuildJob) and launch:
        job.launch()
    return job


def make_job(
    kind: type[Job],
    target: RegionTarget,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    directory: Path,
    artifact: Path,
    name: str,
    **fields: Any,
) -> Job | str:
    """A waiting job that hands ``target``'s core and these inputs to a process
    of its own, counted among this process's (:func:`wait`, :func:`cancel`).

    On the caller's step: a copy of the inputs and a check that the job can be
    pickled (its structure, not its tensors); the module is copied when the job
    launches (:meth:`BuildJob.launch`).

    Parameters
    ----------
    kind : type[BuildJob]
        The job's class (a build's, a judge's)
    target : RegionTarget
        The region (its module's hooks may be installed) and its settings
    args, kwargs : tuple, dict
        The first call's arguments
    directory : Path
        The cache's artifacts directory (``<root>/aot``): the job's own goes
        under its ``.jobs``
    artifact : Path
        What the job makes
    name : str
        Its job directory's prefix
    **fields : Any
        The rest of the payload; ``target``, ``args``, ``kwargs`` and ``tf32``
        (PyTorch's global TF32 flags now) are added

    Returns
    -------
    BuildJob | str
        The job, or why the core cannot be handed to another process
    """
    try:
        # Normal tensors, whatever mode the forecast runs in: the child traces them.
        with torch.inference_mode(False), torch.no_grad():
            args, kwargs = detached(tuple(args)), detached(dict(kwargs))
        payload = {
            **fields,
            "tf32": tf32_enabled(),
            "target": target,  # its module is copied on the thread
            "args": args,
            "kwargs": kwargs,
        }
        pickler = check_picklable(payload, installed(target.module))
    except Exception as err:  # an unpicklable model: compile it in this process
        why = f"{type(err).__name__}: {err}"
        return f"its core cannot be handed to a build process ({why})"
    jobs = directory / _JOBS
    make_private_dir(jobs)
    sweep(jobs)
    job = kind(target.label, artifact, Path(_mkdtemp(jobs, name)), pickler)
    job._payload = payload
    track(job)
    return job


def track(job: BuildJob) -> None:
    """Count ``job``, made elsewhere (a judge's: :mod:`.judge`), among this
    process's: :func:`wait` and :func:`cancel` then take it too.

    Parameters
    ----------
    job : BuildJob
        The job
    """
    with _started_lock:
        _started.append(job)


def wait(timeout: float | None = None) -> list[BuildJob]:
    """Wait for the background builds this process started (launching those
    still waiting).

    Parameters
    ----------
    timeout : float | None, optional
        Seconds to wait in all, by default as long as they take

    Returns
    -------
    list[BuildJob]
        Every job started, each with its final (or, past the timeout, current)
        state
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    jobs = started()
    for job in jobs:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        job.wait(left)
    return jobs


def started() -> list[BuildJob]:
    """The jobs this process started, copied (regions start them from any thread).

    Returns
    -------
    list[BuildJob]
        Every job started (or tracked: :func:`track`), in order
    """
    with _started_lock:
        return list(_started)


def building_here() -> bool:
    """Whether a build process this process launched is still running.

    A forecast launches one build at a time while it runs (the background
    executor asks this first): each launch copies a core's weights and starts a
    process that imports PyTorch, and Aurora's six at once took 2.2 s from the
    steps of a 20-step call (H100, 2026-11-27), for builds that compile one at a
    time anyway (:func:`~earth2studio_compile.artifacts.build_process.slot_path`).

    Returns
    -------
    bool
        True while one is running (launched, neither ended nor cancelled)
    """
    jobs = started()
    return any(
        j.directory is not None and not j.waiting and j.poll() == "running"
        for j in jobs
    )


def cancel() -> list[BuildJob]:
    """Stop the background builds this process started (:meth:`BuildJob.cancel`):
    a process that will not use their artifacts, nor leave them to another.

    Returns
    -------
    list[BuildJob]
        Every job started, each in its final state
    """
    jobs = started()
    for job in jobs:
        job.cancel()
    return jobs


#: Job directories older than this are removed when a new job starts: their logs
#: have been read or never will be, and a build process that was killed leaves
#: its input (a copy of the weights) behind.
STALE_S = 24 * 3600.0


def sweep(jobs: Path, older_than: float = STALE_S) -> int:
    """Remove job directories under ``jobs`` not touched for ``older_than`` seconds.

    Parameters
    ----------
    jobs : Path
        The directory of job directories (``<root>/aot/.jobs``)
    older_than : float, optional
        Age in seconds, by default :data:`STALE_S`

    Returns
    -------
    int
        How many were removed
    """
    now, removed = time.time(), 0
    for job in jobs.iterdir():
        try:
            if job.is_dir() and now - job.stat().st_mtime > older_than:
                shutil.rmtree(job, ignore_errors=True)
                removed += 1
        except OSError:  # another process swept it first
            continue
    return removed


def _mkdtemp(parent: Path, key: str) -> str:
    return tempfile.mkdtemp(dir=parent, prefix=f"{key}-{os.getpid()}-")
