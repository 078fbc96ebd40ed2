"""Overlap output writing with the next step's compute, for any Earth2Studio IO backend.

Upstream's workflows call ``io.write`` once per step and wait for it: the backend copies
each variable to the host (a synchronizing device-to-host copy) and then encodes and
stores it, while the GPU sits idle. :class:`OverlappedIO` wraps any backend so that
``write`` only queues non-blocking copies into pinned host memory and returns; one
background thread waits for each copy and calls the wrapped backend's ``write`` with
host tensors, in the order the workflow wrote them.

Memory is bounded: host copies exist for at most ``max_pending + 1`` steps (one being
written, the others queued); a workflow that outruns its storage blocks in ``write``,
before copying, until the oldest step is written. An exception raised by the wrapped
backend reaches the calling thread once, as the original exception object, at the next
``write``, ``add_array``, ``flush`` or ``close``. The writer accepts nothing after it:
later ``write`` and ``add_array`` calls raise a ``RuntimeError`` chained to it, while
``flush`` and ``close`` do not raise it again. ``flush`` waits for every queued write.
The workflows of :mod:`earth2studio_compile.run` flush an ``OverlappedIO`` before they
return; with upstream's workflows use it as a context manager (or call ``close()``).

A writer that is never closed still loses nothing: dropping its last reference, or the
interpreter exiting, flushes its pending writes with a WARNING. Closing it is still
the way to close the wrapped backend at a known point, and to see a write error.

Parallel writing (``workers``): for backends that take it (``ZarrBackend``,
``KVBackend``; see :mod:`earth2studio_compile.writers`), each write is split per array
and stored by ``workers`` lanes (threads) at once: the arrays of one step, and those of
consecutive steps, store concurrently, while writes to one array keep their order on
one lane. Other backends (``NetCDF4Backend``: HDF5 takes one thread at a time) keep one
writer. The bound on host memory is the same: a step's copies are freed, and its slot
given back, once every one of its arrays is stored. Writes queued after a failed one
are not written; the writer logs how many, once the queue has drained.

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

import atexit
import os
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np
import torch
from loguru import logger

from earth2studio_compile.writers import Lane, Splitter, splitter_for

__all__ = ["OverlappedIO"]

# Sentinel that stops the worker thread.
_STOP = object()

# Wrappers not yet garbage, for the exit hook; weak, so that it keeps none alive.
_live: weakref.WeakSet[OverlappedIO] = weakref.WeakSet()


class _Job:
    """One ``write`` call: host tensors, the events that say they are filled, coords."""

    __slots__ = ("x", "coords", "array_name", "events", "remaining", "ok", "raised")

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
        # Parts not yet stored; whether every part was stored; whether one raised.
        self.remaining = 0
        self.ok = True
        self.raised = False


class _State:
    """What the writer threads share with their :class:`OverlappedIO`.

    The threads hold this, never the wrapper: a thread keeps its target's referents
    alive, and a wrapper kept alive by its own worker is never finalized, so an unclosed
    one would lose its pending writes when the (daemon) worker dies at exit.
    """

    __slots__ = (
        "busy",
        "delivered",
        "dropped",
        "error",
        "generation",
        "idle",
        "io",
        "lane_of",
        "lanes",
        "lock",
        "orphaned",
        "queue",
        "reported",
        "slots",
        "splitter",
        "threads",
        "workers",
        "written",
    )

    def __init__(
        self, io: Any, max_pending: int, splitter: Splitter | None, workers: int
    ) -> None:
        self.io = io
        # Unbounded: the slots bound the jobs, and the stop sentinel must always fit.
        self.queue: queue.Queue = queue.Queue()
        # One per step whose host copies exist (queued or being written); taken before
        # the copies are made, released once the backend is done with them.
        self.slots = threading.BoundedSemaphore(max_pending + 1)
        self.error: BaseException | None = None
        # The caller has seen ``error``: raise it once, never twice.
        self.delivered = False
        self.written = 0
        # Writes not (fully) written because an earlier one failed; how many of them
        # were logged.
        self.dropped = 0
        self.reported = 0
        # The wrapper was finalized on a writer thread: the dispatcher closes the
        # backend when it reaches the stop sentinel.
        self.orphaned = False
        self.splitter = splitter
        self.workers = workers
        # Parallel writing: one queue per lane, the lane of each array (writes to one
        # array stay in order on one lane), parts not yet stored.
        self.lanes: list[queue.Queue] = []
        self.lane_of: dict[str, int] = {}
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.busy = 0
        # Bumped by add_array: lanes forget the arrays they opened (one may be new).
        self.generation = 0
        self.threads: list[threading.Thread] = []


def _close_backend(io: Any) -> None:
    close = getattr(io, "close", None)
    if callable(close):
        close()


def _fail(state: _State, err: BaseException) -> None:
    """Keep the first error for the caller; log any later one, never drop it."""
    with state.lock:
        first = state.error is None
        if first:
            state.error = err
    if first:
        logger.debug(f"OverlappedIO: write failed in the background: {err!r}")
    else:
        logger.error(f"OverlappedIO: another background write also failed: {err!r}")


def _finish(state: _State, job: _Job) -> None:
    """Account for a job whose every part is done, then free its slot."""
    with state.lock:
        if job.ok:
            state.written += 1
        elif not job.raised:
            state.dropped += 1
    # Free the host copies before the slot: the next write copies once it has the
    # slot, and both must not exist at once.
    job.x = job.events = None  # type: ignore[assignment]
    state.slots.release()
    state.queue.task_done()


def _part_done(state: _State, job: _Job, ok: bool, raised: bool) -> None:
    with state.lock:
        job.remaining -= 1
        job.ok = job.ok and ok
        job.raised = job.raised or raised
        last = job.remaining == 0
        state.busy -= 1
        if state.busy == 0:
            state.idle.notify_all()
    if last:
        _finish(state, job)


def _wait_idle(state: _State) -> None:
    """Wait until every lane has stored every part given to it."""
    with state.idle:
        while state.busy:
            state.idle.wait()


def _dispatch(state: _State, job: _Job) -> None:
    """Write one job whole, or split it over the lanes."""
    if state.error is not None:  # after an error, write nothing more
        job.ok = False
        _finish(state, job)
        return
    try:
        for event in job.events:
            event.synchronize()
        parts = None
        if state.lanes:
            x = [job.x] if isinstance(job.x, torch.Tensor) else job.x
            names = (
                [job.array_name] if isinstance(job.array_name, str) else job.array_name
            )
            parts = state.splitter.split(state.io, x, job.coords, names)  # type: ignore[union-attr]
        if parts is None:
            _wait_idle(state)  # a whole write runs after everything before it
            state.io.write(job.x, job.coords, job.array_name)
    except BaseException as err:  # surfaced in the caller's thread
        _fail(state, err)
        job.ok, job.raised = False, True
        _finish(state, job)
        return
    if parts is None:
        _finish(state, job)
        return
    if not parts:
        _finish(state, job)
        return
    with state.lock:
        job.remaining = len(parts)
        state.busy += len(parts)
    for key, store in parts:
        lane = state.lane_of.setdefault(key, len(state.lane_of) % len(state.lanes))
        state.lanes[lane].put((job, store))


def _work(state: _State) -> None:
    """The dispatcher thread: take each job in order until the stop sentinel."""
    while True:
        job = state.queue.get()
        if job is _STOP:
            if state.orphaned:
                _wait_idle(state)
                # Nobody can queue more: the wrapper is gone.
                try:
                    _close_backend(state.io)
                except Exception as err:  # no caller left to raise it in
                    logger.error(
                        f"OverlappedIO: closing {type(state.io).__name__} failed: "
                        f"{err!r}"
                    )
                for lane in state.lanes:
                    lane.put(_STOP)
            state.queue.task_done()
            return
        _dispatch(state, job)
        # A local would keep the job's host copies alive while this waits.
        job = None


def _store(state: _State, lanes: queue.Queue) -> None:
    """A lane: store the parts given to it, in order, until the stop sentinel."""
    lane, generation = Lane(), state.generation
    while True:
        item = lanes.get()
        if item is _STOP:
            lane.close()
            return
        job, store = item
        item = None
        if generation != state.generation:
            lane.arrays.clear()
            generation = state.generation
        ok = raised = False
        try:
            if state.error is None:
                store(lane)
                ok = True
        except BaseException as err:  # surfaced in the caller's thread
            _fail(state, err)
            raised = True
        finally:
            store = None  # the part holds the host copy: gone before the slot is
            _part_done(state, job, ok, raised)
            job = None


class OverlappedIO:
    """An IO backend wrapper that writes on a background thread.

    Parameters
    ----------
    io : IOBackend
        Any Earth2Studio IO backend (``ZarrBackend``, ``NetCDF4Backend``,
        ``AsyncZarrBackend``, ``KVBackend``, ...)
    max_pending : int, optional
        Steps that may wait in the queue before ``write`` blocks, by default 2. Host
        memory in use is at most ``max_pending + 1`` steps of output (queued or being
        stored, with any number of workers): ``write`` waits for the oldest step to be
        written before it copies a new one
    pin_memory : bool | None, optional
        Copy CUDA tensors into pinned (page-locked) host memory, which lets the copy
        run asynchronously; by default None, meaning yes whenever CUDA is available
    workers : int | None, optional
        Threads that store at once, by default None: ``min(8, CPU cores)`` for
        backends that take parallel writes (``ZarrBackend``, ``KVBackend``), 1 for
        the others. With 1, one background thread calls the backend's ``write``,
        never concurrently. With more, each write is split per array; writes to one
        array keep their order

    Raises
    ------
    TypeError
        ``io`` lacks ``add_array``/``write``, or ``max_pending`` or ``workers`` is
        not an int
    ValueError
        ``max_pending`` < 1, ``workers`` < 1, or ``workers`` > 1 for a backend that
        must keep one writer (``NetCDF4Backend``, ``AsyncZarrBackend``, unknown ones)

    Notes
    -----
    One left unclosed is flushed, with a WARNING, when its last reference is dropped
    (and then the wrapped backend is closed), or else at interpreter exit (the backend
    is left as it is); a write error found then is logged.
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
        if isinstance(max_pending, bool) or not isinstance(
            max_pending, (int, np.integer)
        ):
            raise TypeError(
                f"max_pending must be an int, got {type(max_pending).__name__}."
            )
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}.")
        splitter, serial = splitter_for(io)
        if workers is None:
            workers = min(8, os.cpu_count() or 1) if splitter is not None else 1
        elif isinstance(workers, bool) or not isinstance(workers, (int, np.integer)):
            raise TypeError(
                f"workers must be an int or None, got {type(workers).__name__}."
            )
        elif workers < 1:
            raise ValueError(f"workers must be >= 1 (or None), got {workers}.")
        elif workers > 1 and splitter is None:
            raise ValueError(
                f"workers={workers}: {serial}; use workers=1 (or None) for it."
            )
        self.io = io
        #: Threads storing at once (1: one background thread calls ``io.write``).
        self.workers = int(workers)
        self.max_pending = int(max_pending)
        self.pin_memory = (
            torch.cuda.is_available() if pin_memory is None else pin_memory
        )
        self._state = _State(
            io, self.max_pending, splitter if self.workers > 1 else None, self.workers
        )
        self._queue = self._state.queue
        self._worker: threading.Thread | None = None
        self._closed = False
        self._blocked = 0.0
        _live.add(self)

    @property
    def written(self) -> int:
        """Writes that reached the wrapped backend so far (every array stored)."""
        return self._state.written

    @property
    def dropped(self) -> int:
        """Writes not written, or only in part, because an earlier write failed."""
        return self._state.dropped

    @property
    def blocked_s(self) -> float:
        """Seconds ``write`` has waited for storage so far.

        Above zero, storage was slower than the caller: ``max_pending + 1`` steps
        were queued or being stored, and ``write`` held the caller back.
        """
        return self._blocked

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

        Raises
        ------
        Exception
            Whatever an earlier background write raised, if not raised before
        RuntimeError
            An earlier background write failed and was raised before
        """
        self.flush()
        self._check_error()
        self.io.add_array(coords, array_name, **kwargs)
        # An array may have been created anew: lanes must not keep the old one open.
        self._state.generation += 1

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
            Whatever an earlier background write raised, if not raised before
        RuntimeError
            The writer was closed, or stopped after an earlier write error that was
            raised before
        """
        self._check()
        slots = self._state.slots
        # Blocks while max_pending + 1 steps have host copies: the bound on host memory
        # holds only if the slot is taken before copying.
        if not slots.acquire(blocking=False):
            start = time.perf_counter()
            slots.acquire()
            self._blocked += time.perf_counter() - start
        try:
            self._check()  # a write may have failed while this waited
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
        except BaseException:
            slots.release()
            raise
        # Never blocks (the queue is unbounded): the slot already did.
        self._queue.put(job)

    # -- draining ----------------------------------------------------------------------
    def flush(self) -> None:
        """Wait until every queued write reached the wrapped backend.

        Raises
        ------
        Exception
            Whatever a background write raised, if not raised before
        """
        if self._worker is not None:
            self._queue.join()
        state = self._state
        if state.dropped > state.reported:
            logger.error(
                f"OverlappedIO: {state.dropped - state.reported} write(s) queued "
                "after a failed one were not written, or only in part: the writer "
                "stops at its first error."
            )
            state.reported = state.dropped
        self._raise()

    def close(self) -> None:
        """Flush, stop the worker, then ``close()`` the wrapped backend if it has one.

        Raises
        ------
        Exception
            Whatever a background write raised, if not raised before (the worker is
            stopped and the wrapped backend closed regardless)
        """
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._stop()
            self._closed = True
            # A file-backed backend left open after a write error would keep its file
            # handle and lose what it did write.
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
        if not self._unclosed():
            return
        if self._queue.unfinished_tasks:
            self._warn_unclosed("")
        if threading.current_thread() in self._state.threads:
            # The garbage collector ran this on a writer thread, which cannot wait
            # for itself: the dispatcher finishes the queue, then closes the backend.
            self._state.orphaned = True
            self._queue.put(_STOP)
            return
        try:
            self.close()
        except Exception as err:  # a finalizer must not raise
            logger.error(f"OverlappedIO: a pending write failed: {err!r}")

    def _flush_at_exit(self) -> None:
        if not self._unclosed():
            return
        # Nothing pending is nothing lost: the documented pattern passes an
        # OverlappedIO to a workflow (which flushes it) and never closes it.
        if self._queue.unfinished_tasks:
            self._warn_unclosed(" before exit")
        try:
            self.flush()
        except Exception as err:  # nobody left to raise it in
            logger.error(f"OverlappedIO: a pending write failed: {err!r}")
        finally:
            self._stop()

    # -- internals ---------------------------------------------------------------------
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
            raise RuntimeError(
                "OverlappedIO is closed; create a new one to write again."
            )
        self._check_error()

    def _check_error(self) -> None:
        self._raise()
        error = self._state.error
        if error is not None:
            # Raised once already; refusing silently would drop this write unnoticed.
            raise RuntimeError(
                f"OverlappedIO: the writer stopped after an earlier write error "
                f"({error!r}); create a new one to write again."
            ) from error

    def _raise(self) -> None:
        state = self._state
        if state.error is not None and not state.delivered:
            state.delivered = True
            raise state.error

    def _unclosed(self) -> bool:
        # Read through __dict__: __init__ may have raised before setting these.
        worker = self.__dict__.get("_worker")
        closed = self.__dict__.get("_closed", True)
        return worker is not None and worker.is_alive() and not closed

    def _warn_unclosed(self, when: str) -> None:
        logger.warning(
            f"OverlappedIO around {type(self.io).__name__} was not closed{when}; "
            f"flushing its {self._queue.unfinished_tasks} pending write(s). Call "
            "close() or use it in a with block."
        )

    def _start(self) -> None:
        if self._worker is not None:
            return
        state, kind = self._state, type(self.io).__name__
        # Only the state, not self: see _State.
        threads = [
            threading.Thread(
                target=_work, args=(state,), name=f"OverlappedIO({kind})", daemon=True
            )
        ]
        if state.splitter is not None:
            for i in range(state.workers):
                state.lanes.append(queue.Queue())
                threads.append(
                    threading.Thread(
                        target=_store,
                        args=(state, state.lanes[-1]),
                        name=f"OverlappedIO({kind}) lane {i}",
                        daemon=True,
                    )
                )
        state.threads = threads
        for thread in threads:
            thread.start()
        self._worker = threads[0]

    def _stop(self) -> None:
        if self._worker is None:
            return
        state = self._state
        self._queue.put(_STOP)
        self._worker.join()
        for lane in state.lanes:
            lane.put(_STOP)
        for thread in state.threads[1:]:
            thread.join()
        state.lanes.clear()
        state.lane_of.clear()
        self._worker = None


def drain(ios: Sequence[Any], failed: bool) -> None:
    """Flush every :class:`OverlappedIO` in ``ios`` at the end of a workflow.

    Parameters
    ----------
    ios : Sequence[Any]
        The workflow's IO arguments
    failed : bool
        The workflow raised: wait for the writer but let the workflow's own
        exception, not a writer error, reach the caller (a write error the caller
        has not seen is logged; one it has seen is not reported again)
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


@atexit.register
def _flush_at_exit() -> None:
    """Flush every wrapper left unclosed when the interpreter exits.

    Its worker is a daemon thread, stopped dead once the interpreter finalizes; atexit
    callbacks run before that. Registered after torch and loguru are imported, so it
    runs before their own exit hooks.
    """
    for io in list(_live):
        io._flush_at_exit()
