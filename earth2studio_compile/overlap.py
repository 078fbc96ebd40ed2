"""Overlap output writing with the next step's compute, for any Earth2Studio IO backend.

Upstream's workflows call ``io.write`` once per step and wait for it: the backend copies
each variable to the host (a synchronizing device-to-host copy) and then encodes and
stores it, while the GPU sits idle. :class:`OverlappedIO` wraps any backend so that
``write`` only queues non-blocking copies into pinned host memory and returns; one
background thread waits for each copy and calls the wrapped backend's ``write`` with
host tensors, in the order the workflow wrote them.

Memory is bounded: at most ``max_pending`` steps wait in the queue (plus the one being
written); a workflow that outruns its storage blocks in ``write`` until a slot frees.
An exception raised by the wrapped backend is re-raised in the calling thread at the
next ``write``, ``add_array``, ``flush`` or ``close``, and the writer accepts nothing
after it. ``flush`` waits for every queued write. The workflows of
:mod:`earth2studio_compile.run` flush an ``OverlappedIO`` before they return; with
upstream's workflows use it as a context manager (or call ``close()``).

Examples
--------
>>> from earth2studio.io import ZarrBackend
>>> from earth2studio_compile.overlap import OverlappedIO
>>> from earth2studio_compile.run import deterministic
>>> io = OverlappedIO(ZarrBackend())  # doctest: +SKIP
>>> deterministic(["2024-01-01"], 20, model, data, io, compile=True)  # doctest: +SKIP
>>> io.close()  # doctest: +SKIP
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np
import torch
from loguru import logger

__all__ = ["OverlappedIO"]

# Sentinel that stops the worker thread.
_STOP = object()


class _Job:
    """One ``write`` call: host tensors, the events that say they are filled, coords."""

    __slots__ = ("x", "coords", "array_name", "events")

    def __init__(
        self,
        x: torch.Tensor | list[torch.Tensor],
        coords: OrderedDict,
        array_name: str | list[str],
        events: list[torch.cuda.Event],
    ) -> None:
        self.x = x
        self.coords = coords
        self.array_name = array_name
        self.events = events


class OverlappedIO:
    """An IO backend wrapper that writes on a background thread.

    Parameters
    ----------
    io : IOBackend
        Any Earth2Studio IO backend (``ZarrBackend``, ``NetCDF4Backend``,
        ``AsyncZarrBackend``, ``KVBackend``, ...); it is called from one background
        thread, never concurrently
    max_pending : int, optional
        Steps that may wait in the queue before ``write`` blocks, by default 2. Host
        memory in use is at most ``max_pending + 1`` steps of output
    pin_memory : bool | None, optional
        Copy CUDA tensors into pinned (page-locked) host memory, which lets the copy
        run asynchronously; by default None, meaning yes whenever CUDA is available

    Raises
    ------
    TypeError
        ``io`` lacks ``add_array``/``write``, or ``max_pending`` is not an int
    ValueError
        ``max_pending`` < 1
    """

    def __init__(
        self, io: Any, max_pending: int = 2, pin_memory: bool | None = None
    ) -> None:
        if isinstance(io, OverlappedIO):
            raise TypeError("io is already an OverlappedIO; wrap the backend once.")
        for method in ("add_array", "write"):
            if not callable(getattr(io, method, None)):
                raise TypeError(
                    f"OverlappedIO wraps an Earth2Studio IO backend, but "
                    f"{type(io).__name__} has no {method}() method."
                )
        if isinstance(max_pending, bool) or not isinstance(max_pending, (int, np.integer)):
            raise TypeError(
                f"max_pending must be an int, got {type(max_pending).__name__}."
            )
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}.")
        self.io = io
        self.max_pending = int(max_pending)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.written = 0
        self._queue: queue.Queue = queue.Queue(maxsize=self.max_pending)
        self._error: BaseException | None = None
        self._worker: threading.Thread | None = None
        self._closed = False

    # -- the IOBackend protocol -------------------------------------------------------
    def add_array(
        self, coords: OrderedDict, array_name: str | list[str], **kwargs: Any
    ) -> None:
        """Create arrays in the wrapped backend, after every queued write.

        Parameters
        ----------
        coords : OrderedDict
            Coordinates of the arrays
        array_name : str | list[str]
            Names of the arrays
        **kwargs : Any
            Passed to the wrapped backend's ``add_array``
        """
        self.flush()
        self.io.add_array(coords, array_name, **kwargs)

    def write(
        self,
        x: torch.Tensor | list[torch.Tensor],
        coords: OrderedDict,
        array_name: str | list[str],
    ) -> None:
        """Queue a write; returns once the device-to-host copies are enqueued.

        Parameters
        ----------
        x : torch.Tensor | list[torch.Tensor]
            Tensor(s) to write, on any device; the caller may reuse or modify them
            as soon as this returns
        coords : OrderedDict
            Their coordinates (copied)
        array_name : str | list[str]
            Array name(s)

        Raises
        ------
        Exception
            Whatever an earlier background write raised
        RuntimeError
            The writer was closed
        """
        self._check()
        tensors = [x] if isinstance(x, torch.Tensor) else list(x)
        host, devices = [], set()
        for t in tensors:
            host.append(self._to_host(t))
            if t.device.type == "cuda":
                devices.add(t.device)
        events = []
        for device in devices:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        job = _Job(
            host[0] if isinstance(x, torch.Tensor) else host,
            OrderedDict((k, np.array(v, copy=True)) for k, v in coords.items()),
            array_name if isinstance(array_name, str) else list(array_name),
            events,
        )
        self._start()
        # Blocks while max_pending jobs wait: the bound on host memory.
        self._queue.put(job)

    # -- draining -----------------------------------------------------------------------
    def flush(self) -> None:
        """Wait until every queued write reached the wrapped backend.

        Raises
        ------
        Exception
            Whatever a background write raised
        """
        if self._worker is not None:
            self._queue.join()
        self._raise()

    def close(self) -> None:
        """Flush, stop the worker, then ``close()`` the wrapped backend if it has one.

        Raises
        ------
        Exception
            Whatever a background write raised (the worker is stopped regardless)
        """
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._stop()
            self._closed = True
        close = getattr(self.io, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> OverlappedIO:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            # Do not hide the caller's exception behind a writer error.
            self._stop()
            self._closed = True

    def __getattr__(self, name: str) -> Any:
        # Reading the wrapped backend (KVBackend.root, ZarrBackend["t2m"], ...) must see
        # every write issued so far.
        if name.startswith("_") or name == "io":
            raise AttributeError(name)
        self.flush()
        return getattr(self.io, name)

    def __getitem__(self, key: Any) -> Any:
        self.flush()
        return self.io[key]

    def __del__(self) -> None:
        worker = self.__dict__.get("_worker")
        if worker is not None and worker.is_alive() and not self.__dict__.get("_closed"):
            logger.warning(
                f"OverlappedIO around {type(self.io).__name__} was not closed; "
                "flushing its pending writes. Call close() or use it in a with block."
            )
            try:
                self.close()
            except Exception as err:  # a finalizer must not raise
                logger.error(f"OverlappedIO: a pending write failed: {err!r}")

    # -- internals ------------------------------------------------------------------------
    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if t.device.type == "cpu":
            # The caller may change its tensor in place after write() returns.
            return t.clone(memory_format=torch.contiguous_format)
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pin_memory)
        out.copy_(t, non_blocking=self.pin_memory)
        return out

    def _check(self) -> None:
        if self._closed:
            raise RuntimeError("OverlappedIO is closed; create a new one to write again.")
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _start(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(
                target=self._run, name=f"OverlappedIO({type(self.io).__name__})", daemon=True
            )
            self._worker.start()

    def _stop(self) -> None:
        if self._worker is not None:
            self._queue.put(_STOP)
            self._worker.join()
            self._worker = None

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is _STOP:
                    return
                if self._error is not None:
                    continue  # the caller will raise; write nothing out of order
                for event in job.events:
                    event.synchronize()
                self.io.write(job.x, job.coords, job.array_name)
                self.written += 1
            except BaseException as err:  # surfaced in the caller's thread
                self._error = err
                logger.debug(f"OverlappedIO: write failed in the background: {err!r}")
            finally:
                self._queue.task_done()


def drain(ios: Sequence[Any], failed: bool) -> None:
    """Flush every :class:`OverlappedIO` in ``ios`` at the end of a workflow.

    Parameters
    ----------
    ios : Sequence[Any]
        The workflow's IO arguments
    failed : bool
        The workflow raised: wait for the writer but let the workflow's own
        exception, not a writer error, reach the caller
    """
    for io in ios:
        if not isinstance(io, OverlappedIO):
            continue
        if not failed:
            io.flush()
            continue
        try:
            io.flush()
        except Exception as err:  # secondary to the workflow's exception
            logger.error(f"OverlappedIO: a pending write also failed: {err!r}")
