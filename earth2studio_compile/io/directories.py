"""The chunk directories of Zarr's local stores: each made once, side by side, and
ahead of the writes where a store's arrays are new.

Zarr's ``LocalStore`` keeps a chunk of an array under a key such as
``c/<member>/<time>/<lead time>/0/0``, a directory per part but the last. In
Earth2Studio's stores (one chunk per member, variable and lead time) nearly every
chunk has a directory of its own, new when the chunk is written: making it costs
the writer threads more than half as long as writing the chunk's bytes (py-spy on an
H100's host, 2026-11-28, docs/bench/2026-11-28-h100-seventeenth). :class:`Ahead`
makes the new arrays' directories on a thread of its own from the moment they are
added, while the workflow's first step is computed and nothing is written yet, so
that :func:`~earth2studio_compile.io.local_store.store_local` finds them made.

Directories are plain strings (``os.path``), not ``pathlib.Path``: a put thread
checks and makes one per chunk, holding the GIL the workflow's thread waits for,
and ``Path``'s parsing, hashing and comparing were a third of its Python per chunk
(cProfile, this project's CPU machine, 2026-11-28).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from loguru import logger

__all__ = ["Ahead", "known_directories", "make_directory"]

#: Directories made in each open local store (by ``id``, as a ``LocalStore`` is
#: unhashable; dropped with the store), as many as ``_KNOWN_AT_MOST`` a store. Per
#: store, not per step: a step's chunks may go into directories an earlier step made.
_known: dict[int, set[str]] = {}
_known_lock = threading.Lock()
_KNOWN_AT_MOST = 1 << 14
#: Locks a directory is made under, by its hash: the chunks of one directory wait
#: for each other, those of others mostly not. Under one lock, every directory made
#: waited for every other: where a chunk's directory is new at each lead time
#: (Earth2Studio's stores), the put threads waited on it more than they wrote
#: (py-spy, this project's CPU machine, 2026-11-27: 2798 samples waiting, about 1100
#: writing).
_STRIPES = tuple(threading.Lock() for _ in range(64))


def known_directories(store: Any) -> set[str]:
    """The directories made in ``store`` so far (see ``_known``), a set kept while
    the store lives.

    Parameters
    ----------
    store : zarr.storage.LocalStore
        An open local store

    Returns
    -------
    set[str]
        Its directories known to exist; the caller adds to it only through
        :func:`make_directory`
    """
    key = id(store)
    with _known_lock:
        known = _known.get(key)
        if known is None:
            known = _known[key] = set()
            # Before the store's id can be another's. The callback takes no lock:
            # it may run in a garbage collection on a thread holding _known_lock.
            weakref.finalize(store, _known.pop, key, None)
    return known


def _stripe(directory: str) -> threading.Lock:
    """The lock ``directory`` is made under (see ``_STRIPES``)."""
    return _STRIPES[hash(directory) % len(_STRIPES)]


def make_directory(directory: str, known: set[str], top: str) -> None:
    """Make ``directory`` and its parents below ``top`` that are not known, each
    with one ``os.mkdir`` from the top down, and add them to ``known``.

    ``Path.mkdir(parents=True)``, as Zarr's file step calls it, first tries the
    directory itself, which fails where its parent is new too (in Earth2Studio's
    stores, at every lead time): a syscall and an exception more per chunk. Under
    the directory's stripe lock, checked again there, rather than a benign race
    (two threads both making it): threads that meet at a new directory make it
    once, while other directories are made at the same time (a parent shared by
    two, made by either, is taken as made). A caller's lock-free ``in`` is safe
    against the ``add`` and ``clear`` here: a set's own operations are atomic
    under the GIL (and locked per set where there is none).

    Parameters
    ----------
    directory : str
        A chunk's directory, normalised (``os.path.normpath``), below ``top``
    known : set[str]
        The directories made in its store (see :func:`known_directories`)
    top : str
        The array's directory, normalised, which exists
    """
    with _stripe(directory):
        if directory in known:
            return
        missing = []
        while directory not in known and directory != top:
            parent = os.path.dirname(directory)
            if parent == directory:  # the root: not below top after all
                break
            missing.append(directory)
            directory = parent
        try:
            for made in reversed(missing):
                try:
                    os.mkdir(made)
                except FileExistsError:
                    if not os.path.isdir(made):
                        raise
        except FileNotFoundError:
            # One taken to be there was removed (by someone else): made again.
            os.makedirs(missing[0], exist_ok=True)
        if len(known) + len(missing) > _KNOWN_AT_MOST:  # bounded: made again if needed
            known.clear()
        known.update(missing[:_KNOWN_AT_MOST])  # the deepest first


class Ahead:
    """Runs ``make`` on a thread of its own until it returns or is stopped.

    Making directories ahead only saves the writers work: whatever it leaves
    unmade (stopped, failed, beyond its bound) the writers make as before, so an
    error is logged (DEBUG), never raised.

    Parameters
    ----------
    make : Callable[[threading.Event], int]
        Makes directories until done or the event is set; returns how many it made
    name : str
        Its thread's name
    """

    def __init__(self, make: Callable[[threading.Event], int], name: str) -> None:
        self._stop = threading.Event()
        self._name = name
        pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._done = pool.submit(make, self._stop)
        pool.shutdown(wait=False)  # its thread ends with the job

    def stop(self) -> None:
        """Stop making directories and wait until the thread has (a directory being
        made is finished first)."""
        self._stop.set()
        wait([self._done])
        error = self._done.exception()
        if error is not None:
            logger.debug(f"{self._name}: directories not made ahead: {error!r}")
        else:
            logger.debug(f"{self._name}: {self._done.result()} directories made ahead")
