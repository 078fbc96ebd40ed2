"""NVTX ranges as no-ops for the duration of a region's call, where its entry asks.

physicsnemo's HEALPix padding (``HEALPixPadding``, ``HEALPixPaddingv2``) marks each
forward with ``torch.cuda.nvtx.range_push``/``range_pop`` where CUDA is available.
Dynamo cannot put those in a graph ("torch.* op returned non-Tensor"): every pad
broke the graph, and the frames resumed after the breaks, shared by every layer,
recompiled per size until Dynamo's limit (DLESyM on an H100, 2026-11-27). Inside
:func:`quiet`, ``torch.cuda.nvtx``'s ``range_push``, ``range_pop``, ``range`` and
``mark`` are this module's Python no-ops, which Dynamo inlines to nothing; a model
whose :class:`~earth2studio_compile.spec.ModelSpec` sets ``quiet_nvtx`` gets them
around each of its regions' calls (compiled, eager and probe calls alike,
:meth:`~earth2studio_compile.region.CompiledRegion.__call__`). The no-ops are the
same objects every time: Dynamo guards on the identity of the functions it traced,
so code compiled in one call's window still serves the next.

The functions live on the module, so the replacement is process-wide: while such a
region runs, an NVTX range that another thread marks is lost too (a profile's
markers, nothing else). A lock-protected depth counter makes it nest and overlap:
the first window to open replaces the functions, the last to close (also on an
exception) puts back what was there, unless something else replaced them meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["quiet"]


def _range_push(msg: str) -> int:
    return 0


def _range_pop() -> int:
    return 0


def _mark(msg: str) -> None:
    return None


@contextlib.contextmanager
def _range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
    yield


_NO_OPS: dict[str, Any] = {
    "range_push": _range_push,
    "range_pop": _range_pop,
    "range": _range,
    "mark": _mark,
}
_lock = threading.Lock()
_depth = 0  # windows open, in every thread
_saved: dict[str, Any] = {}  # what the first window replaced


class _Quiet:
    """The window: reusable and re-entrant, its state is the module's."""

    def __enter__(self) -> None:
        global _depth
        with _lock:
            if _depth == 0:
                for name, no_op in _NO_OPS.items():
                    _saved[name] = getattr(torch.cuda.nvtx, name)
                    setattr(torch.cuda.nvtx, name, no_op)
            _depth += 1

    def __exit__(self, *exc: object) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name, no_op in _NO_OPS.items():
                    if getattr(torch.cuda.nvtx, name) is no_op:
                        setattr(torch.cuda.nvtx, name, _saved[name])
                _saved.clear()


_QUIET = _Quiet()


def quiet(on: bool) -> contextlib.AbstractContextManager[None]:
    """A window in which ``torch.cuda.nvtx``'s range and mark functions do nothing.

    Parameters
    ----------
    on : bool
        Quiet them; False changes nothing (a model whose entry does not ask)

    Returns
    -------
    contextlib.AbstractContextManager[None]
        The window; it restores the functions when the last open window closes
    """
    return _QUIET if on else contextlib.nullcontext()
