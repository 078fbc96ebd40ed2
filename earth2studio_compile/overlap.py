"""Overlap output writing with the next step's compute, for any Earth2Studio IO backend.

:class:`OverlappedIO` wraps a backend so that ``write`` only queues non-blocking copies
into pinned host memory and returns; ``concurrent.futures`` threads wait for each copy
and store it. Writes reach the backend in the caller's order (per array, with parallel
writers); host copies exist for at most ``max_pending + 1`` steps; the stored result is
bitwise the synchronous one. A backend error reaches the caller once, as the original
exception, at the next ``write``, ``add_array``, ``flush`` or ``close`` (the workflows
of :mod:`earth2studio_compile.run` flush before they return); later writes raise a
``RuntimeError`` chained to it; only writes queued after the failed one are skipped.

Threads live only while writes are pending. One never closed loses nothing: dropping
it, or the interpreter exiting, flushes it with a WARNING (at exit, before Python stops
the thread pools that Zarr stores through). Several threads may share one: each call
runs whole under a lock, so each thread's writes keep their order.

Examples
--------
>>> io = OverlappedIO(ZarrBackend())  # doctest: +SKIP
>>> deterministic(["2024-01-01"], 20, model, data, io, compile=True)  # doctest: +SKIP
>>> io.close()  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import inspect
import math
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from types import TracebackType
from typing import Any

import numpy as np
import torch
from loguru import logger

from earth2studio_compile.writers import ParallelWriter, parallel_writer

__all__ = ["OverlappedIO"]

# Wrappers not yet garbage, for the exit hook; weak, so that it keeps none alive.
_live: weakref.WeakSet[OverlappedIO] = weakref.WeakSet()
_PREFIX = "OverlappedIO"


class _Background:
    """What the threads share. They hold this, never the wrapper, so an unclosed
    wrapper is collected (and flushed) while its writes are pending."""

    def __init__(self, io: Any, parallel: type[ParallelWriter] | None, workers: int):
        name = f"{_PREFIX}({type(io).__name__})"
        self.io, self.lock = io, threading.Lock()
        self.dispatcher = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.writer = parallel(io, workers, name) if parallel else None
        self.error: BaseException | None = None
        self.cut = math.inf  # the earliest failed write: later ones are skipped

    def submit(self, seq: int, job: list) -> Future:
        """Queue one step; its future resolves to its per-array futures, or to
        whether it was written whole."""
        future = self.dispatcher.submit(self._dispatch, seq, job)
        future.add_done_callback(partial(self._done, seq))
        return future

    def _dispatch(self, seq: int, job: list) -> list[Future] | bool:
        x, coords, names, events = job
        job.clear()  # a waiter on this future may copy a new step: free this one
        go = partial(self._go, seq)
        if not go():
            return False
        for event in events:
            event.synchronize()
        if self.writer is None:
            self.io.write(x, coords, names)
            return True
        listed = [names] if isinstance(names, str) else names
        futures = self.writer.submit(_listed(x), coords, listed, go)
        for future in futures:
            future.add_done_callback(partial(self._done, seq))
        return futures

    def _go(self, seq: int) -> bool:
        return seq <= self.cut

    def _done(self, seq: int, future: Future) -> None:
        error = future.exception()
        if error is None:
            return
        with self.lock:
            first, self.cut = self.error is None, min(self.cut, seq)
            self.error = self.error or error
        if first:
            logger.debug(f"OverlappedIO: write failed in the background: {error!r}")
        else:
            logger.error(f"OverlappedIO: another background write failed: {error!r}")

    def close(self) -> None:
        self.dispatcher.shutdown()
        if self.writer is not None:
            self.writer.close()


def _parts(step: Future) -> list[Future]:
    result = step.result() if step.done() and not step.exception() else []
    return result if isinstance(result, list) else []


def _finished(step: Future) -> bool:
    return step.done() and all(part.done() for part in _parts(step))


def _status(step: Future) -> str:
    """How a step ended, once it has: "written", "skipped" or "failed"."""
    wait([step])
    wait(_parts(step))
    if step.exception() or any(part.exception() for part in _parts(step)):
        return "failed"
    result = step.result()
    stored = all(p.result() for p in result) if isinstance(result, list) else result
    return "written" if stored else "skipped"


class OverlappedIO:
    """An IO backend wrapper that writes on background threads.

    Parameters
    ----------
    io : IOBackend
        Any Earth2Studio IO backend (``ZarrBackend``, ``NetCDF4Backend``,
        ``AsyncZarrBackend``, ``KVBackend``, ...)
    max_pending : int, optional
        Steps that may wait before ``write`` blocks, by default 2: host copies exist
        for at most ``max_pending + 1`` steps, with any number of workers (Zarr's
        parallel writer may keep one array per worker until its next store)
    pin_memory : bool | None, optional
        Copy CUDA tensors into pinned host memory, asynchronously; by default None,
        meaning yes whenever CUDA is available
    workers : int | None, optional
        Arrays that store at once, by default None: ``min(8, CPU cores)`` for backends
        that take parallel writes (``ZarrBackend``, ``KVBackend``), 1 for the others
        (one thread calls the backend's ``write``, never concurrently)

    Raises
    ------
    TypeError
        ``io`` lacks ``add_array``/``write``; ``max_pending`` or ``workers`` not an int
    ValueError
        ``max_pending`` < 1, ``workers`` < 1, or ``workers`` > 1 for a backend that
        must keep one writer (``NetCDF4Backend``, ``AsyncZarrBackend``, unknown ones)
    """

    def __init__(
        self,
        io: Any,
        max_pending: int = 2,
        pin_memory: bool | None = None,
        workers: int | None = None,
    ) -> None:
        if isinstance(io, OverlappedIO):
            raise TypeError("io is already an OverlappedIO; wrap the backend once.")
        for method in ("add_array", "write"):
            if not callable(getattr(io, method, None)):
                raise TypeError(
                    f"OverlappedIO wraps an Earth2Studio IO backend, but "
                    f"{type(io).__name__} has no {method}() method."
                )
        _check_int("max_pending", max_pending, none=False)
        _check_int("workers", workers, none=True)
        parallel, serial = parallel_writer(io)
        if workers is None:
            workers = min(8, os.cpu_count() or 1) if parallel is not None else 1
        elif workers > 1 and parallel is None:
            raise ValueError(
                f"workers={workers}: {serial}; use workers=1 (or None) for it."
            )
        self.io, self.workers, self.max_pending = io, int(workers), int(max_pending)
        self.pin_memory = (
            torch.cuda.is_available() if pin_memory is None else pin_memory
        )
        self._parallel = parallel if self.workers > 1 else None
        self._lock = threading.RLock()
        self._background: _Background | None = None
        self._steps: deque[Future] = deque()
        self._seq, self._blocked = 0, 0.0
        self._error: BaseException | None = None
        self._delivered = self._closed = False
        self._counts = dict.fromkeys(("written", "skipped", "failed", "reported"), 0)
        _live.add(self)

    @property
    def written(self) -> int:
        """Writes known to be stored whole (counted as the writer waits for them)."""
        return self._counts["written"]

    @property
    def dropped(self) -> int:
        """Writes not written, or only in part, because an earlier write failed."""
        return self._counts["skipped"]

    @property
    def blocked_s(self) -> float:
        """Seconds ``write`` has waited for storage: above zero, storage was slower
        than the caller."""
        return self._blocked

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
        with self._lock:
            self.flush()
            self._check()
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
            Tensor(s) to write, on any device; the caller may reuse them at once
        coords : OrderedDict
            Their coordinates (copied)
        array_name : str | list[str]
            Array name(s)

        Raises
        ------
        Exception
            Whatever an earlier background write raised, if not raised before
        RuntimeError
            The writer is closed, or stopped after an earlier write error
        """
        with self._lock:
            self._check()
            while self._steps and _finished(self._steps[0]):
                self._retire(1)
            if len(self._steps) > self.max_pending:
                # The oldest step is stored before this one is copied: that is the
                # bound on host memory.
                start = time.perf_counter()
                self._retire(len(self._steps) - self.max_pending)
                self._blocked += time.perf_counter() - start
            self._check()  # a write may have failed meanwhile
            host = [self._to_host(t) for t in _listed(x)]
            events = []  # recorded after the copies: the writer waits for them
            for device in {t.device for t in _listed(x) if t.device.type == "cuda"}:
                events.append(torch.cuda.Event())
                events[-1].record(torch.cuda.current_stream(device))
            job = [
                host[0] if isinstance(x, torch.Tensor) else host,
                OrderedDict((k, np.array(v, copy=True)) for k, v in coords.items()),
                array_name if isinstance(array_name, str) else list(array_name),
                events,
            ]
            del host
            if self._background is None:
                self._background = _Background(self.io, self._parallel, self.workers)
            self._seq += 1
            self._steps.append(self._background.submit(self._seq, job))

    def flush(self) -> None:
        """Wait until every queued write is stored; the threads stop until the next.

        Raises
        ------
        Exception
            Whatever a background write raised, if not raised before
        """
        with self._lock:
            self._retire(len(self._steps))
            background, self._background = self._background, None
            if background is not None:
                background.close()
                self._error = self._error or background.error
            dropped = self._counts["skipped"] - self._counts["reported"]
            if dropped:
                logger.error(
                    f"OverlappedIO: {dropped} write(s) queued after a failed one were "
                    "not written, or only in part: the writer stops at its first error."
                )
                self._counts["reported"] = self._counts["skipped"]
            self._raise_once()

    def close(self) -> None:
        """Flush, then ``close()`` the wrapped backend if it has one (also after a
        write error, which is raised if not raised before)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.flush()
            finally:
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
            self._close_logged()  # the caller's exception, not a writer error, goes on

    def __getattr__(self, name: str) -> Any:
        # Reading the backend (``io.root``) sees every write issued so far; an
        # attribute the backend lacks fails at once, without waiting.
        io = self.__dict__.get("io")
        if name.startswith("_") or io is None:
            raise AttributeError(name)
        inspect.getattr_static(io, name)
        self.flush()
        return getattr(io, name)

    def __getitem__(self, key: Any) -> Any:
        self.flush()
        return self.io[key]

    def __del__(self) -> None:
        # Through __dict__: __init__ may have raised before setting these.
        if self.__dict__.get("_closed", True) or not self.__dict__.get("_background"):
            return
        self._warn_unclosed("")
        if threading.current_thread().name.startswith(_PREFIX):
            # Collected on one of the threads, which cannot wait for itself.
            threading.Thread(target=self._close_logged, name=f"{_PREFIX} close").start()
        else:
            self._close_logged()

    def _at_exit(self) -> None:
        if self._closed or self._background is None:
            return
        self._warn_unclosed(" before exit")
        try:
            self.flush()
        except Exception as err:  # nobody left to raise it in
            logger.error(f"OverlappedIO: a pending write failed: {err!r}")

    def _close_logged(self) -> None:
        try:
            self.close()
        except Exception as err:  # no caller to raise it in
            logger.error(f"OverlappedIO: a pending write failed: {err!r}")

    def _warn_unclosed(self, when: str) -> None:
        pending = sum(not _finished(step) for step in self._steps)
        if pending:  # nothing pending is nothing lost: workflows flush it
            logger.warning(
                f"OverlappedIO around {type(self.io).__name__} was not closed{when}; "
                f"flushing its {pending} pending write(s). Call close() or use it "
                "in a with block."
            )

    def _retire(self, n: int) -> None:
        """Wait for the ``n`` oldest steps and count how they ended."""
        for _ in range(n):
            self._counts[_status(self._steps.popleft())] += 1

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if t.device.type == "cpu":
            # The caller may change its tensor in place after write() returns.
            return t.clone(memory_format=torch.contiguous_format)
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pin_memory)
        return out.copy_(t, non_blocking=self.pin_memory)

    def _raise_once(self) -> None:
        if self._error is None and self._background is not None:
            self._error = self._background.error
        if self._error is not None and not self._delivered:
            self._delivered = True
            raise self._error

    def _check(self) -> None:
        if self._closed:
            raise RuntimeError(
                "OverlappedIO is closed; create a new one to write again."
            )
        self._raise_once()
        if self._error is None:
            return
        # Raised once already; refusing silently would drop this write unnoticed.
        raise RuntimeError(
            f"OverlappedIO: the writer stopped after an earlier write error "
            f"({self._error!r}); create a new one to write again."
        ) from self._error


def _listed(x: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    return [x] if isinstance(x, torch.Tensor) else list(x)


def _check_int(name: str, value: Any, none: bool) -> None:
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        kind = "an int or None" if none else "an int"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}.")
    if value < 1:
        raise ValueError(f"{name} must be >= 1{' (or None)' * none}, got {value}.")


def drain(ios: Sequence[Any], failed: bool) -> None:
    """Flush every :class:`OverlappedIO` in ``ios`` at the end of a workflow.

    Parameters
    ----------
    ios : Sequence[Any]
        The workflow's IO arguments
    failed : bool
        The workflow raised: a write error it has not seen is logged, not raised, so
        that the workflow's own exception reaches the caller
    """
    for io in ios:
        if isinstance(io, OverlappedIO):
            try:
                io.flush()
            except Exception as err:
                if not failed:
                    raise
                logger.error(f"OverlappedIO: a pending write also failed: {err!r}")


def _before_thread_pools_stop(hook: Callable[[], None]) -> None:
    """Run ``hook`` at interpreter exit before Python's thread pools refuse work.

    ``atexit`` hooks run after ``concurrent.futures`` (so asyncio's default executors,
    which Zarr stores through) shut down. Those pools register through
    ``threading._register_atexit``, whose hooks run in reverse order: one registered
    after importing ``concurrent.futures`` runs first. ``atexit`` where it is missing.
    """
    getattr(threading, "_register_atexit", atexit.register)(hook)


def _flush_all_at_exit() -> None:
    for io in list(_live):
        io._at_exit()


_before_thread_pools_stop(_flush_all_at_exit)
