"""Overlap output writing with the next step's compute, for any Earth2Studio IO backend.

:class:`OverlappedIO` wraps a backend so that ``write`` only queues non-blocking copies
into pinned host memory and returns; a :class:`~earth2studio_compile.io.writers.Writer`
waits for each copy and stores it, one future per array. Writes reach the backend in
the caller's order (per array, with parallel writers); host copies exist for at most
``max_pending + 1`` steps; the stored result is bitwise the synchronous one.

The copies are :mod:`~earth2studio_compile.io.host`'s: views of one tensor (what
``split_coords`` hands ``write``) come over in one copy, queued on a side stream
behind a device snapshot taken on the caller's stream, into host buffers reused
from step to step (``host_bytes`` says the most held).

A backend error reaches the caller once, as the original exception, at the next
``write``, ``add_array``, ``flush`` or ``close`` once every earlier step is stored (the
workflows of :mod:`earth2studio_compile.run` flush before they return); later writes
raise a ``RuntimeError`` chained to it; only writes queued after the failed one are
skipped.

Threads live only while writes are pending. One never closed loses nothing: when it is
collected, or the interpreter exits, a finalizer waits for its writes and closes the
backend, with a WARNING (at exit, before Python stops the thread pools that Zarr
stores through). Several threads may share one: each call runs whole under a lock, so
each thread's writes keep their order.

Examples
--------
>>> with OverlappedIO(ZarrBackend()) as io:  # doctest: +SKIP
...     deterministic(["2024-01-01"], 20, model, data, io, compile=True)
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import Future, wait
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from loguru import logger

from earth2studio_compile.io.directories import Ahead
from earth2studio_compile.io.host import HostPool
from earth2studio_compile.io.writers import SerialWriter, Writer, parallel_writer

# Type hints only: importing Earth2Studio takes a minute on a small machine, and
# the package is imported before it (the demo's banner comes first).
if TYPE_CHECKING:
    from earth2studio.io.base import IOBackend
    from earth2studio.utils.type import CoordSystem

__all__ = ["OverlappedIO", "drain", "for_compiled_call"]

# Wrappers with writes pending, for the exit hook; weak, so that it keeps none alive.
_live: weakref.WeakSet[OverlappedIO] = weakref.WeakSet()
_exiting = False


class OverlappedIO:
    """An IO backend wrapper that writes on background threads.

    Parameters
    ----------
    io : IOBackend
        Any Earth2Studio IO backend (``ZarrBackend``, ``NetCDF4Backend``,
        ``AsyncZarrBackend``, ``KVBackend``, ...); read it (``io.io``) after
        ``flush()``, ``close()`` or a workflow of :mod:`earth2studio_compile.run`
    max_pending : int, optional
        Steps that may wait before ``write`` blocks, by default 2: host copies exist
        for at most ``max_pending + 1`` steps, with any number of workers
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
        io: IOBackend,
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
        self._writer: Writer | None = None
        self._ahead: Ahead | None = None  # the arrays last added, prepared
        # Waits for the writer if this is dropped unclosed; set while writes pend.
        self._finalizer: weakref.finalize | None = None
        self._steps: deque[list[Future[bool]]] = deque()  # a future per array
        self._pool = HostPool(self.pin_memory, ahead=self.max_pending)
        self._buffers: deque[list[torch.Tensor]] = deque()  # the pool's, per step
        self._step, self._blocked = 0, 0.0
        self._error: BaseException | None = None
        self._delivered = self._closed = False
        self._counts = dict.fromkeys(("written", "skipped", "failed", "reported"), 0)

    @property
    def written(self) -> int:
        """Writes known to be stored whole (counted as the writer waits for them)."""
        return self._counts["written"]

    @property
    def dropped(self) -> int:
        """Writes not written, or only in part, because an earlier write failed."""
        return self._counts["skipped"]

    @property
    def host_bytes(self) -> int:
        """The most bytes of host buffers held at once (pinned for copies from CUDA):
        at most ``max_pending + 1`` steps' worth while steps are alike."""
        return self._pool.peak_bytes

    @property
    def blocked_s(self) -> float:
        """Seconds ``write`` has waited for storage: above zero, storage was slower
        than the caller."""
        return self._blocked

    def add_array(
        self, coords: CoordSystem, array_name: str | list[str], **kwargs: Any
    ) -> None:
        """Create arrays in the wrapped backend, after every queued write.

        Parameters
        ----------
        coords : CoordSystem
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
            if self._parallel is not None:
                names = [array_name] if isinstance(array_name, str) else array_name
                try:
                    self._ahead = self._parallel.ahead(self.io, list(names))
                except Exception as err:  # it only saves the writers work
                    logger.debug(f"OverlappedIO: nothing prepared ahead: {err!r}")

    def write(
        self,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
    ) -> None:
        """Queue a write; returns once the device-to-host copies are enqueued.

        Parameters
        ----------
        x : torch.Tensor | list[torch.Tensor]
            Tensor(s) to write, on any device; the caller may drop or change them
            once this returns (CPU ones are copied before it returns; CUDA ones
            are snapshot on the caller's stream, before its later work)
        coords : CoordSystem
            Their coordinates (copied)
        array_name : str | list[str]
            Array name(s), one per tensor

        Raises
        ------
        ValueError
            ``x`` and ``array_name`` differ in length
        Exception
            Whatever an earlier background write raised, if not raised before
        RuntimeError
            The writer is closed, or stopped after an earlier write error
        """
        tensors = _listed(x)
        names = [array_name] if isinstance(array_name, str) else list(array_name)
        if len(tensors) != len(names):
            # Upstream raises this too, but in the background, and a parallel writer
            # would have paired them up and dropped the rest.
            raise ValueError(
                f"write got {len(tensors)} tensor(s) in x but {len(names)} name(s) in "
                "array_name; pass one name per tensor."
            )
        with self._lock:
            self._check()
            while self._steps and all(f.done() for f in self._steps[0]):
                self._retire(1)
            if len(self._steps) > self.max_pending:
                # The oldest step is stored before this one is copied: that is the
                # bound on host memory.
                start = time.perf_counter()
                self._retire(len(self._steps) - self.max_pending)
                self._blocked += time.perf_counter() - start
            self._check()  # a write may have failed meanwhile
            staged = self._pool.stage(tensors)
            host = staged.host
            copied = OrderedDict((k, np.array(v, copy=True)) for k, v in coords.items())
            writer = self._writer or self._start()
            self._step += 1
            self._steps.append(
                writer.submit(
                    self._step,
                    host[0] if isinstance(x, torch.Tensor) else host,
                    copied,
                    array_name if isinstance(array_name, str) else names,
                    staged.ready,  # the writer waits for them before reading
                )
            )
            self._buffers.append(staged.buffers)

    def flush(self) -> None:
        """Wait until every queued write is stored; the threads stop until the next.

        Raises
        ------
        Exception
            Whatever a background write raised, if not raised before
        """
        with self._lock:
            ahead, self._ahead = self._ahead, None
            if ahead is not None:
                ahead.stop()
            self._retire(len(self._steps))
            self._pool.clear()
            writer, self._writer = self._writer, None
            if writer is not None:
                assert self._finalizer is not None
                self._finalizer.detach()
                _live.discard(self)
                writer.close()
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
                _close_backend(self.io)

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
            return
        try:
            self.close()
        except Exception as err:  # the caller's exception, not a writer error, goes on
            logger.error(f"OverlappedIO: a pending write failed: {err!r}")

    def _start(self) -> Writer:
        """The writer, with its threads, for the writes until the next flush."""
        if self._parallel is not None:
            writer: Writer = self._parallel(self.io, self.workers)
        else:
            writer = SerialWriter(self.io)
        self._writer = writer
        # The finalizer holds what it waits for, never this wrapper, so that an
        # unclosed one is collected while its writes are pending.
        self._finalizer = weakref.finalize(
            self, _abandoned, self.io, writer, self._steps
        )
        _live.add(self)
        return writer

    def _retire(self, n: int) -> None:
        """Wait for the ``n`` oldest steps and count how they ended."""
        for _ in range(n):
            futures = self._steps.popleft()
            wait(futures)
            # Stored (or skipped): the writer has done with the step's host memory.
            self._pool.give(self._buffers.popleft())
            errors = [f.exception() for f in futures if f.exception() is not None]
            for error in errors:
                if self._error is None:
                    self._error = error
                    logger.debug(
                        f"OverlappedIO: write failed in the background: {error!r}"
                    )
                else:
                    logger.error(
                        f"OverlappedIO: another background write failed: {error!r}"
                    )
            if errors:
                self._counts["failed"] += 1
            elif all(f.result() for f in futures):
                self._counts["written"] += 1
            else:
                self._counts["skipped"] += 1

    def _raise_once(self) -> None:
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


def _abandoned(io: IOBackend, writer: Writer, steps: deque[list[Future[bool]]]) -> None:
    """Finish an OverlappedIO collected, or left at exit, with writes pending: wait
    for them, log what failed (nobody is left to raise it to), close the backend."""
    pending = sum(not all(f.done() for f in step) for step in steps)
    if pending:  # nothing pending is nothing lost: workflows flush it
        logger.warning(
            f"OverlappedIO around {type(io).__name__} was not closed"
            f"{' before exit' * _exiting}; flushing its {pending} pending write(s). "
            "Call close() or use it in a with block."
        )

    def report_and_close() -> None:
        for error in {f.exception() for step in steps for f in step} - {None}:
            logger.error(f"OverlappedIO: a pending write failed: {error!r}")
        _close_backend(io)

    # On one of the writer's own threads this returns at once: the rest is done there.
    writer.close(then=report_and_close)


def _close_backend(io: IOBackend) -> None:
    close = getattr(io, "close", None)
    if callable(close):
        close()


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


def drain(ios: Sequence[IOBackend], failed: bool) -> None:
    """Flush every :class:`OverlappedIO` in ``ios`` at the end of a workflow.

    Parameters
    ----------
    ios : Sequence[IOBackend]
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


def for_compiled_call(io: Any) -> OverlappedIO | None:
    """An :class:`OverlappedIO` around ``io`` for one ``compile=True`` workflow call
    of :mod:`earth2studio_compile.run`, where it is known to pay, else None.

    Two backends, each of exactly that class:

    - a ``ZarrBackend`` that takes parallel writes (see
      :func:`~earth2studio_compile.io.writers.parallel_writer`), in memory or on
      disk: there compile=True + ``OverlappedIO`` ran 4.7-11.6 times faster than
      upstream's eager call, where compile=True alone could not shorten it (the
      writes bound the call; H100, docs/performance.md, 2026-11-27/28);
    - an ``AsyncZarrBackend``, written by one worker (it writes concurrently
      itself): its writes still copy each variable from the device on the
      caller's thread, which ``OverlappedIO`` moves off it. An FCN ensemble on
      one (8 members x 10 steps, batch 4, TF32, H200, 2026-11-30): compile=True
      6.41 s alone, 5.46 s through it; upstream's eager 6.87 s.

    Other backends are left as they are: they were not measured, and a subclass
    may write otherwise.

    Parameters
    ----------
    io : Any
        The workflow's ``io`` argument

    Returns
    -------
    OverlappedIO | None
        With the default ``max_pending`` and workers, to be flushed (not closed:
        the backend is the caller's) before the call returns; None to use ``io``
        as it is
    """
    from earth2studio.io import AsyncZarrBackend, ZarrBackend

    if type(io) is AsyncZarrBackend:
        return OverlappedIO(io)
    if type(io) is not ZarrBackend or parallel_writer(io)[0] is None:
        return None
    return OverlappedIO(io)


def _finish_all_at_exit() -> None:
    global _exiting
    _exiting = True
    for io in list(_live):
        if io._finalizer is not None:
            io._finalizer()


# ``atexit`` hooks (and weakref.finalize's) run after ``concurrent.futures`` stops
# taking work, and with it asyncio's default executors, which Zarr stores through.
# Those pools register through ``threading._register_atexit``, whose hooks run in
# reverse order: this one, registered after importing them (writers did), runs first.
# Where it is missing, the finalizers still run at exit, through ``atexit``.
getattr(threading, "_register_atexit", atexit.register)(_finish_all_at_exit)
