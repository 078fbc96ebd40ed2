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
