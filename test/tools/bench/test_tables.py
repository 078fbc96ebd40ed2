"""The docs' rendered tables (tools.bench.tables): what each column compares."""

from __future__ import annotations

import re


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("|").split("|")]


def test_a_compiled_row_is_compared_with_eager_in_its_own_precision():
    """``speedup`` is over fp32 eager with TF32 off; the issues' targets compare
    with eager in the same precision, a column of its own."""
    from earth2studio_compile.tools.bench.tables import rollouts

    base = {"model": "aurora", "steps": 11, "first_step_s": 1.0}
    results = [
        base | {"mode": "eager", "precision": "fp32", "steady_ms": 2400.0},
        base
        | {"mode": "eager", "precision": "tf32", "steady_ms": 1000.0}
        | {"speedup": 2.4},
        base
        | {"mode": "auto", "precision": "tf32", "steady_ms": 800.0}
        | {"speedup": 3.0, "cache": "cold"},
    ]
    lines = rollouts()([{"results": results}]).splitlines()
    header = _cells(lines[0])
    column = header.index("over eager, same precision")
    assert [_cells(line)[column] for line in lines[2:5]] == ["-", "-", "1.25x"]


def test_the_kernel_table_shows_attention_where_a_profile_has_it():
    from earth2studio_compile.tools.bench.tables import kernels

    families = ("fft", "gemm", "conv", "triton", "copy", "other")
    row = {"model": "aurora", "run": "eager", "wall_ms": 3.0, "device_ms": 2.0}
    row |= {"host_ms": 1.0} | {f"{f}_ms": 0.25 for f in families}
    old = kernels([{"rows": [row]}]).splitlines()[0]
    assert "attention ms" not in old  # the JSONs before 2026-11-27 have none
    new = kernels([{"rows": [row | {"attention_ms": 0.5, "precision": "tf32"}]}])
    header, _, line = new.splitlines()[:3]
    assert _cells(header)[5] == "attention ms"
    assert _cells(line)[:2] == ["aurora tf32", "eager"] and _cells(line)[5] == "0.50"


def test_the_kernel_table_names_a_compiled_rows_inductor_options():
    from earth2studio_compile.tools.bench.tables import kernels

    families = ("fft", "gemm", "conv", "triton", "copy", "other")
    row = {"model": "stormcast", "run": "compiled", "wall_ms": 3.0, "device_ms": 2.0}
    row |= {"host_ms": 1.0} | {f"{f}_ms": 0.25 for f in families}
    rows = [row | {"options": None}, row | {"options": {"layout_optimization": False}}]
    lines = kernels([{"rows": rows}]).splitlines()
    assert [_cells(line)[1] for line in lines[2:4]] == [
        "compiled",
        "compiled, layout_optimization=False",
    ]


def test_the_kernel_table_names_an_attention_choice_within_its_cell():
    """Regression: ``flex|math``'s bar ended the cell, shifting every figure of
    the row one column to the right (docs/models.md, 2026-12-01)."""
    from earth2studio_compile.tools.bench.tables import kernels

    families = ("attention", "fft", "gemm", "conv", "triton", "copy", "other")
    row = {"model": "aurora", "run": "compiled", "wall_ms": 3.0, "device_ms": 2.0}
    row |= {"host_ms": 1.0} | {f"{f}_ms": 0.25 for f in families}
    lines = kernels([{"rows": [row | {"attention": ["flex", "math"]}]}]).splitlines()
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", lines[2].strip("|"))]
    assert len(cells) == len(_cells(lines[0]))
    assert cells[1] == "compiled, attention=flex\\|math" and cells[2] == "3.00"


def test_a_loop_call_is_compared_with_the_eager_call_before_it():
    """``loop_calls``: a compiled call beside the process's eager call before it
    (a fresh compiled process: the run's fresh eager process)."""
    from earth2studio_compile.tools.bench.tables import loop_calls

    region = {"status": "compiled", "executor": "aot"}

    def row(label, way, run, call, wall):
        return {"label": label, "way": way, "run": run, "call": call}, wall

    rows = []
    for r, wall in (
        row("fresh, eager", "fresh", "eager", 1, 4.0),
        row("fresh, warm cache", "fresh", "compiled", 1, 2.0),
        row("one process", "second", "eager", 1, 3.0),
        row("one process", "second", "compiled", 2, 1.5),
        row("one process", "second", "eager", 3, 2.0),
        row("one process", "second", "compiled", 4, 2.5),
    ):
        rows.append(r | {"wall_s": wall, "first_step_s": 0.1, "regions": [region]})
    meta = {"run": "built", "steps": 20, "size": "full"}
    lines = loop_calls([{"meta": meta, "rows": rows}]).splitlines()
    header = _cells(lines[0])
    column = header.index("eager / compiled")
    assert [_cells(line)[column] for line in lines[2:5]] == ["2.00x", "2.00x", "0.80x"]
    assert _cells(lines[2])[header.index("regions")] == "compiled (aot)"


def test_region_probes_add_the_regions_up():
    """``region_probes``: each region's probe, then the regions together (Aurora's
    backbone is its six Swin stages)."""
    from earth2studio_compile.tools.bench.tables import region_probes

    def region(name, eager, compiled):
        return {"region": name, "eager_ms": eager, "compiled_ms": compiled}

    regions = [region("a", 30.0, 10.0), region("b", 10.0, 10.0), region("c", 1, None)]
    row = {"model": "aurora", "precision": "bf16", "report": {"regions": regions}}
    lines = region_probes([{"results": [row]}]).splitlines()
    column = _cells(lines[0]).index("eager / compiled")
    assert [_cells(line)[column] for line in lines[2:5]] == ["3.00x", "1.00x", "2.00x"]
    assert _cells(lines[4])[1] == "2 regions together"


def test_region_probes_add_up_the_regions_under_one_module():
    """Regions under one module (Aurora's six Swin stages under ``model.backbone``)
    get their own line beside all the regions together: issue 33's target is of
    the backbone, which the all-regions line mixed with the Perceiver's."""
    from earth2studio_compile.tools.bench.tables import region_probes

    def region(name, eager, compiled):
        return {"region": name, "eager_ms": eager, "compiled_ms": compiled}

    regions = [
        region("model.encoder.agg", 10.0, 10.0),
        region("model.backbone.layers.0", 30.0, 10.0),
        region("model.backbone.layers.1", 30.0, 20.0),
    ]
    row = {"model": "aurora", "precision": "bf16", "report": {"regions": regions}}
    lines = region_probes([{"results": [row]}]).splitlines()
    column = _cells(lines[0]).index("eager / compiled")
    together = {_cells(line)[1]: _cells(line)[column] for line in lines[5:7]}
    assert together == {
        "2 regions under model.backbone together": "2.00x",
        "3 regions together": "1.75x",
    }
