"""The workflow mode's calls (earth2studio_compile.tools.bench.calls): an
ensemble's calls with overlapped writes, and the storage floor's writer pool."""

from __future__ import annotations

import json


def test_workflow_calls_of_an_ensemble_and_overlapped_writes(tmp_path, monkeypatch):
    """The child's calls in this process: upstream's ensemble eager then ours
    compiled (a padded last batch) into AsyncZarrBackend, the floors of a batched
    ensemble, and a compiled deterministic call writing through OverlappedIO."""
    from earth2studio_compile.tools.bench import calls

    monkeypatch.delenv("EARTH2STUDIO_COMPILE_PRECISION", raising=False)
    base = {"model": "fcn", "size": "small", "device": "cpu", "precision": "tf32"}
    ens = base | {"workflow": "ensemble", "steps": 2, "members": 3, "batch_size": 2}
    spec = ens | {"io": "async-zarr", "kind": "second", "repeats": 1}
    eager, compiled = calls.run(spec, tmp_path / "out.json", tmp_path)
    assert [(r["run"], r["call"]) for r in (eager, compiled)] == [
        ("eager", 1),
        ("compiled", 1),
    ]
    # 3 members x 3 lead times x 26 variables x 16 x 32 float32, in both stores
    expected = calls.store_bytes(spec, _small_fcn())
    assert expected == 4 * 3 * 3 * 26 * 16 * 32
    assert eager["store_bytes"] == compiled["store_bytes"] > expected // 2
    assert compiled["wall_s"] >= compiled["returned_s"] > compiled["first_step_s"] > 0
    assert eager["returned_s"] > eager["first_step_s"] > 0
    assert "padded batch" in compiled["report"]["summary"]  # the last batch: 1 of 2
    assert json.loads((tmp_path / "out.json").read_text())["rows"][1]["call"] == 1
    (floor,) = calls.run(
        ens | {"io": None, "kind": "floor"}, tmp_path / "f.json", tmp_path
    )
    assert floor["model_steps"] == 4  # 2 steps x 2 batches
    assert floor["eager_step_ms"] > 0 and floor["compiled_step_ms"] > 0
    assert floor["floor_s"] == floor["compute_floor_s"] + floor["io_floor_s"] > 0
    assert floor["io_floor_writers"] == calls.FLOOR_WRITERS == 8
    assert not list(tmp_path.glob("floor-*"))  # the floor's files are removed
    det = base | {"workflow": "deterministic", "steps": 2, "members": 1}
    det |= {"batch_size": 1, "io": "overlapped", "kind": "fresh", "run": "compiled"}
    (row,) = calls.run(det, tmp_path / "d.json", tmp_path)
    assert row["store_bytes"] > 0 and row["wall_s"] >= row["returned_s"] > 0
    assert {x["status"] for x in row["report"]["regions"]} == {"compiled"}


def _small_fcn():
    from earth2studio_compile.tools import zoo

    return zoo.build("fcn", size="small")


def test_storage_floor_writes_each_variable_of_each_step_from_a_pool(
    tmp_path, monkeypatch
):
    """The floor's writes: one file per variable per step, as the Zarr stores chunk
    them, the same bytes, from a thread pool of the given size."""
    import numpy as np

    from earth2studio_compile.tools.bench import calls

    pools = []

    class Pool(calls.ThreadPoolExecutor):
        def __init__(self, max_workers):
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(calls, "ThreadPoolExecutor", Pool)
    seconds = calls.write_store(tmp_path, 5, 3, 40, "cpu", writers=4)
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


def test_workflow_store_bytes_count_the_variables_written():
    from earth2studio_compile.tools.bench import calls

    spec = {"workflow": "ensemble", "members": 8, "steps": 10, "outputs": "few"}
    assert calls.store_bytes(spec, _small_fcn()) == 4 * 8 * 11 * 3 * 16 * 32
    spec["outputs"] = "all"
    assert calls.store_bytes(spec, _small_fcn()) == 4 * 8 * 11 * 26 * 16 * 32
