"""The writer of a ``ZarrBackend`` (see :mod:`.writers`): upstream's ``write`` runs
once per step on a stand-in that keeps the storage step (``_write_array``,
upstream's seam for it); each array is then stored through Zarr's async API on its
lane, an event loop of its own, one whole chunk at a time where it can
(:mod:`.chunks`).

In a local directory a step is one job on a thread of its own (:mod:`.steps`): its
arrays' whole chunks, as Zarr's file step writes them, go in one batch that a pool
of put threads takes chunks from, in chunk directories made ahead
(:mod:`.directories`); only an array not stored so (a compressed one, a part of a
chunk, a chunk Zarr might skip as empty) goes to its lane. A lane job per array,
each handing the pool a job per chunk, cost the workflow's own thread a hand-off
of the GIL for each.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from earth2studio_compile.io.chunks import store_by_chunk
from earth2studio_compile.io.directories import Ahead
from earth2studio_compile.io.lanes import PREFIX, Lanes, _Ready, per_array
from earth2studio_compile.io.local_store import directories_ahead, store_local
from earth2studio_compile.io.steps import LocalSteps

# Type hints only: importing Earth2Studio takes a minute on a small machine.
if TYPE_CHECKING:
    from earth2studio.io.base import IOBackend
    from earth2studio.utils.type import CoordSystem

__all__ = ["FILE_THREADS", "ZarrWriter"]

#: Threads that write a store's files (Zarr's local store hands each chunk to its
#: event loop's executor; local_store.store_local to one pool), shared out over the
#: lanes, unless Zarr's own ``threading.max_workers`` says. On the H100 host, FCN
#: ensemble steps (9.5 GB) were stored in 1.7-1.9 s with 8 (4 lanes x 2, 8 x 1) and
#: 2.6-3.6 s with each lane loop's default executor (20 threads): more threads
#: taking turns at the GIL, not more writing
#: (docs/bench/2026-11-26-h100-fourth/writes-*.json).
FILE_THREADS = 8


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


class ZarrWriter(Lanes):
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
        # A local directory's chunks written as Zarr's file step does, no event loop
        # (local_store.store_local), from one pool for all lanes: a lane with more
        # arrays than another does not hold the step back.
        self._files = ThreadPoolExecutor(total, thread_name_prefix=f"{self._name} put")
        # A local directory's steps: one job each (steps.LocalSteps).
        self._local = LocalSteps(self, self._files, total)
        self._arrays: dict[str, Any] = {}
        self._closing = False
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
        ``io`` is a directory on disk (:func:`.local_store.directories_ahead`).

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

        return Ahead(make, f"{PREFIX}({type(io).__name__}) directories")

    def _jobs(
        self,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
    ) -> list[tuple[str | None, Callable[..., Any], list[Any]]]:
        collector, names = self._collector(x, coords, array_name)
        return [(name, self._store, [collector, name]) for name in names]

    def _collector(
        self,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
    ) -> tuple[_Collector, list[str]]:
        """The step's upstream ``write``, not run yet, and its array names."""
        xs, names = per_array(x, array_name)
        # Upstream's write runs on a stand-in, not a patched instance: the user's
        # backend stays untouched, also while its write runs here.
        root = self.io.root  # type: ignore[attr-defined]
        if self._members is None or self._members.group is not root:
            self._members = _Members(root)
        return _Collector(self.io, [xs, coords, names], self._members), names

    def _submit(
        self,
        step: int,
        ready: _Ready,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
    ) -> list[Future[bool]]:
        """In a local directory the step is one job (:class:`~earth2studio_compile.
        io.steps.LocalSteps`); elsewhere, a job per array on its lane."""
        from zarr.storage import LocalStore

        root = self.io.root  # type: ignore[attr-defined]
        if type(root.store) is not LocalStore:
            return super()._submit(step, ready, x, coords, array_name)
        collector, names = self._collector(x, coords, array_name)
        if not names:
            return []
        return self._local.submit(step, ready, collector, names)

    def _store(self, collector: _Collector, name: str) -> None:
        selection, data = collector.pop(name)
        self._store_array(name, selection, data)

    def _store_array(self, name: str, selection: tuple, data: np.ndarray) -> None:
        import zarr

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
        if self._closed or self._closing:
            return
        self._closing = True
        # After the last step: every write is then queued on a lane or the put pool.
        self._local.close(lambda: self._close_lanes(then))

    def _close_lanes(self, then: Callable[[], None] | None) -> None:
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
