"""A local directory's steps for :class:`~earth2studio_compile.io.writers.ZarrWriter`:
each step one job on a thread of its own, its arrays' whole chunks in one batch
that the writer's put threads take chunks from.

A job per array on its lane, each handing the put pool a job per chunk and waiting
for them, woke a lane and made a hand-off of the GIL per array and per chunk: 26
lane jobs and 104 put jobs a step for an FCN ensemble of 4 members, and about three
times the context switches of plain threads writing the same files, while the
workflow's own thread waited for the GIL (docs/bench/2026-11-28-cpu-writers). Here
a step wakes the steps' thread once and each put thread once at most.

Writes of a chunk keep their step order: a step's write of a chunk that an earlier
step is still writing waits for it (by the chunk, not the array: an ensemble's
steps write other chunks, and never wait). An array that is not stored in whole
chunks here goes to its lane, after its chunks in flight.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from earth2studio_compile.io.local_store import local_chunks

if TYPE_CHECKING:
    from earth2studio_compile.io.lanes import _Ready

__all__ = ["LocalSteps"]


class ZarrWriter(Protocol):
    """What the steps use of their :class:`~earth2studio_compile.io.writers.
    ZarrWriter` (a Protocol here: that module imports this one)."""

    io: Any
    _name: str
    _failed_at: float
    _lanes: list[ThreadPoolExecutor]

    def _fail(self, step: int) -> None: ...

    def _lane(self, name: str | None) -> int: ...

    def _store_array(self, name: str, selection: tuple, data: np.ndarray) -> None: ...


class _Collector(Protocol):
    """A step's upstream ``write``, run on a stand-in: each array's selection and
    data, once asked for."""

    def pop(self, name: str) -> tuple[tuple, np.ndarray]: ...


class LocalSteps:
    """The steps of a :class:`~earth2studio_compile.io.writers.ZarrWriter` whose
    store is a local directory.

    Parameters
    ----------
    writer : ZarrWriter
        Its lanes, its failed step and its storage step for an array not stored
        in whole chunks here
    files : ThreadPoolExecutor
        The writer's put threads
    threads : int
        Their number: a step's put jobs at most
    """

    def __init__(
        self,
        writer: ZarrWriter,
        files: ThreadPoolExecutor,
        threads: int,
    ) -> None:
        self._writer, self._files, self._threads = writer, files, threads
        self._steps = ThreadPoolExecutor(1, thread_name_prefix=f"{writer._name} steps")
        self._opened: dict[str, Any] = {}
        # Per array, the write in flight of each chunk (by its first index) and the
        # last write handed to its lane; kept on the steps' thread only.
        self._inflight: dict[str, dict[tuple[int, ...], Future[bool]]] = {}
        self._on_lane: dict[str, Future[bool]] = {}

    def submit(
        self, step: int, ready: _Ready, collector: _Collector, names: list[str]
    ) -> list[Future[bool]]:
        """Queue one step's arrays ``names``; returns at once, a future per array
        (as ``Lanes.submit``).

        Parameters
        ----------
        step : int
            Its number (see ``Lanes.submit``)
        ready : _Ready
            Its copies, waited for before its data is read
        collector : _Collector
            Upstream's ``write`` of the step, not run yet
        names : list[str]
            Its arrays, in ``write``'s order

        Returns
        -------
        list[Future[bool]]
            One per array: True once stored, False if skipped, or the error
        """
        futures: list[Future[bool]] = [Future() for _ in names]
        self._steps.submit(self._step, step, ready, collector, names, futures)
        return futures

    def close(self, rest: Callable[[], None]) -> None:
        """Run every step queued, then ``rest``, then stop the thread. Called on
        one of the writer's threads (which the steps may wait for), it returns at
        once, and the steps' thread runs ``rest``.

        Parameters
        ----------
        rest : Callable[[], None]
            The writer's closing: every write is then queued on a lane or the put
            threads
        """
        steps = self._steps
        if threading.current_thread().name.startswith(f"{self._writer._name} "):
            steps.submit(rest)
            steps.shutdown(wait=False)
            return
        steps.shutdown()
        rest()

    def _step(
        self,
        step: int,
        ready: _Ready,
        collector: _Collector,
        names: list[str],
        futures: list[Future[bool]],
    ) -> None:
        """Store one step (on the steps' thread): upstream's ``write`` on the
        collector, then each array's whole chunks (:func:`.local_store.local_chunks`)
        into one batch (:meth:`_launch`), or the array to its lane. An array's
        future resolves once its last chunk is written or skipped (a chunk of a
        step after a failed one), or with its first error once every chunk was
        tried."""
        writer = self._writer
        try:
            if step > writer._failed_at:
                for future in futures:
                    future.set_result(False)
                return
            ready.wait()
            writes = deque(collector.pop(name) for name in names)
        except BaseException as error:
            _failed(writer, step, futures, error)
            return
        batch: deque[tuple[Any, ...]] = deque()
        try:
            for name, future in zip(names, futures):
                # Popped, not kept here: the step's host memory is held only by
                # what writes it, until it is written.
                batch = self._queue(step, name, future, writes.popleft(), batch)
        except BaseException as error:  # not an array's own: none is left waiting
            _failed(writer, step, futures, error)
            raise
        for inflight in self._inflight.values():
            for key in [k for k, f in inflight.items() if f.done()]:
                del inflight[key]
        self._launch(batch)

    def _queue(
        self,
        step: int,
        name: str,
        future: Future[bool],
        write: tuple[tuple, np.ndarray],
        batch: deque[tuple[Any, ...]],
    ) -> deque[tuple[Any, ...]]:
        """Add array ``name``'s whole chunks to ``batch`` (returned, or a new one
        where the old had to be launched first), or queue its write on its lane."""
        selection, data = write
        try:
            planned = self._plan(name, selection, data)
        except BaseException as error:
            self._writer._fail(step)
            future.set_exception(error)
            return batch
        inflight = self._inflight.setdefault(name, {})
        if planned is None:
            self._on_its_lane(step, name, selection, data, future)
            return batch
        put, chunks = planned
        if not chunks:  # nothing to write (local_chunks takes no empty selection)
            future.set_result(True)
            return batch
        keys = [tuple(s.start for s in outer) for outer, _ in chunks]
        earlier = [inflight[k] for k in keys if k in inflight]
        if name in self._on_lane:
            earlier.append(self._on_lane[name])
        if not all(f.done() for f in earlier):
            # Launched before waiting: an earlier write may be in this batch.
            self._launch(batch)
            batch = deque()
            wait(earlier)
        done = _Write(future, len(chunks))
        for key in keys:
            inflight[key] = future
        batch.extend((step, put, outer, piece, done) for outer, piece in chunks)
        return batch

    def _plan(
        self, name: str, selection: tuple, data: np.ndarray
    ) -> tuple[Callable[..., None], list[Any]] | None:
        """:func:`.local_store.local_chunks` for array ``name``; None where its lane is
        to store it."""
        if not all(isinstance(s, (slice, int, np.integer)) for s in selection):
            return None
        if name not in self._opened:
            # Its metadata and store are read, no coroutine run: opened once,
            # through Zarr's synchronous API (as upstream's write opens it).
            root = self._writer.io.root  # type: ignore[attr-defined]
            self._opened[name] = root[name].async_array
        return local_chunks(self._opened[name], selection, data)

    def _launch(self, batch: deque[tuple[Any, ...]]) -> None:
        """Let the put threads take ``batch``'s chunks: a job per thread (as many
        as chunks at most), not one per chunk."""
        for _ in range(min(self._threads, len(batch))):
            self._files.submit(self._take, batch)

    def _take(self, batch: deque[tuple[Any, ...]]) -> None:
        """Write chunks from ``batch`` until none is left (on a put thread)."""
        writer = self._writer
        while True:
            try:
                step, put, outer, piece, write = batch.popleft()
            except IndexError:
                return
            error = None
            stored = step <= writer._failed_at
            if stored:
                try:
                    put(outer, piece)
                except BaseException as failed:
                    error = failed
                    writer._fail(step)  # before the array's future resolves
            # The chunk's host memory is let go before its future may resolve.
            del outer, piece
            write.done(stored, error)

    def _on_its_lane(
        self,
        step: int,
        name: str,
        selection: tuple,
        data: np.ndarray,
        future: Future[bool],
    ) -> None:
        """Queue array ``name``'s write on its lane, after its chunks still in
        flight from earlier steps."""
        writer = self._writer
        inflight = self._inflight[name]
        earlier = [f for f in inflight.values() if not f.done()]
        inflight.clear()  # its lane's later jobs come after this one
        self._on_lane[name] = future
        args: list[Any] = [name, selection, data]

        def job() -> None:
            try:
                wait(earlier)
                stored = step <= writer._failed_at
                if stored:
                    writer._store_array(*args)
            except BaseException as error:
                writer._fail(step)
                args.clear()
                future.set_exception(error)
            else:
                args.clear()  # before the future resolves (see Lanes._job)
                future.set_result(stored)

        writer._lanes[writer._lane(name)].submit(job)


def _failed(
    writer: ZarrWriter,
    step: int,
    futures: list[Future[bool]],
    error: BaseException,
) -> None:
    """Step ``step`` failed with ``error`` before all its arrays were queued: the
    later steps are skipped, and every array's future not yet resolved gets the
    error."""
    writer._fail(step)
    for future in futures:
        if not future.done():
            future.set_exception(error)


class _Write:
    """One array's write of a step in whole chunks: its future resolves once the
    last of its chunks is written or skipped, with the first error if any.

    Parameters
    ----------
    future : Future[bool]
        The array's: True once stored, False if a chunk was skipped
    chunks : int
        Its chunks, at least one
    """

    def __init__(self, future: Future[bool], chunks: int) -> None:
        self.future, self._left, self._stored = future, chunks, True
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def done(self, stored: bool, error: BaseException | None) -> None:
        """One chunk written (``stored``), skipped or failed (``error``)."""
        with self._lock:
            self._left -= 1
            self._stored = self._stored and stored
            if self._error is None:
                self._error = error
            if self._left:
                return
        if self._error is not None:
            self.future.set_exception(self._error)
        else:
            self.future.set_result(self._stored)
