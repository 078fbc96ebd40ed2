"""The lanes a writer runs its jobs on, and what a backend is handed."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from io_helpers import (
    Recorder,
    own_threads,  # noqa: F401 (autouse fixture)
)

from earth2studio_compile.io import OverlappedIO


def test_only_a_store_that_keeps_views_is_handed_copies(tmp_path):
    """Zarr's memory store keeps what it is given: its writer copies each step (so
    the host buffers are reused); a store on disk or a KVBackend copies anyway, and
    another copy would only slow the writers."""
    from earth2studio.io import AsyncZarrBackend, KVBackend, ZarrBackend

    from earth2studio_compile.io.lanes import keeps_views

    assert keeps_views(ZarrBackend())
    assert not keeps_views(ZarrBackend(str(tmp_path / "a.zarr")))
    assert not keeps_views(KVBackend()) and not keeps_views(Recorder())
    # It copies into buffers of its own.
    assert not keeps_views(AsyncZarrBackend(str(tmp_path / "b.zarr"), OrderedDict()))
    for backend, own in ((ZarrBackend(), True), (KVBackend(), False)):
        with OverlappedIO(backend) as io:
            io.add_array({"lead_time": np.array([0])}, ["a"])
            io.write([torch.ones(1)], {"lead_time": np.array([0])}, ["a"])
            assert io._writer is not None and io._writer.own_copies is own


def test_a_steps_copies_are_waited_for_once_not_by_each_array(tmp_path):
    """Each array's job waited on the step's copy events itself: 27 calls into CUDA
    a step for FCN's 26 variables (H200, 540 ``cudaEventSynchronize`` in 20
    steps), each letting go of the GIL. Now the first job to run waits; the
    others find the events waited for."""
    import threading

    from earth2studio.io import ZarrBackend

    from earth2studio_compile.io.writers import ZarrWriter

    class Copy:  # stands in for a CUDA event recorded after a step's copies
        def __init__(self) -> None:
            self.waits = 0
            self._lock = threading.Lock()

        def synchronize(self) -> None:
            with self._lock:
                self.waits += 1

    names = [f"v{i}" for i in range(6)]
    coords = OrderedDict(lead_time=np.array([0, 6], dtype="timedelta64[h]"))
    backend = ZarrBackend(str(tmp_path / "s.zarr"))
    backend.add_array(coords, names)
    writer = ZarrWriter(backend, 3)
    events = [[Copy(), Copy()] for _ in range(2)]
    try:
        futures = [
            writer.submit(
                step + 1,
                [torch.full((1,), float(step + i)) for i in range(len(names))],
                OrderedDict(lead_time=coords["lead_time"][step : step + 1]),
                names,
                events[step],
            )
            for step in range(2)
        ]
        assert all(f.result() for fs in futures for f in fs)
    finally:
        writer.close()
    assert [[e.waits for e in step] for step in events] == [[1, 1], [1, 1]]
    stored = [backend.root[n][:] for n in names]
    assert [list(v) for v in stored] == [[i, 1.0 + i] for i in range(len(names))]
