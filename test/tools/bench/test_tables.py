"""The bench's Markdown tables (tools.bench.tables): the workflow figure shows
what compile=True adds on the same IO, not only against upstream's own backend."""

from __future__ import annotations


def test_the_workflow_table_pairs_a_compiled_row_with_eager_on_the_same_io():
    from earth2studio_compile.tools.bench import tables

    base = {"model": "fcn", "steps": 40, "precision": "tf32", "kind": "fresh"}
    rows = [
        {**base, "io": "zarr-disk", "way": "fresh", "run": "eager", "wall_s": 7.5},
        {**base, "io": "overlapped", "way": "fresh", "run": "eager", "wall_s": 3.3}
        | {"first_step_s": 0.9},
        {**base, "io": "overlapped", "way": "cold", "run": "compiled", "wall_s": 3.6}
        | {"pair": 0, "io_pair": 1, "vs_eager": 7.5 / 3.6, "vs_io_only": 3.3 / 3.6}
        | {"first_step_s": 1.1, "report": {"regions": [{"status": "building"}]}},
    ]
    text = tables.workflow([{"rows": rows}])
    header, _, row = text.splitlines()[:3]
    assert "eager + OverlappedIO s" in header
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:8] == ["7.50", "3.30", "3.60", "2.08x", "0.92x", "0.90/1.10"]
