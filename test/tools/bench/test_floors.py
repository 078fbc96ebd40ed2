"""The storage floors (earth2studio_compile.tools.bench.floors): the same bytes as a
store, one field per variable per step, from a pool of writer threads, to files (or
one file per chunk of the store, laid out as its keys) or kept in memory."""

from __future__ import annotations

from pathlib import Path

from earth2studio_compile.tools.bench import floors


def test_storage_floor_writes_each_variable_of_each_step_from_a_pool(
    tmp_path, monkeypatch
):
    """The floor's writes: one file per variable per step, as the Zarr stores chunk
    them, the same bytes, from a thread pool of the given size."""
    import numpy as np

    pools = []

    class Pool(floors.ThreadPoolExecutor):
        def __init__(self, max_workers):
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(floors, "ThreadPoolExecutor", Pool)
    seconds = floors.write_store(tmp_path, 5, 3, 40, "cpu", writers=4)
    assert seconds > 0 and pools == [4]
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == sorted(
        f"floor-{i}-{v}.npy" for i in range(5) for v in range(3)
    )
    arrays = [np.load(f) for f in files]
    assert all(a.shape == (40,) and a.dtype == np.float32 for a in arrays)
    # Variable v of every step holds the same field: the step's row v.
    first = {f.name.rsplit("-", 1)[1]: a for f, a in zip(files, arrays)}
    for f, a in zip(files, arrays):
        np.testing.assert_array_equal(a, first[f.name.rsplit("-", 1)[1]])
    assert not np.array_equal(first["0.npy"], first["1.npy"])  # a row each


def test_the_memory_floor_keeps_a_copy_of_every_field():
    """Every field of every step is copied into memory of its own and kept (a store
    in memory keeps what it stores), by a pool of the given size."""
    import numpy as np

    kept: list = []
    seconds = floors.write_memory(4, 3, 40, "cpu", writers=2, kept=kept)
    assert seconds > 0 and len(kept) == 4 * 3
    assert all(a.shape == (40,) and a.dtype == np.float32 for a in kept)
    assert all(a.flags.owndata for a in kept)  # copies, not views of the host step
    assert len({a.ctypes.data for a in kept}) == len(kept)


def test_the_floor_copies_each_step_into_a_few_reused_host_buffers():
    """A step is copied into one of max(2, writers) host buffers, reused once their
    step is stored: fresh memory per copy would put page faults into the floor (and
    from the CPU the floor still copies, as a workflow's step is copied)."""
    steps: dict[int, set[int]] = {}

    def store(i, v, field):
        # The step's buffer: where its first field starts.
        steps.setdefault(i, set()).add(field.ctypes.data - v * field.nbytes)

    seconds = floors._write_steps(10, 3, 40, "cpu", 2, store)
    assert seconds > 0 and sorted(steps) == list(range(10))
    assert all(len(bases) == 1 for bases in steps.values())  # one copy per step
    buffers = {b for bases in steps.values() for b in bases}
    assert len(buffers) == 2  # reused, and two steps in flight


def test_storage_floor_reports_the_memory_floor_beside_the_files(tmp_path):
    out = floors.storage_floor(
        tmp_path, 4 * 2 * 3 * 50, 2, 3, "cpu", 2, memory=True, members=5
    )
    assert out["io_memory_floor_s"] > 0 and out["io_floor_s"] > 0
    assert out["io_chunks_floor_s"] > 0 and out["io_chunks"] == 2 * 3 * 5
    assert not list(tmp_path.iterdir())  # the files are removed
    # Asked only where rows on stores in memory use it (not the ensemble breakdown).
    assert "io_memory_floor_s" not in floors.storage_floor(
        tmp_path, 4 * 2 * 3 * 50, 2, 3, "cpu", 2
    )


def test_the_chunk_floor_writes_a_file_per_member_where_zarr_keys_a_chunk(tmp_path):
    """Upstream's Zarr stores chunk one member, variable and lead time a chunk, each
    a file under its key's directories (c/<member>/<time>/<lead>/0/0): the chunk
    floor writes as many files and directories, the same bytes."""
    import numpy as np

    seconds = floors.write_chunks(tmp_path, 3, 2, 5 * 8, "cpu", 2, members=5)
    assert seconds > 0
    files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.npy"))
    assert files == sorted(
        Path(f"v{v}/c/{m}/0/{i}/0/0.npy")
        for v in range(2)
        for m in range(5)
        for i in range(3)
    )
    # a member's chunk: its part of the step's row v, the same in every step
    first = np.load(tmp_path / "v1/c/4/0/0/0/0.npy")
    assert first.shape == (8,) and first.dtype == np.float32
    np.testing.assert_array_equal(first, np.load(tmp_path / "v1/c/4/0/2/0/0.npy"))
    assert not np.array_equal(first, np.load(tmp_path / "v1/c/3/0/0/0/0.npy"))
    # without an ensemble: a file per variable per step, under c/<time>/<lead>/0/0
    other = tmp_path / "det"
    other.mkdir()
    floors.write_chunks(other, 2, 3, 10, "cpu", 1)
    assert sorted(p.relative_to(other) for p in other.rglob("*.npy")) == sorted(
        Path(f"v{v}/c/0/{i}/0/0.npy") for v in range(3) for i in range(2)
    )
