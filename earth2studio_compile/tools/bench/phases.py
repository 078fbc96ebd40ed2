"""Where a workflow's own thread spends one call: upstream's calls on it timed, in
wall and CPU seconds, for the workflow mode's child (:mod:`.calls`).

A phase whose wall time is well above its CPU time waited for the GIL or a lock
while other threads (an ``OverlappedIO``'s writers) ran; CUDA's default wait for
the device spins the thread, which counts as CPU.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FIRST_STEP", "FIRST_WRITES", "Phases", "thread_phases"]


#: What the workflow does before its first forecast step reaches the IO, timed
#: in the call's ``first_step`` (seconds, first step only): upstream's names.
FIRST_STEP = (
    "to",
    "fetch_data",
    "add_array",
    "perturbation",
    "map_coords",
    "iterator",
    "write",
)


#: ``io.write`` calls timed one by one (``write_seconds``): the initial state's
#: and the first steps', where an IO's host buffers are still being allocated.
FIRST_WRITES = 8


@dataclass
class Phases:
    """Where the workflow's thread spent one call (see :func:`thread_phases`).

    Attributes
    ----------
    spent : dict[str, float]
        Seconds in the model's iterator, ``map_coords``, ``split_coords`` and
        ``io.write`` (``iterator_s``, ...), and ``blocked_s`` for an
        ``OverlappedIO`` (once the call is over)
    cpu : dict[str, float]
        The thread's CPU seconds in the same phases (but ``blocked_s``)
    first : dict[str, float]
        The first step's seconds by :data:`FIRST_STEP`
    writes : list[float]
        The ``perf_counter`` at which each ``io.write`` call began
    each_write : list[float]
        Seconds of each of the first :data:`FIRST_WRITES` ``io.write`` calls
    perturbation : Any
        The perturbation to hand the workflow, timed (None without one)
    """

    spent: dict[str, float]
    cpu: dict[str, float]
    first: dict[str, float]
    writes: list[float] = field(default_factory=list)
    each_write: list[float] = field(default_factory=list)
    perturbation: Any = None


@contextlib.contextmanager
def thread_phases(model: Any, io: Any, perturbation: Any) -> Iterator[Phases]:
    """Seconds the workflow's thread spends in the model's iterator (``iterator_s``:
    each step's model work, and whatever it waits for), upstream's ``map_coords``
    and ``split_coords``, and ``io.write`` (``write_s``), summed over one call; with
    ``OverlappedIO``, also ``blocked_s`` (its writes waiting for a free step). What
    the call spends elsewhere (fetching data, setting up) is the wall less these.
    The same phases' CPU seconds on that thread (``time.thread_time``): a phase
    whose wall time is well above its CPU time waited, for the GIL or for a lock,
    not for the device (CUDA spins the host thread while it waits for a stream by
    default, which counts as CPU time).
    Also the ``perf_counter`` at which each ``io.write`` call began, and the
    first step's seconds by :data:`FIRST_STEP` (until the first forecast step
    reached the IO: the model's ``to``, upstream's ``fetch_data``, ``io.add_array``,
    the perturbation, ``map_coords``, the iterator's initial state and first step,
    the initial state's write), the seconds of each of the first
    :data:`FIRST_WRITES` ``io.write`` calls, and the perturbation to hand the
    workflow: a :class:`Phases`, filled as the call goes.

    Upstream's workflows look ``fetch_data``, ``map_coords`` and ``split_coords``
    up in their module, ``to`` and ``create_iterator`` on the model, ``write`` and
    ``add_array`` on the IO: each is wrapped for the call (an instance attribute
    over the class's method, on the model and the IO), then put back.

    Parameters
    ----------
    model : Any
        The workflow's prognostic model
    io : Any
        Its IO backend
    perturbation : Any
        Its perturbation (an ensemble's), or None

    Yields
    ------
    Phases
        Filled as the call goes
    """
    import earth2studio.run as upstream

    sums = dict.fromkeys(
        ("iterator_s", "map_coords_s", "split_coords_s", "write_s"), 0.0
    )
    cpu = dict.fromkeys(sums, 0.0)
    first = dict.fromkeys(FIRST_STEP, 0.0)
    names = ("fetch_data", "map_coords", "split_coords")
    saved = {n: getattr(upstream, n) for n in names}
    writes: list[float] = []
    each_write: list[float] = []

    def add(key: str, t0: float, c0: float, in_first: bool) -> None:
        spent = time.perf_counter() - t0
        if f"{key}_s" in sums:
            sums[f"{key}_s"] += spent
            cpu[f"{key}_s"] += time.thread_time() - c0
        if in_first:
            first[key] += spent
        if key == "write" and len(each_write) < FIRST_WRITES:
            each_write.append(spent)

    def timed(key: str, fn: Any, starts: list[float] | None = None) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # Write 1 hands the IO the first forecast step: the first step's end.
            in_first = key in first and len(writes) < (1 if key == "write" else 2)
            c0, t0 = time.thread_time(), time.perf_counter()
            if starts is not None:
                starts.append(t0)
            try:
                return fn(*args, **kwargs)
            finally:
                add(key, t0, c0, in_first)

        return wrapper

    create = model.create_iterator

    def create_iterator(*args: Any, **kwargs: Any) -> Iterator[Any]:
        steps = create(*args, **kwargs)
        while True:
            c0, t0 = time.thread_time(), time.perf_counter()
            try:
                item = next(steps)
            except StopIteration:
                return
            finally:
                add("iterator", t0, c0, len(writes) < 2)
            yield item

    io.write = timed("write", io.write, writes)
    io.add_array = timed("add_array", io.add_array)
    model.create_iterator = create_iterator
    model.to = timed("to", model.to)
    for name, fn in saved.items():
        setattr(upstream, name, timed(name, fn))
    blocked = getattr(io, "blocked_s", None)
    try:
        perturb = None if perturbation is None else timed("perturbation", perturbation)
        yield Phases(sums, cpu, first, writes, each_write, perturb)
    finally:
        for name, fn in saved.items():
            setattr(upstream, name, fn)
        del model.create_iterator, model.to  # the class's again
        del io.write, io.add_array
        if blocked is not None:
            sums["blocked_s"] = io.blocked_s - blocked
