"""Lanes: the one-thread executors a writer of :mod:`.writers` runs its jobs on, one
lane per array, so that each array's writes keep their order; and the writers that
call the backend's own ``write`` on them (:class:`SerialWriter`, :class:`KVWriter`).
"""

from __future__ import annotations

import itertools
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import torch

# Type hints only: importing Earth2Studio takes a minute on a small machine, and
# the package is imported before it (the demo's banner comes first).
if TYPE_CHECKING:
    from earth2studio.io.base import IOBackend
    from earth2studio.utils.type import CoordSystem

    from earth2studio_compile.io.directories import Ahead

__all__ = ["PREFIX", "KVWriter", "Lanes", "SerialWriter", "keeps_views", "per_array"]

#: The start of every writer thread's name.
PREFIX = "OverlappedIO"
_serial = itertools.count()


class Lanes(ABC):
    """One-thread executors, one lane per array name, shared by the writers: the
    jobs, skipping after a failure, and closing.

    Parameters
    ----------
    io : IOBackend
        The backend stored into
    workers : int
        Lanes: arrays that store at once
    """

    def __init__(self, io: IOBackend, workers: int) -> None:
        self.io = io
        self._name = f"{PREFIX}({type(io).__name__})#{next(_serial)}"
        self._lanes = [
            ThreadPoolExecutor(1, thread_name_prefix=f"{self._name} lane {i}")
            for i in range(workers)
        ]
        self._lane_of: dict[str | None, int] = {}
        self._failed_at = math.inf  # the earliest failed step: later ones are skipped
        self._lock = threading.Lock()
        self._closed = False
        self.own_copies = keeps_views(io)

    def _lane(self, name: str | None) -> int:
        return self._lane_of.setdefault(name, len(self._lane_of) % len(self._lanes))

    @staticmethod
    def ahead(io: IOBackend, names: Sequence[str]) -> Ahead | None:
        """What prepares the arrays ``names``, just added to ``io``, for their
        writes while the workflow computes its first step: none here (see
        :meth:`ZarrWriter.ahead`).

        Parameters
        ----------
        io : IOBackend
            The backend this writer class stores into
        names : Sequence[str]
            Arrays it has just created

        Returns
        -------
        Ahead | None
            Running until stopped (``stop()`` before the next ``add_array``, and
            before the backend is closed), or None
        """
        return None

    def submit(
        self,
        step: int,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
        ready: Sequence[torch.cuda.Event] = (),
    ) -> list[Future[bool]]:
        """Queue one step; returns at once (as ``Writer.submit`` in
        :mod:`.writers`), with one future per job (see :meth:`_jobs`).

        Parameters
        ----------
        step : int
            Its number, increasing with each call: after a failure, later ones are
            skipped
        x : torch.Tensor | list[torch.Tensor]
            Host tensors, the writer's own
        coords : CoordSystem
            Their coordinates, the writer's own
        array_name : str | list[str]
            Array name(s), as the backend's ``write`` takes them
        ready : Sequence[torch.cuda.Event], optional
            Events to wait for before reading ``x``

        Returns
        -------
        list[Future[bool]]
            One per job: True once stored, False if skipped, or the error
        """
        # One wait for the step, not one per job.
        return self._submit(step, _Ready(ready), x, coords, array_name)

    def _submit(
        self,
        step: int,
        ready: _Ready,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
    ) -> list[Future[bool]]:
        """:meth:`submit`'s queueing: a job per array on its lane (a writer that
        queues a step otherwise overrides this)."""
        return [
            self._lanes[self._lane(name)].submit(self._job, step, ready, store, args)
            for name, store, args in self._jobs(x, coords, array_name)
        ]

    @abstractmethod
    def _jobs(
        self,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
    ) -> list[tuple[str | None, Callable[..., Any], list[Any]]]:
        """The step's jobs: the array whose lane runs each, ``store`` and its
        arguments (a list, emptied once run)."""

    def _job(
        self,
        step: int,
        ready: _Ready,
        store: Callable[..., Any],
        args: list[Any],
    ) -> bool:
        try:
            if step > self._failed_at:
                return False
            ready.wait()
            if self.own_copies:
                args[:] = [_owned(a) for a in args]
            store(*args)
            return True
        except BaseException:
            self._fail(step)  # before this lane's next job and the future resolves
            raise
        finally:
            # The executor keeps ``args`` until the future has resolved; a waiter
            # may then copy a new step, and both host copies must not exist at once.
            args.clear()

    def _fail(self, step: int) -> None:
        """Skip the steps after ``step`` from now on (a write of it failed)."""
        with self._lock:
            self._failed_at = min(self._failed_at, step)

    def close(self, then: Callable[[], None] | None = None) -> None:
        """Wait for every job, call ``then``, stop the threads (see
        ``Writer.close`` in :mod:`.writers`)."""
        if self._closed:  # by a finalizer at exit, then by the wrapper's close()
            return
        self._closed = True
        # Each lane's marker runs after every job queued on it.
        markers = [lane.submit(int) for lane in self._lanes]

        def finish() -> None:
            wait(markers)
            if then is not None:
                then()

        if threading.current_thread().name.startswith(f"{self._name} lane "):
            self._lanes[0].submit(finish)
            for lane in self._lanes:
                lane.shutdown(wait=False)  # queued jobs still run
            return
        try:
            finish()
        finally:
            for lane in self._lanes:
                lane.shutdown()


class SerialWriter(Lanes):
    """Upstream's ``write`` of each whole step, on one thread, in order.

    Parameters
    ----------
    io : IOBackend
        Any Earth2Studio IO backend
    """

    def __init__(self, io: IOBackend) -> None:
        super().__init__(io, 1)

    def _jobs(
        self,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
    ) -> list[tuple[str | None, Callable[..., Any], list[Any]]]:
        return [(None, self.io.write, [x, coords, array_name])]


class KVWriter(Lanes):
    """A ``KVBackend`` written per variable: upstream's ``write`` of one array, on
    that array's lane, concurrently with the other arrays.

    Parameters
    ----------
    io : IOBackend
        A ``KVBackend`` that does not override ``write`` or ``add_array``
    workers : int
        Lanes: arrays that store at once
    """

    def _jobs(
        self,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
    ) -> list[tuple[str | None, Callable[..., Any], list[Any]]]:
        xs, names = per_array(x, array_name)
        return [
            (name, self.io.write, [xi, coords, name]) for xi, name in zip(xs, names)
        ]


class _Ready:
    """A step's copy events, shared by its jobs: the first job to ask waits for
    them; the others then find them waited for, without a call into CUDA.

    A job per array each called ``synchronize`` on the step's events: 27 calls a
    step for FCN's 26 variables (H200, docs/bench/2026-11-28-h200-twentieth), each
    letting go of the GIL and taking it back while the other lanes and the
    workflow's thread run Python.

    Parameters
    ----------
    events : Sequence[torch.cuda.Event]
        Recorded after the step's copies from CUDA; none for copies on the host
    """

    def __init__(self, events: Sequence[torch.cuda.Event]) -> None:
        self._events = list(events)
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Return once every event has completed; an error is raised to each job
        that asks (none is taken as waited for until it has)."""
        if not self._events:  # read under the GIL: set empty once all were waited
            return
        with self._lock:  # the others wait here, as they would on the events
            for event in self._events:
                event.synchronize()
            self._events = []


def _owned(arg: Any) -> Any:
    """A job's argument with its host tensors (alone or in a list) copied; the rest
    as it is (a :class:`ZarrWriter` copies what its collector hands over)."""
    if isinstance(arg, torch.Tensor):
        return arg.clone()
    if isinstance(arg, list) and any(isinstance(a, torch.Tensor) for a in arg):
        return [_owned(a) for a in arg]
    return arg


def per_array(
    x: torch.Tensor | list[torch.Tensor], array_name: str | list[str]
) -> tuple[list[torch.Tensor], list[str]]:
    """A step's tensors and names as lists, one per array.

    Parameters
    ----------
    x : torch.Tensor | list[torch.Tensor]
        One tensor or several
    array_name : str | list[str]
        One name or several

    Returns
    -------
    tuple[list[torch.Tensor], list[str]]
        Both as lists
    """
    xs = [x] if isinstance(x, torch.Tensor) else list(x)
    names = [array_name] if isinstance(array_name, str) else list(array_name)
    return xs, names


def keeps_views(io: IOBackend) -> bool:
    """Whether ``io`` keeps what it is given to store rather than a copy: a
    ``ZarrBackend`` on Zarr's memory store, which keeps the chunks' bytes as handed
    over.

    Parameters
    ----------
    io : IOBackend
        An Earth2Studio IO backend

    Returns
    -------
    bool
        True for a store known to keep views; False otherwise (a backend that
        keeps them unknown to this is still never handed a reused buffer it
        holds: :class:`~earth2studio_compile.io.host.HostPool` checks)
    """
    from earth2studio.io import ZarrBackend
    from zarr.storage import MemoryStore

    # Only ZarrBackend hands Zarr the arrays it is given (AsyncZarrBackend copies
    # into buffers of its own).
    return isinstance(io, ZarrBackend) and isinstance(io.root.store, MemoryStore)
