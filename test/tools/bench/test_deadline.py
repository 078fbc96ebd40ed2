"""A bench run's deadline (tools.bench.deadline), and the modes that keep it."""

from __future__ import annotations

import json

from earth2studio_compile.tools.bench import deadline as deadline_module
from earth2studio_compile.tools.bench.deadline import Deadline


def test_a_row_starts_only_if_a_row_of_its_kind_finished_in_the_time_left(
    monkeypatch,
):
    clock = {"t": 0.0}
    monkeypatch.setattr(deadline_module.time, "perf_counter", lambda: clock["t"])
    d = Deadline(100.0, ("run",))
    done = [{"run": "eager", "process_s": 60.0}, {"run": "compiled"}]
    assert d.skip({"run": "eager"}, done) is None and d.timeout(500) == 100
    clock["t"] = 50.0
    assert d.skip({"run": "eager"}, done).startswith(
        "skipped: deadline (a row like it took 60 s, 50 left)"
    )
    assert d.skip({"run": "compiled"}, done) is None  # nothing to judge it by
    assert d.timeout(30) == 30 and d.timeout(500) == 50
    clock["t"] = 100.0
    assert d.skip({"run": "compiled"}, done) == "skipped: deadline"
    none = Deadline(None, ("run",))
    assert none.skip({"run": "eager"}, done) is None and none.timeout(7) == 7


def test_workflow_skips_a_child_that_cannot_finish_and_keeps_the_rest(
    monkeypatch, tmp_path
):
    from earth2studio_compile.tools.bench import workflow

    started = []

    def child(spec, caches, timeout, progress=lambda rows: None):
        started.append((spec["io"], spec["run"]))
        took = 100.0 if spec["run"] == "eager" else 1.0
        return [{**spec, "wall_s": 1.0, "process_s": took}]

    monkeypatch.setattr(workflow, "run_child", child)
    out = tmp_path / "wf.json"
    argv = ["--jobs", "fcn", "--device", "cpu", "--io", "zarr-disk,async-zarr"]
    argv += ["--ways", "cold", "--deadline", "50", "--json", str(out)]
    assert workflow.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert started == [("zarr-disk", "eager"), ("zarr-disk", "compiled")] + [
        (None, "floor")
    ]
    skipped = [r for r in rows if r.get("skipped")]
    # A cold row took 1 s and would fit, but the eager row it is compared with
    # was skipped: a compiled sample alone is not a result.
    assert [(r["io"], r["run"]) for r in skipped] == [
        ("async-zarr", "eager"),
        ("async-zarr", "compiled"),
    ]
    assert "a row like it took 100 s" in skipped[0]["skipped"]
    assert "an eager row compared with it was" in skipped[1]["skipped"]


def test_an_eager_row_starts_only_if_a_row_compared_with_it_can_follow(monkeypatch):
    clock = {"t": 0.0}
    monkeypatch.setattr(deadline_module.time, "perf_counter", lambda: clock["t"])
    d = Deadline(100.0, ("run", "way"))
    done = [
        {"run": "eager", "way": "fresh", "process_s": 30.0},
        {"run": "compiled", "way": "cold", "process_s": 80.0},
        {"run": "compiled", "way": "warm", "process_s": 40.0},
    ]
    cold, warm = {"run": "compiled", "way": "cold"}, {"run": "compiled", "way": "warm"}
    eager = {"run": "eager", "way": "fresh"}
    clock["t"] = 20.0  # 80 left: eager (30) and the warm row (40) fit
    assert d.skip(eager, done, [cold, warm]) is None
    assert d.skip(eager, done, [cold]) == (
        "skipped: deadline (a row like it took 30 s, a row compared with it 80 s,"
        " 80 left)"
    )
    clock["t"] = 40.0  # 60 left: eager alone fits, no pair does
    assert d.skip(eager, done, [warm]).startswith("skipped: deadline")
    assert d.skip(eager, done) is None


def test_compiled_rows_are_compared_with_the_eager_rows_of_their_round():
    from earth2studio_compile.tools.bench.workflow import compared_with

    def fresh(io, run, repeat, way="fresh"):
        return {"job": "fcn", "precision": "tf32", "io": io, "kind": "fresh"} | {
            "run": run,
            "way": way,
            "repeat": repeat,
        }

    specs = [
        fresh("zarr-disk", "eager", 1),
        fresh("overlapped", "eager", 1),
        fresh("overlapped", "compiled", 1, "cold"),
        {"job": "fcn", "precision": "tf32", "io": None, "kind": "floor"},
        fresh("async-zarr", "eager", 1),
        fresh("async-zarr", "compiled", 1, "warm"),
        fresh("overlapped", "compiled", 2, "warm"),  # its round's eager rows: none
        {**fresh("overlapped", "both", 1, "second"), "kind": "second"},
    ]
    assert compared_with(specs) == {2: [0, 1], 5: [4], 6: []}


def test_workflow_repeats_are_judged_by_the_first_sample_of_their_kind(
    monkeypatch, tmp_path
):
    """Every row runs once before any repeat, so a repeat that cannot finish is
    skipped, never started and killed; a second-call child is judged by an earlier
    one though its rows name their calls' runs (eager, compiled), not its own."""
    from earth2studio_compile.tools.bench import workflow

    took = {"fresh": 10.0, "cold": 100.0, "warm": 10.0, "second": 100.0, "floor": 1}
    started = []

    def child(spec, caches, timeout, progress=lambda rows: None):
        started.append((spec["io"], spec["way"], spec.get("repeat")))
        runs = ("eager", "compiled") if spec["kind"] == "second" else (spec["run"],)
        row = {**spec, "wall_s": 1.0, "process_s": took[spec["way"]], "call": 1}
        return [{**row, "run": run} for run in runs]

    monkeypatch.setattr(workflow, "run_child", child)
    out = tmp_path / "wf.json"
    argv = ["--jobs", "fcn", "--device", "cpu", "--io", "zarr-disk,async-zarr"]
    argv += ["--fresh-repeats", "2", "--deadline", "50", "--json", str(out)]
    assert workflow.main(argv) == 0
    assert started == [
        ("zarr-disk", "fresh", 1),
        ("zarr-disk", "cold", 1),
        ("zarr-disk", "warm", 1),
        ("zarr-disk", "second", 1),
        (None, "floor", None),
        ("async-zarr", "fresh", 1),
        # The first cold row that cancels its build: none of its kind before it
        # (the one that waited for its build is another kind)
        ("async-zarr", "cold", 1),
        ("async-zarr", "warm", 1),
        ("zarr-disk", "fresh", 2),
        ("zarr-disk", "warm", 2),
        ("async-zarr", "fresh", 2),
        ("async-zarr", "warm", 2),
    ]
    rows = json.loads(out.read_text())["rows"]
    skipped = [(r["io"], r["way"], r.get("repeat")) for r in rows if r.get("skipped")]
    assert skipped == [
        ("async-zarr", "second", 1),  # judged by zarr-disk's 100 s child
        ("zarr-disk", "cold", 2),
        ("zarr-disk", "second", 2),
        ("async-zarr", "cold", 2),
        ("async-zarr", "second", 2),
    ]
