"""Importing Earth2Studio without the noise of optional GPU libraries it loads.

``import earth2studio.run`` imports physicsnemo, whose modules call ``warp.init()``
at import time. On a machine without the NVIDIA driver, Warp's native library then
prints ``Warp CUDA warning: Could not find or load the NVIDIA CUDA driver`` straight
to file descriptor 2 (``fprintf``), where no Python setting reaches it. It tells a
CPU user nothing: Earth2Studio does not run Warp kernels, and PyTorch reports the
same machine as having no CUDA. :func:`quiet_imports` keeps that one line, passes
on everything else the imports print, and logs the dropped line at TRACE.

It also makes the import itself several times faster (:func:`quick_registry`). Each
of Earth2Studio 0.19's model and data modules registers with its optional-dependency
registry (``earth2studio.utils.imports``), which finds the registering file by
``inspect.stack()``: that reads the source lines of every frame on the stack, and
for a frame whose file it has not met (the import system's own), walks every module
in ``sys.modules``. ``import earth2studio.models.px`` made ~180 such calls, 38 s of
the 43 s a fresh process took to build the small FCN on a 2-core CPU (9.8 s
without them), and every process of a forecast, the demo, the benchmark and the
tests pays it. The registry reads only the file name of the frame above it, so it
is given a ``stack()`` that skips the source lines.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from typing import Any

from loguru import logger

# Lines printed by native code during imports that say only "no GPU here".
NOISE = ("Warp CUDA warning: Could not find or load the NVIDIA CUDA driver",)

#: Earth2Studio's optional-dependency registry.
REGISTRY = "earth2studio.utils.imports"
#: SHA-256 (first 16 hex digits) of the source of the registry's callers of
#: ``inspect.stack()``, as read in Earth2Studio 0.19.0: each uses only the
#: ``filename`` of the frame above it. Other code keeps Python's own ``inspect``.
STACK_CALLERS = {
    "OptionalDependencyFailure.__init__": "28b9fa91ef774120",
    "check_optional_dependencies": "e163b60fae99cf88",
}


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Drop :data:`NOISE` lines written to file descriptor 2 inside the block.

    Everything else written there is written again, in order, when the block ends.
    Where descriptor 2 cannot be redirected, nothing is dropped. Earth2Studio's
    optional-dependency registry is made quick first (:func:`quick_registry`).
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        quick_registry()
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            quick_registry()
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
            kept = []
            for line in text.splitlines(keepends=True):
                if any(noise in line for noise in NOISE):
                    logger.trace(f"Dropped while importing: {line.strip()}")
                else:
                    kept.append(line)
            if kept:
                os.write(2, "".join(kept).encode())


@functools.cache
def quick_registry() -> bool:
    """Give Earth2Studio's optional-dependency registry (:data:`REGISTRY`) a
    ``stack()`` without source lines (:func:`quicken`), once per process, before
    the Earth2Studio modules that register with it are imported.

    Returns
    -------
    bool
        Whether the registry has it; False where the registry is other code than the
        code checked (:data:`STACK_CALLERS`) or cannot be imported
    """
    try:
        registry = importlib.import_module(REGISTRY)
    except Exception as err:  # its own import fails later, where it is needed
        logger.trace(f"{REGISTRY} not imported: {err!r}")
        return False
    return quicken(registry)


def quicken(registry: types.ModuleType) -> bool:
    """Make ``registry``'s ``inspect`` one whose ``stack()`` skips the frames'
    source lines (:func:`stack`), where its callers of ``inspect.stack()`` are
    the code :data:`STACK_CALLERS` names.

    Parameters
    ----------
    registry : types.ModuleType
        Earth2Studio's ``earth2studio.utils.imports``

    Returns
    -------
    bool
        Whether ``registry`` has the quick ``stack()`` now
    """
    found = registry.__dict__.get("inspect")
    if isinstance(found, _QuickInspect):
        return True
    if found is not inspect:
        return False
    for name, digest in STACK_CALLERS.items():
        function: Any = registry
        for part in name.split("."):
            function = getattr(function, part, None)
        if function is None or _digest(function) != digest:
            logger.trace(f"{REGISTRY}: {name} is not the code checked; kept as is")
            return False
    registry.inspect = _QuickInspect()  # type: ignore[attr-defined]
    return True


def stack(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()``, the caller's frame first, without the frames' source
    lines: ``code_context`` and ``index`` are None, as ``inspect`` gives them for
    a frame whose source it cannot find, and ``filename`` is the code's own (the
    one ``inspect`` gives for a frame of a module imported from its source file).

    Parameters
    ----------
    context : int, optional
        Ignored: no source lines are read, by default 1

    Returns
    -------
    list[inspect.FrameInfo]
        The caller's frame and those above it
    """
    frames = []
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        info = (frame, code.co_filename, frame.f_lineno, code.co_name, None, None)
        frames.append(inspect.FrameInfo(*info))
        frame = frame.f_back
    return frames


class _QuickInspect:
    """Python's ``inspect`` as the registry sees it: :func:`stack` without source
    lines, every other name the module's own."""

    stack = staticmethod(stack)

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)


def _digest(function: Any) -> str:
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return ""
    return hashlib.sha256(source.encode()).hexdigest()[:16]
