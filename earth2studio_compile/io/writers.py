"""Writers: how :class:`~earth2studio_compile.io.OverlappedIO` stores each step.

A :class:`Writer` takes one step's host copies and returns one future per array (one
for the whole step where it calls the backend's ``write`` once), each resolving to
True once stored, False if skipped because an earlier step failed, or the error.
Writes to one array keep their order; after a failure, only steps queued after the
failed one are skipped (the failing step's other arrays are still stored, as the
backend's own ``write`` would have stored those before the failing one).

- :class:`SerialWriter`: any backend, upstream's ``write`` of the whole step on one
  thread. The only writer for ``NetCDF4Backend`` (HDF5 takes one thread at a time),
  ``AsyncZarrBackend`` (it writes concurrently itself), subclasses that override
  the storage methods, and any backend not listed below.
- :class:`KVWriter`: ``KVBackend``, upstream's ``write`` of each variable on that
  array's lane.
- :class:`ZarrWriter`: ``ZarrBackend``, upstream's ``write`` runs once per step on a
  stand-in that keeps the storage step (``_write_array``, upstream's seam for it);
  each array is then stored through Zarr's async API on its lane, an event loop of
  its own, one whole chunk at a time where it can (:mod:`.chunks`; a store that
  keeps views gets copies, made on a pool of the writer's own; a store that writes
  files does so on a few threads per lane, :data:`FILE_THREADS` in all). Whole
  chunks of an uncompressed array in a local directory skip the event loop: Zarr's
  own encode and file steps, called from one pool of :data:`FILE_THREADS` shared
  by the lanes (:func:`.chunks.store_local`), in chunk directories made ahead
  from the moment the arrays are added (:meth:`ZarrWriter.ahead`). Measured
  against one shared loop with a future per array (as Earth2Studio's
  ``AsyncZarrBackend`` does), the lanes were faster on a writing-bound CPU rollout.

A lane is a one-thread ``ThreadPoolExecutor``; each array always goes to the same
one, so its writes keep their order.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from earth2studio_compile.io.chunks import (
    directories_ahead,
    store_by_chunk,
    store_local,
)
from earth2studio_compile.io.directories import Ahead

# Type hints only: importing Earth2Studio takes a minute on a small machine, and
# the package is imported before it (the demo's banner comes first).
if TYPE_CHECKING:
    from earth2studio.io.base import IOBackend
    from earth2studio.utils.type import CoordSystem

__all__ = [
    "KVWriter",
    "SerialWriter",
    "Writer",
    "ZarrWriter",
    "keeps_views",
    "parallel_writer",
]

_PREFIX = "OverlappedIO"
_serial = itertools.count()
#: Threads that write a store's files (Zarr's local store hands each chunk to its
#: event loop's executor; chunks.store_local to one pool), shared out over the
#: lanes, unless Zarr's own ``threading.max_workers`` says. On the H100 host, FCN
#: ensemble steps (9.5 GB) were stored in 1.7-1.9 s with 8 (4 lanes x 2, 8 x 1) and
#: 2.6-3.6 s with each lane loop's default executor (20 threads): more threads
#: taking turns at the GIL, not more writing
#: (docs/bench/2026-11-26-h100-fourth/writes-*.json).
FILE_THREADS = 8


class Writer(Protocol):
    """Stores steps of host copies in the background.

    Attributes
    ----------
    own_copies : bool
        Whether the writer copies each step (on its threads, once its copies are
        ready) before storing it: for a backend that keeps what it is given
        (:func:`keeps_views`), which then keeps copies of its own, so that the
        caller's buffers can be reused
    """

    own_copies: bool

    def submit(
        self,
        step: int,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
        ready: Sequence[torch.cuda.Event] = (),
    ) -> list[Future[bool]]:
        """Queue one step; returns at once.

        Parameters
        ----------
        step : int
            Its number, increasing with each call: after a failure, later ones are
            skipped
        x : torch.Tensor | list[torch.Tensor]
            Host tensors, the writer's own (it drops them once stored)
        coords : CoordSystem
            Their coordinates, the writer's own
        array_name : str | list[str]
            Array name(s), as the backend's ``write`` takes them
        ready : Sequence[torch.cuda.Event], optional
            Events to wait for before reading ``x`` (its device-to-host copies)

        Returns
        -------
        list[Future[bool]]
            One per array, or one for the whole step: True once stored, False if
            skipped, or the backend's error
        """
        ...

    def close(self, then: Callable[[], None] | None = None) -> None:
        """Wait for every step submitted, call ``then``, stop the threads.

        Called on one of its own threads (which cannot wait for itself), it returns
        at once; the queued steps are stored, then ``then`` runs, on its threads.
        """
        ...


class _Lanes(ABC):
    """One-thread executors, one lane per array name, shared by the writers below:
    the jobs, skipping after a failure, and closing."""

    def __init__(self, io: IOBackend, workers: int) -> None:
        self.io = io
        self._name = f"{_PREFIX}({type(io).__name__})#{next(_serial)}"
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
        """Queue one step; returns at once (see :meth:`Writer.submit`), with one
        future per job (see :meth:`_jobs`)."""
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
        ready: Sequence[torch.cuda.Event],
        store: Callable[..., Any],
        args: list[Any],
    ) -> bool:
        try:
            if step > self._failed_at:
                return False
            for event in ready:
                event.synchronize()
            if self.own_copies:
                args[:] = [_owned(a) for a in args]
            store(*args)
            return True
        except BaseException:
            # Set before this lane's next job and before the future resolves.
            with self._lock:
                self._failed_at = min(self._failed_at, step)
            raise
        finally:
            # The executor keeps ``args`` until the future has resolved; a waiter
            # may then copy a new step, and both host copies must not exist at once.
            args.clear()

    def close(self, then: Callable[[], None] | None = None) -> None:
        """Wait for every job, call ``then``, stop the threads (see
        :meth:`Writer.close`)."""
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


class SerialWriter(_Lanes):
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


class KVWriter(_Lanes):
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
        xs, names = _per_array(x, array_name)
        return [
            (name, self.io.write, [xi, coords, name]) for xi, name in zip(xs, names)
        ]


class _Members:
    """A Zarr group whose members, once found, are taken to stay: upstream's
    ``write`` asks whether each dimension and array is in its group at every step,
    each a round trip through Zarr's synchronous API (its event-loop thread: 8 per
    DLWP step, Python a writer thread spends the GIL on). A member found is answered
    from memory; one not found is asked every time, as upstream does. Only a
    member deleted from the store while the workflow writes to it would be
    answered otherwise, and upstream's check would race with that too."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self._found: set[str] = set()

    def __contains__(self, name: object) -> bool:
        if name in self._found:
            return True
        found = name in self.group
        if found and isinstance(name, str):
            self._found.add(name)
        return found

    def __getitem__(self, name: str) -> Any:
        return self.group[name]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.group, name)


class _Collector:
    """Stands in for a ``ZarrBackend`` in upstream's ``write`` of one step: all is the
    backend's but the storage step, which is kept for the step's array jobs, and its
    group, ``root``, seen through :class:`_Members`. The first job to ask runs it;
    the others reuse what it kept (or its error)."""

    def __init__(self, io: IOBackend, args: list[Any], members: _Members) -> None:
        self._io, self._args = io, args
        self.root = members
        self._lock = threading.Lock()
        self._stores: dict[str, list[tuple[tuple, np.ndarray]]] | None = None
        self._error: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._io, name)

    def _write_array(self, name: str, selection: tuple, data: np.ndarray) -> None:
        assert self._stores is not None
        self._stores.setdefault(name, []).append((selection, data))

    def pop(self, name: str) -> tuple[tuple, np.ndarray]:
        """The selection and data of array ``name``'s next job (its jobs run in
        order, on its lane)."""
        with self._lock:
            if self._stores is None and self._error is None:
                self._stores = {}
                try:
                    type(self._io).write(self, *self._args)  # type: ignore[arg-type]
                except BaseException as error:
                    self._error = error
                finally:
                    self._args.clear()
            if self._error is not None:
                raise self._error
            assert self._stores is not None
            return self._stores[name].pop(0)


class ZarrWriter(_Lanes):
    """A ``ZarrBackend`` written per array through Zarr's async API, each array on
    its lane with that lane's own event loop (see the module's docstring).

    Parameters
    ----------
    io : IOBackend
        A ``ZarrBackend`` that does not override ``write`` or ``_write_array``
    workers : int
        Lanes: arrays that store at once
    """

    def __init__(self, io: IOBackend, workers: int) -> None:
        import zarr

        super().__init__(io, workers)
        total = zarr.config.get("threading.max_workers", None) or FILE_THREADS
        files = [
            ThreadPoolExecutor(
                max(1, math.ceil(total / workers)),
                thread_name_prefix=f"{self._name} files {i}",
            )
            for i in range(workers)
        ]
        # Each used only on its lane's thread, as are the arrays it opened; closing
        # it shuts its loop's executor down.
        self._runners = [asyncio.Runner(loop_factory=_loop(f)) for f in files]
        # A local directory's chunks written by Zarr's file step with no event loop
        # (chunks.store_local), from one pool for all lanes: a lane with more
        # arrays than another does not hold the step back.
        self._files = ThreadPoolExecutor(total, thread_name_prefix=f"{self._name} put")
        self._arrays: dict[str, Any] = {}
        self._members: _Members | None = None
        # Copies for a store that keeps views, several at once: page faults into
        # fresh memory, on as many cores as there are lanes.
        self._copier = (
            ThreadPoolExecutor(workers, thread_name_prefix=f"{self._name} copy")
            if self.own_copies
            else None
        )

    @staticmethod
    def ahead(io: IOBackend, names: Sequence[str]) -> Ahead | None:
        """The new arrays' chunk directories, made on a thread from now on, where
        ``io`` is a directory on disk (:func:`.chunks.directories_ahead`).

        Parameters
        ----------
        io : IOBackend
            A ``ZarrBackend``
        names : Sequence[str]
            Arrays it has just created

        Returns
        -------
        Ahead | None
            Making their directories until done or stopped; None for a store
            that is not a local directory
        """
        from zarr.storage import LocalStore

        root = io.root  # type: ignore[attr-defined]
        if type(root.store) is not LocalStore:
            return None

        def make(stop: threading.Event) -> int:
            return directories_ahead([root[n].async_array for n in names], stop)

        return Ahead(make, f"{_PREFIX}({type(io).__name__}) directories")

    def _jobs(
        self,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
    ) -> list[tuple[str | None, Callable[..., Any], list[Any]]]:
        xs, names = _per_array(x, array_name)
        # Upstream's write runs on a stand-in, not a patched instance: the user's
        # backend stays untouched, also while its write runs here.
        root = self.io.root  # type: ignore[attr-defined]
        if self._members is None or self._members.group is not root:
            self._members = _Members(root)
        collector = _Collector(self.io, [xs, coords, names], self._members)
        return [(name, self._store, [collector, name]) for name in names]

    def _store(self, collector: _Collector, name: str) -> None:
        import zarr

        selection, data = collector.pop(name)
        io = self.io
        if not all(isinstance(s, (slice, int, np.integer)) for s in selection):
            # Zarr's async API takes basic selections only; upstream's storage step
            # handles the rest through Zarr's synchronous API.
            if self.own_copies:  # on the array's lane, not in the step's first job
                data = np.array(data, copy=True)
            type(io)._write_array(io, name, selection, data)  # type: ignore[attr-defined]
            return
        runner = self._runners[self._lane(name)]
        if name not in self._arrays:
            root = io.root  # type: ignore[attr-defined]
            array = runner.run(
                zarr.api.asynchronous.open_array(
                    store=root.store,
                    path=f"{root.path}/{name}" if root.path else name,
                    mode="r+",
                )
            )
            unchecked = array.with_config({"write_empty_chunks": True})
            self._arrays[name] = (array, unchecked)
        array, unchecked = self._arrays[name]
        if store_local(array, selection, data, self._files):
            return
        runner.run(
            store_by_chunk(
                array, selection, data, unchecked, self.own_copies, self._copier
            )
        )

    def close(self, then: Callable[[], None] | None = None) -> None:
        if self._closed:
            return
        # A runner closes on its lane's thread, after that lane's last store.
        for lane, runner in zip(self._lanes, self._runners):
            lane.submit(runner.close)
        copier, files = self._copier, self._files

        def finish() -> None:
            # After every lane's last store: none copies or writes any more.
            files.shutdown()
            if copier is not None:
                copier.shutdown()
            if then is not None:
                then()

        super().close(finish)


def _loop(files: ThreadPoolExecutor) -> Callable[[], asyncio.AbstractEventLoop]:
    """An event loop factory: its default executor (``asyncio.to_thread``) is
    ``files``."""

    def make() -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        loop.set_default_executor(files)
        return loop

    return make


def _owned(arg: Any) -> Any:
    """A job's argument with its host tensors (alone or in a list) copied; the rest
    as it is (a :class:`ZarrWriter` copies what its collector hands over)."""
    if isinstance(arg, torch.Tensor):
        return arg.clone()
    if isinstance(arg, list) and any(isinstance(a, torch.Tensor) for a in arg):
        return [_owned(a) for a in arg]
    return arg


def _per_array(
    x: torch.Tensor | list[torch.Tensor], array_name: str | list[str]
) -> tuple[list[torch.Tensor], list[str]]:
    xs = [x] if isinstance(x, torch.Tensor) else list(x)
    names = [array_name] if isinstance(array_name, str) else list(array_name)
    return xs, names


def _overrides(io: IOBackend, base: type, methods: tuple[str, ...]) -> bool:
    return any(
        getattr(type(io), m) is not getattr(base, m) or m in vars(io) for m in methods
    )


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


def parallel_writer(io: IOBackend) -> tuple[type[KVWriter | ZarrWriter] | None, str]:
    """How ``io`` may be written in parallel.

    Parameters
    ----------
    io : IOBackend
        An Earth2Studio IO backend

    Returns
    -------
    tuple[type[KVWriter | ZarrWriter] | None, str]
        The writer class, or None where the backend keeps one writer
        (:class:`SerialWriter`), and why
    """
    from earth2studio.io import AsyncZarrBackend, KVBackend, NetCDF4Backend, ZarrBackend

    kind = type(io).__name__
    if isinstance(io, NetCDF4Backend):
        return None, f"{kind} writes HDF5 files, which take one thread at a time"
    if isinstance(io, AsyncZarrBackend):
        return None, f"{kind} already writes concurrently itself"
    if isinstance(io, ZarrBackend):
        if _overrides(io, ZarrBackend, ("write", "_write_array")):
            return None, f"{kind} overrides ZarrBackend's write or _write_array"
        return ZarrWriter, ""
    if isinstance(io, KVBackend):
        if _overrides(io, KVBackend, ("write", "add_array")):
            return None, f"{kind} overrides KVBackend's write or add_array"
        return KVWriter, ""
    return None, f"{kind} is not known to take concurrent writes"
