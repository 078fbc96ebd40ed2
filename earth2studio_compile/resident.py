"""Compiled regions kept ready in this process for the next session over the same core.

Each session used to make its compiled code again: Dynamo traces anew for a new
``torch.compile`` wrapper, CUDA graphs are recorded again, the speed probe and the
fp32 accuracy check run again (2-4.5 s per workflow call on an H100, with nothing
left to compile). Now a region that ran compiled leaves its executor here when its
session closes (:func:`keep`), and the next region over the same module with the
same settings takes it back (:func:`take`): it runs compiled from its first call,
and its report carries the figures measured the first time.

What is kept is keyed by what the code was compiled with
(:meth:`~earth2studio_compile.artifacts.key.RegionTarget.resident_key`: the owner
and path, the resolved policy, precision, device) and checked against the module
before it runs (:func:`fingerprint`): the module classes and training flags, and
every parameter and buffer by name, shape, dtype, storage and version counter. A
module whose weights were loaded, moved or replaced since, or whose structure
changed, is compiled anew: kept code never runs on a model it was not made for.

The user's module carries nothing between sessions (no attribute, no hook). The
shelf refers to modules weakly, and kept Dynamo code reaches its module through a
weak reference (:func:`earth2studio_compile._torch.compile_region`), so a model the
user drops is freed with what was kept for it. Kept CUDA graphs keep their memory
pool until then, or until :func:`release`.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile.artifacts import speed
from earth2studio_compile.executors import Executor
from earth2studio_compile.report import RegionReport

__all__ = ["Kept", "fingerprint", "keep", "release", "take"]

#: The speed probe's report fields (and whether an earlier process timed them): not
#: shown in a session that turned the probe off.
SPEED = (*speed.FIGURES, "speed_earlier")
#: Report fields measured once per kept executor and carried to later sessions.
CARRIED = (
    "mode",
    "executor",
    "graphs",
    "graph_breaks",
    "cache",
    "cache_source",
    "artifact",
    *SPEED,
    "precision_error",
    "no_cudagraphs",
)


@dataclass
class Kept:
    """A region's executor between sessions, with what its first session measured.

    Attributes
    ----------
    executor : Executor
        The compiled executor, ready to run
    fingerprint : tuple
        :func:`fingerprint` of the module when it was kept
    padding : int | None
        The batch size the executor was compiled for (smaller batches are padded)
    figures : dict[str, Any]
        The report's :data:`CARRIED` fields
    first_seconds : float
        What the region's first call cost when it compiled
    sessions : int
        Sessions that ran this executor so far
    """

    executor: Executor
    fingerprint: tuple[Any, ...]
    padding: int | None
    figures: dict[str, Any] = field(default_factory=dict)
    first_seconds: float = 0.0
    sessions: int = 1


_shelf: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Kept]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def fingerprint(module: torch.nn.Module) -> tuple[Any, ...] | None:
    """The module's structure and tensors as kept code depends on them.

    Parameters
    ----------
    module : torch.nn.Module
        A region's core

    Returns
    -------
    tuple | None
        Equal tuples mean the same classes, training flags and tensors (same
        storage, not updated in place); None when a tensor keeps no version counter
        (an inference tensor), so an update could not be seen: nothing is kept then
    """
    tensors = []
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if t.is_inference():
            return None
        tensors.append(
            (
                name,
                tuple(t.shape),
                t.dtype,
                t.device,
                t.data_ptr(),
                _torch.tensor_version(t),
            )
        )
    layout = tuple((type(m), m.training) for m in module.modules())
    return layout, tuple(tensors)


def keep(
    module: torch.nn.Module,
    name: str,
    executor: Executor,
    report: RegionReport,
    padding: int | None,
    earlier: Kept | None = None,
) -> bool:
    """Keep a region's executor for the next session over ``module``.

    Parameters
    ----------
    module : torch.nn.Module
        The region's core
    name : str
        ``RegionTarget.resident_key()`` of the region
    executor : Executor
        Its compiled executor, detached (``executor.keepable`` must be True)
    report : RegionReport
        The closing session's report, whose measured figures are carried
    padding : int | None
        The batch size the executor was compiled for
    earlier : Kept | None, optional
        The entry the session took, when it ran kept code, by default None

    Returns
    -------
    bool
        Whether it was kept (not when :func:`fingerprint` cannot see updates)
    """
    seal = fingerprint(module)
    if seal is None or not executor.keepable:
        return False
    figures = {f: getattr(report, f) for f in CARRIED}
    first, sessions = report.compile_seconds, 1
    if earlier is not None and earlier.executor is executor:
        # Figures a shorter earlier session could not measure come from this one.
        figures = {
            f: v if v is not None else earlier.figures.get(f)
            for f, v in figures.items()
        }
        first, sessions = earlier.first_seconds, earlier.sessions + 1
    with _lock:
        _shelf.setdefault(module, {})[name] = Kept(
            executor, seal, padding, figures, first, sessions
        )
    return True


def take(module: torch.nn.Module, name: str) -> Kept | None:
    """The executor kept for ``module`` under ``name``, if it still fits the module.

    The entry leaves the shelf: one session runs it at a time, and it comes back
    with :func:`keep` when that session closes. An entry that no longer fits the
    module (weights loaded, moved or replaced, structure changed) is dropped.

    Parameters
    ----------
    module : torch.nn.Module
        The region's core
    name : str
        ``RegionTarget.resident_key()`` of the region

    Returns
    -------
    Kept | None
        The entry, or None when nothing fits
    """
    with _lock:
        kept = _shelf.get(module, {}).pop(name, None)
    if kept is None:
        return None
    if kept.fingerprint != fingerprint(module):
        logger.debug(
            f"{type(module).__name__}: weights or structure changed since it was "
            "compiled in this process; compiling it again"
        )
        return None
    return kept


def release(model: Any = None) -> int:
    """Drop compiled code kept in this process, freeing its CUDA-graph memory.

    Parameters
    ----------
    model : Any, optional
        A model (or one of its submodules) whose kept code to drop; by default all

    Returns
    -------
    int
        How many kept regions were dropped
    """
    with _lock:
        if model is None:
            dropped = sum(len(v) for v in _shelf.values())
            _shelf.clear()
            return dropped
        roots = (
            [model]
            if isinstance(model, torch.nn.Module)
            else [v for v in vars(model).values() if isinstance(v, torch.nn.Module)]
        )
        return sum(len(_shelf.pop(m, {})) for root in roots for m in root.modules())


def kept_count() -> int:
    """Regions kept ready in this process now."""
    with _lock:
        return sum(len(v) for v in _shelf.values())
