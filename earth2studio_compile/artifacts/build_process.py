"""The background build's own process: build one region's artifact, then exit.

:mod:`earth2studio_compile.artifacts.background` saves a job (a copy of the core,
its inputs, its settings, the forecast's TF32 flags and the key the forecast will
look for) into a directory and starts this module's :func:`main` on it in a new
process. The artifact goes into the persistent cache through
:func:`~earth2studio_compile.artifacts.aot_build.build_region`; ``result.json`` says
how it went. One build per key at a time (a file lock beside the artifact), and
one build at a time in a cache (:func:`slot_path`): the others wait for it, so that
the forecasts beside them keep the machine's other cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import filelock
import torch
from loguru import logger

from earth2studio_compile.artifacts import refused, verified
from earth2studio_compile.artifacts.aot_build import build_region
from earth2studio_compile.artifacts.aot_key import aot_root
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.store import file_lock
from earth2studio_compile.cache import lock_timeout
from earth2studio_compile.patches import Patches, on_submodules
from earth2studio_compile.precision import tf32_enabled

__all__ = [
    "INPUT",
    "RESULT",
    "build_job",
    "build_turn",
    "lock_path",
    "lower_priority",
    "main",
    "run_job",
    "slot_path",
]

#: The job a build process is given, and what it leaves, in its directory.
INPUT = "job.pt"
RESULT = "result.json"


def lock_path(artifact: Path) -> Path:
    """The file lock held while ``artifact`` is built."""
    return artifact.parent / f"{artifact.name}.build.lock"


@contextlib.contextmanager
def build_turn(root: Path, key: str, label: str) -> Iterator[None]:
    """Hold the build lock of the artifact ``key`` under the cache ``root``, the
    one a background build of it holds: for ``build()``, which then waits for such
    a build to end and finds its artifact. Two compiles of one graph at once share
    Inductor's cache files half-written (two test processes, 2026-11-30: one
    packaged the other's empty JSON).

    Parameters
    ----------
    root : Path
        The cache root
    key : str
        The artifact's key
    label : str
        The region, for the log

    Raises
    ------
    filelock.Timeout
        Held by another process for ``EARTH2STUDIO_COMPILE_LOCK_TIMEOUT`` seconds
    """
    directory = aot_root(root)
    assert directory is not None
    directory.mkdir(parents=True, exist_ok=True)
    lock = file_lock(lock_path(directory / key))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        logger.info(f"{label}: another process builds it; waiting for it to end")
        lock.acquire(timeout=lock_timeout())
    try:
        yield
    finally:
        lock.release()


def slot_path(directory: Path) -> Path:
    """The file lock a build holds while it compiles, in the artifact directory
    ``directory``: one build at a time per cache.

    A StormCast forecast starts two builds at its first step (its two networks),
    an Aurora one six (its Swin stages). StormCast's two, compiling side by side on
    every core but two, made the forecast's own eager calls up to a quarter slower
    while they ran (H100 and H200, 2026-11-26), at ``nice`` 10. One at a time, each
    with half the machine's cores (:mod:`.build_job`), the forecast keeps the rest.
    """
    return directory / ".build.slot.lock"


def main(argv: list[str] | None = None) -> int:
    """The child: build the job in ``argv[0]`` (a job directory) at a lower
    priority; 0 when it left an artifact."""
    lower_priority()
    return 0 if build_job(Path((argv if argv is not None else sys.argv[1:])[0])) else 1


def lower_priority() -> None:
    """``nice`` 10 for this process, where the OS has it: the forecast beside it
    keeps its cores first."""
    try:
        os.nice(10)
    except (AttributeError, OSError):  # not on this OS: normal priority
        pass


def run_job(
    directory: Path, work: Callable[[dict[str, Any]], dict[str, Any]], what: str
) -> bool:
    """Run ``work`` on the job saved in ``directory``, under the forecast's TF32
    flags; write its ``result.json`` whatever happens, and remove the input.

    Sets PyTorch's global TF32 flags: call it in a process of its own.

    Parameters
    ----------
    directory : Path
        The job's directory
    work : Callable[[dict[str, Any]], dict[str, Any]]
        The job's payload -> its result (``ok``, and what it made or the
        ``reason`` it did not)
    what : str
        The job in words, for the log

    Returns
    -------
    bool
        The result's ``ok``
    """
    result: dict[str, Any] = {"ok": False}
    start_time = time.perf_counter()
    try:
        payload = torch.load(directory / INPUT, weights_only=False)
        matmul, conv = payload["tf32"]
        if (matmul, conv) != tf32_enabled():
            # A fresh process: the legacy setters cannot clash with the new API.
            torch.backends.cuda.matmul.allow_tf32 = matmul
            torch.backends.cudnn.allow_tf32 = conv
        result = work(payload)
        logger.info(f"{payload['target'].label}: {what} ended: {result}")
    except Exception as err:
        result["reason"] = f"{type(err).__name__}: {err}"
        logger.exception(f"{what} failed")
    finally:
        (directory / INPUT).unlink(missing_ok=True)
        result["seconds"] = time.perf_counter() - start_time
        (directory / RESULT).write_text(json.dumps(result))
    return bool(result.get("ok"))


def build_job(directory: Path) -> bool:
    """Build the artifact of the job in ``directory``; write its ``result.json``
    (:func:`run_job`).

    Returns
    -------
    bool
        Whether the artifact was built
    """
    return run_job(directory, _build, "background build")


def _build(payload: dict[str, Any]) -> dict[str, Any]:
    """The build of one job's payload: its result."""
    target: RegionTarget = payload["target"]
    # The copy is bare (.snapshot): the forecast's calls ran the table's patches.
    with Patches(on_submodules(target.patches, target.module)):
        return _build_patched(payload, target)


def _build_patched(payload: dict[str, Any], target: RegionTarget) -> dict[str, Any]:
    label = target.label
    key, _ = target.aot_key(payload["args"], payload["kwargs"])
    if key != payload["key"]:
        raise RuntimeError(
            f"this process computes the key {key}, the forecast's process "
            f"{payload['key']}: an artifact built here would never be found"
        )
    directory_root = aot_root(payload["root"])
    assert directory_root is not None
    lock = file_lock(lock_path(directory_root / key))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return {"ok": False, "reason": "another process builds the same artifact"}
    slot = file_lock(slot_path(directory_root))
    try:
        try:
            slot.acquire(timeout=0)
        except filelock.Timeout:
            logger.info(f"{label}: waiting for another build to end")
            slot.acquire()
        path = build_region(
            target, payload["args"], payload["kwargs"], root=payload["root"]
        )
        sealed = verified.seal_built(
            target, payload["args"], payload["kwargs"], payload["root"]
        )
        if sealed.wrong:
            assert sealed.why is not None
            reason = refused.refuse_artifact(path, sealed.why)
            return {"ok": False, "reason": reason}
        return {"ok": True, "path": str(path), "sealed": sealed.why}
    finally:
        if slot.is_locked:
            slot.release()
        lock.release()


if __name__ == "__main__":
    sys.exit(main())
