"""Pinned host buffers made by registering memory, not by allocating it pinned.

``torch.empty(n, pin_memory=True)`` asks CUDA for page-locked memory
(``cudaHostAlloc``), which on the H100 host took 0.59 s for FCN's 432 MB step of
a batch of 4, and while it ran another thread's kernel launches and copies waited
for it (a launch loop took 3.4 s instead of 0.18; docs/bench/2026-11-26-h100-seventh).
:func:`pinned_empty` instead allocates ordinary memory, touches each page, and
registers it with ``cudaHostRegister``: 0.06 s of page faults and 0.02 s to
register, and other threads' CUDA work went on beside it. So :class:`~.host.HostPool`
can make the buffers of the steps to come on a thread of its own.

A registered buffer is unregistered once its last view is freed: the tensor is a view
of a numpy array whose finalizer queues the unregistering, and the queued job holds
the memory until that has run: it is freed on the same thread. Both calls run on one
thread of this module's, which launches no kernels; the caller never waits for an
unregistering (29 ms of a compiled FCN ensemble call's flush on an H200, three
buffers: docs/bench/2026-11-29-h200-twentysixth). Where registering fails, the
buffer comes from ``torch.empty(..., pin_memory=True)`` as before.
"""

from __future__ import annotations

import mmap
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from loguru import logger

__all__ = ["pinned_empty", "registered_bytes", "settle"]

# cudaHostRegisterPortable: pinned for every CUDA context, not only the caller's.
_PORTABLE = 1
_NAME = "pinned_empty"
# Reentrant: a finalizer (a collection) may run while this thread holds it.
_lock = threading.RLock()
_registered = 0  # bytes registered now, for tests and reports
_warned = False
_thread: ThreadPoolExecutor | None = None


def registered_bytes() -> int:
    """Bytes of host memory :func:`pinned_empty` has registered and not yet freed."""
    return _registered


def pinned_empty(
    numel: int, dtype: torch.dtype, device: torch.device | None = None
) -> torch.Tensor:
    """A one-dimensional pinned host tensor, uninitialised.

    Parameters
    ----------
    numel : int
        Elements
    dtype : torch.dtype
        Their type
    device : torch.device | None, optional
        The CUDA device whose copies it serves, by default None (the current one);
        the memory is registered for every device

    Returns
    -------
    torch.Tensor
        Pinned (``is_pinned()``), usable for asynchronous copies from any device

    Raises
    ------
    RuntimeError
        CUDA is not available (host memory is pinned for CUDA's copies)
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "pinned_empty needs CUDA (pinned memory is for copies from a CUDA "
            "device); use torch.empty on a machine without it."
        )
    nbytes = numel * dtype.itemsize
    if nbytes == 0:
        return torch.empty(0, dtype=dtype, pin_memory=True)
    index = device.index if device is not None else None
    index = torch.cuda.current_device() if index is None else index
    memory = np.empty(nbytes, dtype=np.uint8)
    # Registering faulted-in pages is the cheap part; faulting them is what
    # cudaHostRegister would otherwise do, more slowly, inside the driver.
    memory[:: mmap.PAGESIZE] = 0
    pointer = memory.ctypes.data
    error = _on_cuda_thread(
        _runtime, "cudaHostRegister", index, pointer, nbytes, _PORTABLE
    )
    if error is not None:
        _debug_once(f"cudaHostRegister returned {error}")
        return torch.empty(numel, dtype=dtype, pin_memory=True)
    _count(nbytes)
    # The tensor's numpy owner is a view: when it goes, its finalizer hands the
    # memory on, and the memory is freed only once unregistered.
    owner = memory.view()
    finalizer = weakref.finalize(owner, _release, memory, nbytes, index)
    finalizer.atexit = False  # at exit the process's mappings go with it
    return torch.from_numpy(owner).view(dtype)


def settle() -> None:
    """Wait until every buffer whose views are gone is unregistered and freed.

    :func:`registered_bytes` counts a buffer until then. Without CUDA, or before
    any buffer was made, nothing waits.
    """
    with _lock:
        thread = _thread
    if thread is not None:
        thread.submit(lambda: None).result()


def _on_cuda_thread(
    job: Callable[..., str | None], *args: Any, wait: bool = True
) -> str | None:
    """Run ``job`` on the module's one thread; wait for it unless ``wait`` is False.

    A failed CUDA runtime call leaves an error that the calling thread's next
    kernel launch would raise; this thread launches none, so an error of
    registering stays here, with the code that handles it."""
    global _thread
    if threading.current_thread().name.startswith(_NAME):
        return job(*args)  # a finalizer run by a collection on that thread
    with _lock:
        if _thread is None:
            _thread = ThreadPoolExecutor(1, thread_name_prefix=_NAME)
        thread = _thread
    done = thread.submit(job, *args)
    return done.result() if wait else None


def _runtime(function: str, index: int, *args: int) -> str | None:
    """``cudart.<function>(*args)`` with device ``index`` current: None where it
    succeeded, else its error."""
    cudart = torch.cuda.cudart()
    with torch.cuda.device(index):
        error = getattr(cudart, function)(*args)
    return None if error == cudart.cudaError.success else str(error)


def _release(memory: np.ndarray, nbytes: int, index: int) -> None:
    """The last view of ``memory`` is gone (a finalizer: never raises, never
    waits): the module's thread unregisters it, then drops it."""
    try:
        _on_cuda_thread(_unregister, memory, nbytes, index, wait=False)
    except Exception:  # e.g. the interpreter is stopping its threads
        _unregister(memory, nbytes, index)


def _unregister(memory: np.ndarray, nbytes: int, index: int) -> None:
    """Unregister ``memory``; it is freed when the caller drops it (never raises)."""
    try:
        error = _runtime("cudaHostUnregister", index, memory.ctypes.data)
    except Exception as err:
        error = repr(err)
    if error is not None:
        _debug_once(f"cudaHostUnregister returned {error}")
    _count(-nbytes)


def _count(nbytes: int) -> None:
    global _registered
    with _lock:
        _registered += nbytes


def _debug_once(what: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        logger.debug(
            f"pinned_empty: {what}; pinned host buffers are allocated by CUDA "
            "instead where registering fails (slower, and they stall other threads)."
        )
