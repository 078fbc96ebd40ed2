"""The workflow mode's pairs and tables (tools.bench.workflow_tables)."""

from __future__ import annotations

import pytest


def _rows():
    job = {"job": "dlwp-ens", "precision": "tf32", "workflow": "ensemble"}
    job |= {"members": 16, "steps": 20}
    fresh = job | {"way": "fresh", "kind": "fresh"}
    return [
        fresh | {"io": "memory-zarr", "run": "eager", "wall_s": 6.4},
        fresh | {"io": "overlapped-memory", "run": "eager", "wall_s": 3.2},
        fresh | {"io": "overlapped-memory", "run": "compiled", "wall_s": 1.6},
        job
        | {"io": None, "way": "floor", "run": "floor", "floor_s": 0.8}
        | {"eager_step_ms": 20.0, "compiled_step_ms": 10.0, "model_steps": 40}
        | {"compute_floor_s": 0.4, "io_floor_s": 0.4, "store_bytes_expected": 1e9},
        fresh | {"io": "memory-zarr", "run": "compiled", "wall_s": 4.0},
        # only the OverlappedIO: its compiled row pairs with the eager on its IO
        fresh | {"io": "overlapped", "run": "eager", "wall_s": 5.0, "job": "x"},
        fresh | {"io": "overlapped", "run": "compiled", "wall_s": 2.5, "job": "x"},
        job
        | {"way": "second", "call": 1, "io": "overlapped-memory"}
        | {"run": "eager", "wall_s": 3.0},
        job
        | {"way": "second", "call": 1, "io": "overlapped-memory"}
        | {"run": "compiled", "wall_s": 1.0},
    ]


def test_compiled_rows_pair_with_upstream_and_with_eager_through_overlappedio():
    from earth2studio_compile.tools.bench.workflow_tables import derive

    rows = _rows()
    derive(rows)
    upstream, ours, compiled, _, plain, x_eager, x_comp, s_eager, s_comp = rows
    # compiled + OverlappedIO: against upstream on the wrapped backend, and against
    # eager through the same OverlappedIO (the compiling part of the gain)
    assert (compiled["pair"], compiled["vs_eager"]) == (0, pytest.approx(4.0))
    assert (compiled["io_pair"], compiled["vs_io_only"]) == (1, pytest.approx(2.0))
    # eager + OverlappedIO against upstream: the writing part
    assert (ours["pair"], ours["vs_eager"]) == (0, pytest.approx(2.0))
    assert "pair" not in upstream and "io_pair" not in ours
    assert (plain["pair"], plain["vs_eager"]) == (0, pytest.approx(1.6))
    assert "io_pair" not in plain
    assert x_comp["pair"] == x_comp["io_pair"] == 5 and "pair" not in x_eager
    # a second call pairs within its process: no upstream call 1 on memory-zarr
    assert s_comp["pair"] == s_comp["io_pair"] == 7
    # members x steps per second of the whole call; floors per job and precision
    assert upstream["member_steps_per_s"] == pytest.approx(16 * 20 / 6.4)
    assert compiled["member_steps_per_s"] == pytest.approx(200.0)
    assert compiled["wall_over_floor"] == pytest.approx(2.0)
    assert "member_steps_per_s" not in rows[3]


def test_stores_in_memory_are_measured_against_the_in_memory_floor():
    from earth2studio_compile.tools.bench.workflow_tables import derive, tables

    rows = _rows()
    floor = rows[3]
    floor |= {"io_memory_floor_s": 0.2, "memory_floor_s": 0.6}
    rows.append(rows[0] | {"io": "zarr-disk", "wall_s": 8.0})
    derive(rows)
    compiled, on_disk = rows[2], rows[-1]
    assert compiled["floor_s"] == 0.6  # overlapped-memory: in memory
    assert compiled["wall_over_floor"] == pytest.approx(1.6 / 0.6)
    assert (on_disk["floor_s"], on_disk["wall_over_floor"]) == (0.8, 10.0)
    # the larger of the two parts: N x step 0.4 over 0.2 in memory, 0.4 on disk
    assert compiled["larger_floor_s"] == 0.4 and on_disk["larger_floor_s"] == 0.4
    assert compiled["wall_over_larger"] == pytest.approx(4.0)
    assert on_disk["wall_over_larger"] == pytest.approx(20.0)
    text = tables(rows)
    per_step = text.split("Per step")[1]
    assert "in memory floor s" in per_step
    assert per_step.splitlines()[3].split()[-3:] == ["1", "0.8", "0.6"]


def test_a_store_on_disk_is_measured_against_its_chunks_floor():
    """From 2026-11-27 the floor row has the store's chunks as files: rows on disk
    are measured against it (the larger floor too), and the table shows it with
    its files' count; rows in memory keep the in-memory floor."""
    from earth2studio_compile.tools.bench.workflow_tables import derive, tables

    rows = _rows()
    rows[3] |= {"io_memory_floor_s": 0.2, "memory_floor_s": 0.6}
    rows[3] |= {"io_chunks_floor_s": 1.6, "io_chunks": 2240, "floor_s": 2.0}
    rows.append(rows[0] | {"io": "zarr-disk", "wall_s": 8.0})
    derive(rows)
    compiled, on_disk = rows[2], rows[-1]
    assert (on_disk["floor_s"], on_disk["larger_floor_s"]) == (2.0, 1.6)
    assert on_disk["wall_over_larger"] == pytest.approx(5.0)
    assert compiled["larger_floor_s"] == 0.4  # in memory: N x step over 0.2
    per_step = tables(rows).split("Per step")[1]
    assert "as chunks s" in per_step and "1.60 (2240)" in per_step
    assert "one file per chunk of the store" in per_step


def test_whole_call_table_splits_the_gain_into_writing_and_compiling():
    from earth2studio_compile.tools.bench.workflow_tables import derive, tables

    rows = _rows()
    derive(rows)
    whole = tables(rows).split("Per step")[0]
    assert "eager+OvIO s" in whole and "m·steps/s eager/OvIO/comp" in whole
    lines = [line.split() for line in whole.splitlines() if "dlwp-ens" in line]
    # the compiled OverlappedIO row: eager, eager + OverlappedIO, compiled, total,
    # writing, compiling, members x steps per second of the three
    ovio = next(x for x in lines if x[2] == "overlapped-memory" and x[3] == "fresh")
    assert ovio[5:12] == [
        "6.40",
        "3.20",
        "1.60",
        "4.00",
        "2.00",
        "2.00",
        "50.0/100.0/200.0",
    ]
    plain = next(x for x in lines if x[2] == "memory-zarr")
    assert plain[5:12] == ["6.40", "-", "4.00", "1.60", "-", "-", "50.0/-/80.0"]
    assert len(lines) == 3  # the eager rows are shown in the compiled rows' lines


def test_a_row_run_in_several_processes_is_its_medians():
    """Samples of one row (``--fresh-repeats``) pair, divide and print as their
    medians; a warm row that found no cache is not a sample of the warm ones."""
    from earth2studio_compile.tools.bench.workflow_tables import derive, tables

    job = {"job": "fcn", "precision": "tf32", "workflow": "deterministic"}
    fresh = job | {"way": "fresh", "kind": "fresh", "io": "zarr-disk", "call": None}
    eager = fresh | {"run": "eager", "cache": None}
    warm = fresh | {"way": "warm", "run": "compiled", "cache": "warm"}
    rows = [
        eager | {"wall_s": 3.28, "first_step_s": 0.2, "repeat": 1},
        warm | {"wall_s": 2.0, "first_step_s": 0.5, "repeat": 1},
        eager | {"wall_s": 4.95, "first_step_s": 0.4, "repeat": 2},
        warm | {"wall_s": 2.5, "first_step_s": 0.7, "repeat": 2, "cache": "cold"},
        warm | {"wall_s": 3.0, "first_step_s": 0.3, "repeat": 3},
        job
        | {"io": None, "way": "floor", "run": "floor", "floor_s": 2.0}
        | {"eager_step_ms": 20.0, "compiled_step_ms": 10.0, "model_steps": 40}
        | {"compute_floor_s": 0.4, "io_floor_s": 1.6, "store_bytes_expected": 1e9},
    ]
    # Two second-call processes: call k of one is a sample of call k of the other.
    second = job | {"way": "second", "kind": "second", "io": "zarr-disk"}
    for repeat, walls in ((1, (5.0, 4.0, 4.5, 4.4)), (2, (6.0, 5.0, 4.7, 4.4))):
        for (call, run), wall in zip(
            [(1, "eager"), (1, "compiled"), (2, "eager"), (2, "compiled")], walls
        ):
            rows.append(second | {"call": call, "run": run, "wall_s": wall})
            rows[-1] |= {"repeat": repeat, "cache": None if run == "eager" else "warm"}
    derive(rows)
    first, _, again, lone, third, _ = rows[:6]
    call2 = rows[-1]
    assert call2["walls"] == [4.4, 4.4] and call2["pair"] == 8  # eager call 2
    assert call2["vs_eager"] == pytest.approx(4.6 / 4.4)
    assert rows[7]["median"]["wall_s"] == 4.5 and rows[7]["pair"] == 6
    assert first["median"]["wall_s"] == again["median"]["wall_s"] == 4.115
    assert first["walls"] == again["walls"] == [3.28, 4.95]
    assert third["median"] == first["median"] | {
        "wall_s": 2.5,
        "first_step_s": 0.4,
    }
    assert lone["walls"] == [2.5] and lone["median"]["wall_s"] == 2.5
    assert third["pair"] == 0 and third["vs_eager"] == pytest.approx(4.115 / 2.5)
    assert third["wall_over_floor"] == pytest.approx(1.25)
    assert first["wall_over_floor"] == pytest.approx(4.115 / 2)
    whole = tables(rows).split("Per step")[0]
    lines = [x for x in whole.splitlines() if x.startswith("fcn")]
    assert len(lines) == 4  # the warm rows with their caches, the lone one, calls
    assert "4.60 (4.50-4.70, n=2)" in lines[3] and "4.40 (4.40-4.40, n=2)" in lines[3]
    assert "4.12 (3.28-4.95, n=2)" in lines[0] and "2.50 (2.00-3.00, n=2)" in lines[0]
    assert "1.65" in lines[0] and "0.30/0.40" in lines[0]  # ratio, first steps
    assert "4.12 (3.28-4.95, n=2)" in lines[1] and "  2.50  " in lines[1]


def test_first_step_table_names_where_each_process_first_step_went():
    from earth2studio_compile.tools.bench.phases import FIRST_STEP
    from earth2studio_compile.tools.bench.workflow_tables import derive, tables

    rows = _rows()
    parts = dict.fromkeys(FIRST_STEP, 0.1) | {"fetch_data": 0.3}
    rows[2] |= {"first_step_s": 1.3, "first_step": parts, "write_seconds": [0.1, 0.05]}
    rows[2] |= {"report": {"regions": [{"first_call_s": 0.25, "status": "compiled"}]}}
    rows[1] |= {"first_step_s": 1.0, "first_step": parts}
    derive(rows)
    assert "First step" not in tables(_rows())  # rows that did not time it
    text = tables(rows).split("First step, where it went")[1]
    lines = [line.split() for line in text.splitlines() if "dlwp-ens" in line]
    assert [x[3] for x in lines] == ["eager", "compiled"]
    # 1st step, to, fetch_data, ..., other, the region's first call
    assert lines[1][4:-1] == ["1.30", "0.10", "0.30", *["0.10"] * 5, "0.40", "0.25"]
    assert lines[1][-1] == "0.10/0.05"  # each write, the initial state's first
    assert lines[0][-3:] == ["0.10", "-", "-"]


def test_a_compiled_row_whose_builds_were_cut_says_so():
    """A row's process that cancelled its background builds at its limit (FCN3's
    cold row, forty-first session) shows it in the status column, beside what the
    regions ran."""
    from earth2studio_compile.tools.bench.workflow_tables import derive, tables

    rows = _rows()
    rows[4] |= {"background_cut": True}
    rows[4] |= {"report": {"regions": [{"status": "building"}]}}
    derive(rows)
    whole = tables(rows).split("Per step")[0]
    lines = [line.split() for line in whole.splitlines() if "dlwp-ens" in line]
    plain = next(x for x in lines if x[2] == "memory-zarr")
    assert "building,builds" in plain and "cut" in plain, plain
    ovio = next(x for x in lines if x[2] == "overlapped-memory" and x[3] == "fresh")
    assert "cut" not in ovio
