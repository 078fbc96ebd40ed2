"""The workflow figures (tools.bench.workflow_figures): the whole-call table shows
what compile=True adds on the same IO, not only against upstream's own backend."""

from __future__ import annotations


def test_the_workflow_table_pairs_a_compiled_row_with_eager_on_the_same_io():
    from earth2studio_compile.tools.bench import workflow_figures as tables

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


def test_a_kept_region_still_building_ran_eagerly():
    """A second call keeps the first call's region, still building in the
    background: the call ran eagerly, not compiled code kept in the process."""
    from earth2studio_compile.tools.bench import workflow_figures as tables

    base = {"model": "aurora", "steps": 20, "precision": "tf32", "kind": "second"}
    base |= {"io": "memory-zarr", "way": "second", "call": 2}
    building = {"status": "building", "reused": "the region of call 1"}
    rows = [
        {**base, "run": "eager", "wall_s": 28.3},
        {**base, "run": "compiled", "wall_s": 29.0, "pair": 0}
        | {"report": {"regions": [building]}},
    ]
    row = tables.workflow([{"rows": rows}]).splitlines()[2]
    assert row.rstrip(" |").endswith(
        "eager while its artifact builds in the background"
    )


def test_a_run_from_a_built_cache_names_tools_build_as_the_artifacts_source():
    """``--cache-from``: the warm row's artifacts are the ones tools.build left,
    not a cold row's cache or a background build's (the eleventh session's Aurora
    figure said both)."""
    from earth2studio_compile.tools.bench import workflow_figures as tables

    base = {"model": "aurora", "steps": 20, "precision": "tf32", "kind": "fresh"}
    base |= {"io": "memory-zarr"}
    rows = [
        {**base, "way": "fresh", "run": "eager", "wall_s": 31.6},
        {**base, "way": "warm", "run": "compiled", "wall_s": 31.1, "pair": 0}
        | {"report": {"regions": [{"status": "compiled", "executor": "aot"}]}},
    ]
    for meta, way, how in (
        ({"cache_from": "/tmp/built"}, "(--cache-from)", "tools.build left"),
        ({}, "cold one left", "a background build left"),
    ):
        row = tables.workflow([{"meta": meta, "rows": rows}]).splitlines()[2]
        assert way in row and row.rstrip(" |").endswith(how), row


def test_a_region_with_an_artifact_that_ran_eagerly_counts_as_eager():
    """FCN3 (forty-fourth session): 15 regions had artifacts, the probe ran 13 of
    them eagerly; the table said the call ran "the artifact tools.build left"."""
    from earth2studio_compile.tools.bench import workflow_figures as tables

    base = {"model": "fcn3", "steps": 20, "precision": "tf32", "kind": "fresh"}
    base |= {"io": "memory-zarr"}
    aot = {"status": "compiled", "executor": "aot"}
    slower = {"status": "eager", "executor": "aot"}
    for regions, how in (
        (
            [aot, slower, {"status": "compiled", "executor": "dynamo"}, slower],
            "2 of 4 regions compiled (1 from the artifacts tools.build left, "
            "1 compiled in the process); the rest eager",
        ),
        ([slower, {"status": "eager", "executor": None}], "eager"),
        ([aot, aot], "the artifact tools.build left"),
    ):
        rows = [
            {**base, "way": "fresh", "run": "eager", "wall_s": 36.3},
            {**base, "way": "warm", "run": "compiled", "wall_s": 26.5, "pair": 0}
            | {"report": {"regions": regions}},
        ]
        data = {"meta": {"cache_from": "/tmp/built"}, "rows": rows}
        row = tables.workflow([data]).splitlines()[2]
        assert row.rstrip(" |").endswith("| " + how), row


def test_the_per_process_tables_of_a_run_from_a_built_cache_say_so_too():
    """The first-step and phase tables named a warm row's cache "the cold one
    left (no build())" where the whole-call table of the same run said
    tools.build left it (the thirteenth to fifteenth sessions' figures)."""
    from earth2studio_compile.tools.bench import workflow_figures as tables

    base = {"model": "fcn", "steps": 10, "precision": "tf32", "kind": "fresh"}
    base |= {"io": "overlapped", "way": "warm", "run": "compiled", "wall_s": 2.9}
    region = {"status": "compiled", "executor": "aot", "first_call_s": 0.4}
    row = base | {"first_step": {"iterator": 0.4}, "first_step_s": 0.8}
    row |= {"report": {"regions": [region | {"phases": {"first_run": 0.3}}]}}
    for meta, way in (
        ({"cache_from": "/tmp/built"}, "cache tools.build left (--cache-from)"),
        ({}, "cache the cold one left (no build())"),
    ):
        data = {"meta": meta, "rows": [row]}
        for text in (
            tables.workflow_first_steps([data]),
            tables.workflow_phases([data]),
        ):
            assert way in text.splitlines()[2], text


def test_the_workflow_table_names_each_job_and_an_ensembles_rate():
    """Several jobs in one figure: a job column (the caption named only the first
    job, for every row); ensembles also show members x steps per second."""
    from earth2studio_compile.tools.bench import workflow_figures as tables

    ens = {"model": "dlwp", "steps": 20, "members": 16, "batch_size": 8}
    ens |= {"outputs": "few", "precision": "tf32", "kind": "fresh"}
    det = {"model": "fcn", "steps": 40, "precision": "tf32", "kind": "fresh"}
    rows = [
        {**ens, "io": "memory-zarr", "way": "fresh", "run": "eager", "wall_s": 6.4},
        {**ens, "io": "memory-zarr", "way": "warm", "run": "compiled", "wall_s": 1.6}
        | {"pair": 0, "vs_eager": 4.0},
        {**det, "io": "zarr-disk", "way": "fresh", "run": "eager", "wall_s": 7.5},
        {**det, "io": "zarr-disk", "way": "warm", "run": "compiled", "wall_s": 5.0}
        | {"pair": 0, "vs_eager": 1.5},  # indices within its own file
    ]
    text = tables.workflow([{"rows": rows[:2]}, {"rows": rows[2:]}])
    header, _, first, second = text.splitlines()[:4]
    assert header.startswith("| job |") and "members x steps / s" in header
    cells = [c.strip() for c in first.strip("|").split("|")]
    assert cells[0] == "DLWP, 16 x 20 (batch 8), 3 variables"
    assert cells[1] == "ZarrBackend (memory)" and "50/-/200" in cells
    assert second.startswith("| FCN, 40 steps, every variable |")
    assert "DLWP, 16 x 20 (batch 8), 3 variables, tf32" in text


def test_the_thread_table_has_a_line_per_process_and_its_run_named():
    """Every process that timed its workflow thread, eager or compiled, with the
    thread's phases in the order a step meets them; a row without them is left out."""
    from earth2studio_compile.tools.bench import workflow_figures as tables

    base = {"model": "fcn", "steps": 10, "members": 8, "batch_size": 4}
    base |= {"precision": "tf32", "kind": "fresh"}
    spent = {"iterator_s": 2.0, "map_coords_s": 0.0, "split_coords_s": 0.01}
    rows = [
        {**base, "io": "async-zarr", "way": "fresh", "run": "eager", "wall_s": 6.0}
        | {"first_step_s": 1.3, "thread_s": spent | {"write_s": 3.7}},
        {**base, "io": "overlapped", "way": "warm", "run": "compiled", "wall_s": 4.5}
        | {"thread_s": spent | {"write_s": 1.7, "blocked_s": 0.5}}
        | {"thread_cpu_s": {"iterator_s": 0.4, "write_s": 0.3}},
        {**base, "io": "overlapped", "way": "fresh", "run": "eager", "wall_s": 4.0},
    ]
    text = tables.workflow_threads([{"rows": rows}])
    header, _, first, second, *rest = text.splitlines()
    assert header.startswith("| IO backend | run | call | call s | first step s |")
    assert header.index("model iterator") < header.index("io.write")
    cells = [c.strip() for c in first.strip("|").split("|")]
    first_cells = ["AsyncZarrBackend (disk)", "upstream, eager", "fresh process"]
    assert cells[:5] == [*first_cells, "6.00", "1.30"]
    assert cells[5:] == ["2.00", "0.00", "0.01", "3.70", "-", "-", "-"]
    cells = [c.strip() for c in second.strip("|").split("|")]
    assert (
        cells[1] == "compile=True"
        and cells[4] == "-"
        and cells[-4:] == ["1.70", "0.50", "0.40", "0.30"]
    )
    assert not rest[0].strip()  # the third row timed nothing: the caption follows


def test_the_phases_table_names_the_job_where_a_figure_has_several():
    from earth2studio_compile.tools.bench import workflow_figures as tables

    def row(model, steps):
        region = {"first_call_s": 0.5, "phases": {"first_run": 0.3, "verify": 0.2}}
        found = {"model": model, "steps": steps, "io": "overlapped", "way": "warm"}
        return found | {"run": "compiled", "report": {"regions": [region]}}

    one = tables.workflow_phases([{"rows": [row("fcn", 10)]}])
    assert one.startswith("| IO backend | call | first step s | first_run | verify |")
    two = tables.workflow_phases(
        [{"rows": [row("fcn", 10)]}, {"rows": [row("dlwp", 20)]}]
    )
    lines = two.splitlines()
    assert lines[0].startswith("| job | IO backend |")
    assert lines[2].startswith("| FCN, 10 steps, every variable |")
    assert lines[3].startswith("| DLWP, 20 steps, every variable |")


def test_the_workflow_table_shows_the_wall_over_the_larger_floor():
    """The issues' floor targets are of the larger of the two floors (N x the
    compiled step, the storage floor), not of their sum: a row saved before the
    bench derived it gets it from its file's floor row."""
    from earth2studio_compile.tools.bench import workflow_figures as tables

    base = {"model": "fcn", "steps": 40, "precision": "tf32", "kind": "fresh"}
    base |= {"job": "fcn"}
    floor = {**base, "io": None, "way": "floor", "run": "floor", "floor_s": 2.0}
    floor |= {"compute_floor_s": 1.5, "io_floor_s": 0.5}
    rows = [
        {**base, "io": "zarr-disk", "way": "fresh", "run": "eager", "wall_s": 7.5},
        {**base, "io": "zarr-disk", "way": "warm", "run": "compiled", "wall_s": 3.0}
        | {"pair": 0, "vs_eager": 2.5, "floor_s": 2.0, "wall_over_floor": 1.5},
        floor,
    ]
    text = tables.workflow([{"rows": rows}])
    header, _, row = text.splitlines()[:3]
    names = [c.strip() for c in header.strip("|").split("|")]
    cells = dict(zip(names, (c.strip() for c in row.strip("|").split("|"))))
    assert (cells["compiled / floor"], cells["compiled / larger floor"]) == (
        "1.50",
        "2.00",
    )


def test_the_first_step_table_splits_each_process_first_step():
    """One line per process that timed its first step: upstream's calls in the
    order the workflow makes them, the rest, and the eager calls made beside a
    first call ahead; a row without the timing is left out."""
    from earth2studio_compile.tools.bench import workflow_figures as tables
    from earth2studio_compile.tools.bench.phases import FIRST_STEP

    base = {"model": "fcn", "steps": 10, "members": 8, "batch_size": 4}
    base |= {"precision": "tf32", "kind": "fresh"}
    parts = dict.fromkeys(FIRST_STEP, 0.1) | {"fetch_data": 0.7}
    ahead = {"regions": [{"phases": {"ahead_eager": 0.45}}]}
    rows = [
        {**base, "io": "zarr-disk", "way": "fresh", "run": "eager", "wall_s": 9.0},
        {**base, "io": "overlapped", "way": "fresh", "run": "eager", "wall_s": 3.4}
        | {"first_step_s": 1.4, "first_step": parts},
        {**base, "io": "overlapped", "way": "warm", "run": "compiled", "wall_s": 3.3}
        | {"first_step_s": 1.6, "first_step": parts, "report": ahead},
    ]
    text = tables.workflow_first_steps([{"rows": rows}])
    header, _, eager, compiled = text.splitlines()[:4]
    names = [c.strip() for c in header.strip("|").split("|")]
    assert names[:11] == ["IO backend", "run", "call", "first step s", *FIRST_STEP]
    cells = [c.strip() for c in compiled.strip("|").split("|")]
    assert cells[1] == "compile=True"  # one job: the caption names it
    assert cells[3:] == ["1.60", "0.10", "0.70", *["0.10"] * 5, "0.30", "0.45"]
    assert eager.split("|")[-2].strip() == "-"  # no region: no first call ahead
    assert "every variable:" in text  # the caption names the job, data drawn
    rows = [r | {"source": "prefetched"} for r in rows]
    assert "every variable, data prefetched:" in tables.workflow_first_steps(
        [{"rows": rows}]
    )


def test_the_floors_figure_shows_each_storage_floor_and_the_larger_one_on_disk():
    """One line per floor row: N x the compiled step and the store's bytes written
    three ways; the larger floor on disk is of the chunks' files where the row has
    them, of the per-variable files before."""
    from earth2studio_compile.tools.bench import workflow_figures as figures

    base = {"model": "dlwp", "steps": 20, "members": 16, "batch_size": 8}
    base |= {"job": "dlwp-ens-all", "outputs": "all", "precision": "tf32"}
    base |= {"workflow": "ensemble", "io": None, "way": "floor", "run": "floor"}
    base |= {"compiled_step_ms": 5.5, "model_steps": 40, "compute_floor_s": 0.22}
    base |= {"store_bytes_expected": 9.77e9, "io_floor_s": 0.64}
    new = base | {"io_chunks_floor_s": 1.01, "io_chunks": 2352}
    new |= {"io_memory_floor_s": 0.7}
    text = figures.workflow_floors([{"rows": [base, new, {"run": "eager"}]}])
    lines = [line for line in text.splitlines() if line.startswith("| DLWP")]
    old_cells, new_cells = ([c.strip() for c in x.split("|")[1:-1]] for x in lines)
    assert old_cells[-4:] == ["0.64", "-", "-", "0.64"]
    assert new_cells[-4:] == ["0.64", "1.01 (2352 files)", "0.70", "1.01"]
    assert new_cells[1:5] == ["5.50", "40", "0.22", "9.77"]
    assert "one file per chunk of the store" in text
