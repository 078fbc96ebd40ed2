"""The writer of a ZarrBackend: each member's chunk as it is, the group's members
asked once, a local directory's files from a pool of the writer's own."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import pytest
import torch
from io_helpers import (
    own_threads,  # noqa: F401 (autouse fixture)
    step_tensors,
    zarr_writes,
)

from earth2studio_compile.io import OverlappedIO


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_a_step_of_members_is_stored_chunk_by_chunk_as_zarr_would(where, tmp_path):
    """An ensemble step holds one chunk per member: the writer hands Zarr each chunk
    as it is (Zarr filled a new chunk and copied each member in: 4 MB twice per
    member for DLWP), and the store holds what upstream's synchronous write stores."""
    from earth2studio.io import ZarrBackend
    from zarr.core.buffer.cpu import NDBuffer

    coords = OrderedDict(
        ensemble=np.arange(4),
        lead_time=np.array([0, 6], dtype="timedelta64[h]"),
        lat=np.linspace(-90, 90, 5),
        lon=np.linspace(0, 350, 8),
    )
    x = torch.randn(4, 2, 5, 8)
    x[1] = 0.0  # a member all fill value: not stored, either way

    def store(io, step):
        io.write(
            [x[:, step : step + 1]],
            {**coords, "lead_time": coords["lead_time"][step : step + 1]},
            ["t2m"],
        )

    def files(io) -> dict[str, bytes]:
        return (
            {k: v.to_bytes() for k, v in io.root.store._store_dict.items()}
            if where == "memory"
            else {
                str(f.relative_to(tmp_path / "s.zarr")): f.read_bytes()
                for f in sorted((tmp_path / "s.zarr").rglob("*"))
                if f.is_file()
            }
        )

    expected = ZarrBackend(None if where == "memory" else str(tmp_path / "s.zarr"))
    expected.add_array(coords, ["t2m"])
    for step in range(2):
        store(expected, step)
    want = files(expected)
    if where == "disk":
        import shutil

        shutil.rmtree(tmp_path / "s.zarr")
    made = []
    create = NDBuffer.create.__func__

    def counted(cls, *args, **kwargs):
        made.append(kwargs.get("shape"))
        return create(cls, *args, **kwargs)

    ours = ZarrBackend(None if where == "memory" else str(tmp_path / "s.zarr"))
    with OverlappedIO(ours, workers=2) as io:
        io.add_array(coords, ["t2m"])
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(NDBuffer, "create", classmethod(counted))
            for step in range(2):
                store(io, step)
            io.flush()
    assert made == []
    assert files(ours) == want
    assert len([k for k in want if "t2m/c/" in k]) == 2 * 3


def test_zarr_members_found_once_are_not_asked_again_each_step(monkeypatch):
    """Upstream's ``write`` asks its group for every dimension and array at every
    step, each a round trip through Zarr's synchronous API: a member found is
    answered from memory; one missing is asked each time, and still refused as
    upstream refuses it."""
    import zarr

    asked = []
    contains = zarr.Group.__contains__

    def counted(self, member):
        asked.append(member)
        return contains(self, member)

    monkeypatch.setattr(zarr.Group, "__contains__", counted)
    names = ["a", "b"]
    io, backend = zarr_writes(names, 4, workers=2)
    del asked[:]  # add_array's
    for i in range(4):
        coords = OrderedDict(lead_time=np.arange(i, i + 1), x=np.arange(4))
        io.write(step_tensors(i, 2), coords, names)
    io.flush()
    assert sorted(asked) == ["a", "b", "lead_time", "x"]  # the first step's
    assert [backend.root[n][3, 0].item() for n in names] == [30.0, 31.0]
    del asked[:]
    coords = OrderedDict(nowhere=np.arange(1), x=np.arange(4))
    io.write(step_tensors(0, 2), coords, names)
    with pytest.raises(AssertionError, match="nowhere not in zarr store"):
        io.flush()
    assert asked == ["nowhere"]
    io.close()


def test_a_local_stores_files_are_written_on_a_few_threads_of_the_writers_own(
    tmp_path, monkeypatch
):
    """Whole chunks of upstream's uncompressed arrays in a local directory are
    written by Zarr's own encode and file steps from one pool of the writer's, for
    every lane: FILE_THREADS threads (or Zarr's threading.max_workers), no event
    loop or executor hop per chunk (their Python per chunk took turns at the GIL:
    4.1-4.3 GB/s on the H100 host where the same files by hand took 7.0). A step
    Zarr might store otherwise (a chunk starting with the fill value) still goes
    through Zarr's async API on each lane's loop, with a share of the threads."""
    import zarr
    from earth2studio.io import ZarrBackend
    from zarr.core.codec_pipeline import BatchedCodecPipeline

    from earth2studio_compile.io import zarr_writer

    coords = OrderedDict(
        ensemble=np.arange(8),
        lead_time=np.arange(4).astype("timedelta64[h]"),
        lat=np.linspace(-90, 90, 5),
        lon=np.linspace(0, 350, 8),
    )
    started: list[str] = []
    start = threading.Thread.start

    def recorded(self, *args, **kwargs):
        started.append(self.name)
        return start(self, *args, **kwargs)

    encoded = []
    encode = BatchedCodecPipeline.encode

    def counted(self, *args, **kwargs):
        encoded.append(self)
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(threading.Thread, "start", recorded)
    monkeypatch.setattr(BatchedCodecPipeline, "encode", counted)
    for total, workers, most in ((None, 2, zarr_writer.FILE_THREADS), (3, 2, 3)):
        started.clear()
        encoded.clear()
        backend = ZarrBackend(str(tmp_path / f"s{total}.zarr"))
        with zarr.config.set({"threading.max_workers": total}):
            with OverlappedIO(backend, workers=workers) as io:
                io.add_array(coords, ["a", "b"])
                for step in range(4):
                    x = torch.randn(2, 8, 1, 5, 8) + 10.0  # no fill value
                    c = {**coords, "lead_time": coords["lead_time"][step : step + 1]}
                    io.write(list(x), c, ["a", "b"])
                assert encoded == []
                x[1, 3, 0, 0, 0] = 0.0  # Zarr's comparison decides for that step
                io.write(list(x), c, ["a", "b"])
        puts = [n for n in started if " put" in n]
        assert 0 < len(puts) <= most, started
        # Zarr's own loop writes add_array's metadata on its executor: after that,
        # the lanes' stores start no thread of asyncio's default executor.
        lanes = started[next(i for i, n in enumerate(started) if " lane " in n) :]
        assert not [n for n in lanes if n.startswith("asyncio_")], started
        # b's last step, through its lane's loop: 7 chunks by the pipeline's
        # encode, the one starting with the fill value by setitem.
        assert len(encoded) == 7
        np.testing.assert_array_equal(backend.root["b"][:, 3], x[1, :, 0].numpy())
