"""The workflow mode (earth2studio_compile.tools.bench.workflow): its plan, argument
errors, children that are killed or never started, a small run on the CPU, and its
tables."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from earth2studio_compile.tools.bench import __main__ as cli


def test_workflow_plan_pairs_and_shares_caches():
    from earth2studio_compile.tools.bench import workflow, workflow_args

    args = workflow.parse(["--device", "cpu", "--io", "zarr-disk,overlapped"])
    specs = workflow.plan(args)
    kinds = [(s["job"], s["io"], s["way"], s["run"]) for s in specs]
    per_io = [("fresh", "eager"), ("cold", "compiled"), ("warm", "compiled")]
    per_io.append(("second", "both"))
    expected = []
    for job in ("fcn", "dlwp-ens"):
        expected += [(job, "zarr-disk", way, run) for way, run in per_io]
        expected.append((job, None, "floor", "floor"))  # early: before a deadline
        expected += [(job, "overlapped", way, run) for way, run in per_io]
    assert kinds == expected
    fcn, dlwp = specs[0], specs[9]
    assert (fcn["steps"], fcn["workflow"]) == (40, "deterministic")
    assert (dlwp["steps"], dlwp["members"], dlwp["batch_size"]) == (20, 16, 8)
    # eager runs in empty caches of its own; the first cold row fills the job's,
    # which every IO's warm and second rows share; a later IO's cold row starts empty
    assert fcn["cache"] is None
    assert {s["cache"] for s in specs[1:5]} == {"fcn-tf32"}  # floor too
    assert [s["cache"] for s in specs[5:9]] == [None, None, "fcn-tf32", "fcn-tf32"]
    # The storage floor writes with AsyncZarrBackend's 8 threads unless told.
    assert {s["writers"] for s in specs if s["kind"] == "floor"} == {8}
    args = workflow.parse(["--device", "cpu", "--jobs", "fcn", "--writers", "3"])
    assert [s["writers"] for s in workflow.plan(args) if s["kind"] == "floor"] == [3]
    # Python's switch interval stays the child's own unless asked for.
    assert all("switch_interval" not in s for s in specs)
    args = workflow.parse(["--device", "cpu", "--switch-interval", "0.0002"])
    assert {s["switch_interval"] for s in workflow.plan(args)} == {0.0002}
    # OverlappedIO's own max_pending unless asked for.
    assert all("max_pending" not in s for s in specs)
    args = workflow.parse(["--device", "cpu", "--max-pending", "8"])
    assert {s["max_pending"] for s in workflow.plan(args)} == {8}
    small = workflow.parse(["--device", "cpu", "--jobs", "ens:toy,det:toy"])
    small.members, small.batch_size = 2, 8
    job = workflow_args.job_spec(argparse.ArgumentParser(), "ens:toy", small)
    assert (job["model"], job["members"], job["batch_size"]) == ("toy", 2, 2)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ways", "warm"], "--ways warm reuses the cold row's caches; add cold"),
        (["--ways", "hot"], "--ways: unknown 'hot'"),
        (["--io", "zarr"], "--io: unknown 'zarr'"),
        (["--io", ","], "--io is empty"),
        (
            ["--jobs", "gfs"],
            "--jobs: unknown 'gfs'; use fcn, dlwp-ens, dlwp-ens-all, fcn-ens, "
            "det:MODEL",
        ),
        (
            ["--jobs", "det:dlesym"],
            "--jobs: 'det:dlesym': upstream's workflows cannot store dlesym's "
            "outputs, eager too; docs/bench/2026-11-29-h200-twentyseventh/dlesym_",
        ),
        (["--precision", "fp16"], "--precision: unknown 'fp16'"),
        (["--steps", "0"], "--steps must be >= 1, not 0"),
        (["--device", "tpu"], "--device must be cuda or cpu"),
        (["--writers", "0"], "--writers must be >= 1, not 0"),
        (["--switch-interval", "0"], "--switch-interval must be > 0 seconds, not 0"),
        (["--max-pending", "0"], "--max-pending must be >= 1, not 0"),
        (["--cache-from", "/no/such/dir"], "--cache-from: /no/such/dir is not a"),
        (
            ["--cache-from", ".", "--ways", "cold,warm"],
            "--cache-from fills the caches a cold row would start without",
        ),
    ],
)
def test_workflow_bad_arguments_name_the_fix(argv, message, capsys):
    from earth2studio_compile.tools.bench import workflow

    with pytest.raises(SystemExit):
        workflow.parse(argv)
    assert message in capsys.readouterr().err


# A child that imports nothing heavy: a fresh row returns at once, the second-call
# child finishes three calls and then hangs until the parent's timeout kills it.
# Each row notes how many rows the parent's JSON held when the child started.
_FAKE_CHILD = r"""
import json, os, sys, time
spec, out = json.loads(sys.argv[1]), sys.argv[2]
path = os.environ["FAKE_PARENT_JSON"]
seen = len(json.load(open(path))["rows"]) if os.path.exists(path) else 0
head = {"import_s": time.time() - spec["launched"], "setup_s": 0.01}
rows = []
def save():
    with open(out + ".tmp", "w") as f:
        json.dump({**head, "rows": rows}, f)
    os.replace(out + ".tmp", out)
if spec["kind"] == "floor":
    rows.append({"run": "floor", "floor_s": 0.5, "eager_step_ms": 20.0,
                 "compiled_step_ms": 10.0, "model_steps": 2, "compute_floor_s": 0.02,
                 "io_floor_s": 0.48, "store_bytes_expected": 1000, "seen": seen})
elif spec["kind"] == "fresh":
    wall = 2.0 if spec["run"] == "eager" else 1.0
    rows.append({"run": spec["run"], "wall_s": wall, "seen": seen})
else:
    for call in (1, 2):
        for run in ("eager", "compiled"):
            if call == 2 and run == "compiled":
                time.sleep(600)
            rows.append({"run": run, "call": call, "wall_s": 1.0 + call, "seen": seen})
            save()
save()
"""


def test_workflow_keeps_what_finished_when_a_child_is_killed(
    monkeypatch, tmp_path, capsys
):
    from earth2studio_compile.tools.bench import workflow

    out = tmp_path / "wf.json"
    monkeypatch.setattr(workflow, "CHILD", ("-c", _FAKE_CHILD))
    monkeypatch.setenv("FAKE_PARENT_JSON", str(out))
    argv = ["--jobs", "fcn", "--device", "cpu", "--io", "zarr-disk", "--steps", "2"]
    argv += ["--ways", "cold,second", "--repeats", "2", "--timeout", "4"]
    assert workflow.main([*argv, "--json", str(out)]) == 1  # the killed child
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert [(r["way"], r["run"], r.get("call")) for r in rows] == [
        ("fresh", "eager", None),
        ("cold", "compiled", None),
        ("second", "eager", 1),
        ("second", "compiled", 1),
        ("second", "eager", 2),
        ("second", "both", None),  # what was left when it was killed
        ("floor", "floor", None),
    ]
    assert rows[5]["error"] == "timed out after 4 s" and rows[5]["process_s"] >= 4
    # The JSON held every earlier row when each child started, the killed child's
    # three finished calls included.
    assert [r["seen"] for r in rows if "seen" in r] == [0, 1, 2, 2, 2, 6]
    # Pairs: compiled with the eager fresh process, call 1 with eager call 1.
    assert (rows[1]["pair"], rows[1]["vs_eager"]) == (0, 2.0)
    assert (rows[3]["pair"], rows[3]["eager_wall_s"]) == (2, 2.0)
    assert "pair" not in rows[4] and "pair" not in rows[0]
    assert rows[0]["wall_over_floor"] == pytest.approx(4.0)  # 2 s over 0.5 s
    assert rows[1]["cache"] == "cold" and rows[0]["cache"] is None
    assert all(r["process_s"] >= r["import_s"] > 0 for r in rows[:2])
    assert payload["meta"]["command"].endswith("--json " + str(out))
    text = capsys.readouterr().out
    whole, per_step = text.split("Per step")
    assert "timed out after 4 s" in whole and "2.00" in whole
    assert "20.00" in per_step and "10.00" in per_step  # ms/step, eager and compiled
    assert "0.48 (1 writer)" in per_step  # a floor row without a writer count


_FAILING_CHILD = """
import sys
print("a warning before it")
print("Traceback (most recent call last):")
print("torch.AcceleratorError: CUDA error: operation not permitted when stream is "
      "capturing")
print("CUDA kernel errors might be asynchronously reported at some other API call")
print("For debugging consider passing CUDA_LAUNCH_BLOCKING=1")
print("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
sys.exit(1)
"""


def test_a_failed_childs_row_names_its_exception_and_keeps_its_log(
    monkeypatch, tmp_path
):
    from earth2studio_compile.tools.bench import workflow

    monkeypatch.setattr(workflow, "CHILD", ("-c", _FAILING_CHILD))
    args = workflow.parse(["--jobs", "fcn", "--device", "cpu", "--io", "zarr-disk"])
    spec = workflow.plan(args)[0]
    (tmp_path / "child.log").write_text("ValueError: an earlier child's\n")
    rows = workflow.run_child(spec, tmp_path, 60, progress=lambda rows: None)
    assert rows[-1]["error"] == (
        "torch.AcceleratorError: CUDA error: operation not permitted when stream is "
        "capturing | Compile with `TORCH_USE_CUDA_DSA` to enable device-side "
        "assertions."
    )
    assert rows[-1]["log_tail"][0] == "a warning before it"  # this child's only


# Notes whether its compile cache holds the artifact a build left in --cache-from.
_SEEDED_CHILD = r"""
import json, os, sys
spec, out = json.loads(sys.argv[1]), sys.argv[2]
root = os.environ["EARTH2STUDIO_COMPILE_CACHE"]
found = os.path.exists(os.path.join(root, "aot", "k", "meta.json"))
runs = ["eager", "compiled"] if spec["kind"] == "second" else [spec["run"]]
rows = [{"run": r, "call": 1, "wall_s": 1.0, "found": found} for r in runs]
json.dump({"import_s": 0.1, "setup_s": 0.0, "rows": rows}, open(out, "w"))
"""


def test_cache_from_gives_warm_and_second_rows_what_a_build_left(monkeypatch, tmp_path):
    """A user who ran ``tools.build`` before forecasting: the warm and second-call
    processes start from that cache, the eager one from none; nothing of the
    source is changed."""
    from earth2studio_compile.tools.bench import workflow

    built = tmp_path / "built"
    (built / "aot" / "k").mkdir(parents=True)
    (built / "aot" / "k" / "meta.json").write_text("{}")
    monkeypatch.setattr(workflow, "CHILD", ("-c", _SEEDED_CHILD))
    out = tmp_path / "wf.json"
    argv = ["--jobs", "fcn", "--device", "cpu", "--io", "zarr-disk", "--no-floor"]
    argv += ["--ways", "warm,second", "--cache-from", str(built)]
    assert workflow.main([*argv, "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    found = [(r["way"], r["run"], r["found"]) for r in payload["rows"]]
    assert found == [
        ("fresh", "eager", False),
        ("warm", "compiled", True),
        ("second", "eager", True),
        ("second", "compiled", True),
    ]
    assert payload["rows"][1]["cache"] == "warm"
    assert payload["meta"]["cache_from"] == str(built)
    assert [p.name for p in built.rglob("*")] == ["aot", "k", "meta.json"]


def test_no_eager_runs_the_compiled_rows_alone(monkeypatch, tmp_path, capsys):
    """--no-eager: no eager process (to profile a compiled call without upstream's
    before it), the compiled rows compared with nothing, the tables still print."""
    from earth2studio_compile.tools.bench import workflow

    built = tmp_path / "built"
    built.mkdir()
    argv = ["--jobs", "dlwp-ens-all", "--device", "cpu", "--io", "overlapped"]
    argv += ["--ways", "warm", "--no-floor", "--no-eager", "--cache-from", str(built)]
    specs = workflow.plan(workflow.parse(argv))
    assert [(s["io"], s["way"], s["run"]) for s in specs] == [
        ("overlapped", "warm", "compiled")
    ]
    assert workflow.compared_with(specs) == {0: []}
    monkeypatch.setattr(workflow, "CHILD", ("-c", _SEEDED_CHILD))
    out = tmp_path / "wf.json"
    assert workflow.main([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["run"], r["wall_s"]) for r in rows] == [("compiled", 1.0)]
    assert "eager_wall_s" not in rows[0]
    assert "Whole call" in capsys.readouterr().out


def test_workflow_deadline_starts_nothing(monkeypatch, tmp_path, capsys):
    from earth2studio_compile.tools.bench import workflow

    monkeypatch.setattr(workflow, "CHILD", ("-c", "raise SystemExit(3)"))
    out = tmp_path / "wf.json"
    argv = ["--jobs", "fcn", "--device", "cpu", "--io", "async-zarr", "--deadline"]
    assert workflow.main([*argv, "0", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 5 and all(r["skipped"] == "skipped: deadline" for r in rows)
    assert "skipped: deadline" in capsys.readouterr().out


def test_workflow_mode_runs_small_fcn_on_cpu(tmp_path, capsys):
    """The CLI end to end on CPU: an eager and a cold compiled fresh process and the
    floors, each a real child; every figure present, positive and consistent."""
    out = tmp_path / "wf.json"
    argv = ["workflow", "--jobs", "fcn", "--size", "small", "--device", "cpu"]
    argv += ["--steps", "2", "--io", "zarr-disk", "--ways", "cold"]
    assert cli.main([*argv, "--json", str(out), "--workdir", str(tmp_path)]) == 0
    payload = json.loads(out.read_text())
    meta = payload["meta"]
    assert meta["environment"]["torch"] and meta["environment"]["earth2studio"]
    assert meta["environment"]["python"] and meta["environment"]["date"]
    assert meta["precision"] == ["tf32"] and meta["device_name"]
    eager, compiled, floor = payload["rows"]
    for r in (eager, compiled):
        assert "error" not in r, r.get("error")
        assert r["process_s"] >= r["import_s"] + r["setup_s"] + r["wall_s"]
        assert r["wall_s"] >= r["returned_s"] > 0 and r["setup_s"] > 0
        assert r["store_bytes"] > 0
        assert r["wall_over_floor"] == pytest.approx(r["wall_s"] / floor["floor_s"])
    assert compiled["pair"] == 0 and compiled["cache"] == "cold"
    assert compiled["vs_eager"] == pytest.approx(eager["wall_s"] / compiled["wall_s"])
    assert {x["status"] for x in compiled["report"]["regions"]} == {"compiled"}
    assert eager["report"] is None
    assert floor["compute_floor_s"] == pytest.approx(
        floor["model_steps"] * floor["compiled_step_ms"] / 1e3
    )
    assert floor["model_steps"] == 2 and floor["io_floor_s"] > 0
    # A store on disk is its chunks: 3 lead times x 26 variables, a file each.
    assert floor["io_chunks"] == 3 * 26 and floor["io_chunks_floor_s"] > 0
    assert floor["floor_s"] == floor["compute_floor_s"] + floor["io_chunks_floor_s"]
    # The storage floor with as many writers as AsyncZarrBackend, and with one.
    assert floor["io_floor_writers"] == 8 and floor["io_floor_1writer_s"] > 0
    assert floor["io_sync_s"] >= 0
    # 3 lead times x 26 variables x 16 x 32 float32
    assert floor["store_bytes_expected"] == 4 * 3 * 26 * 16 * 32
    text = capsys.readouterr().out
    assert "Whole call" in text and " (8 writers)" in text


def test_workflow_floor_table_names_the_writers():
    from earth2studio_compile.tools.bench import workflow

    floor = {"job": "fcn", "precision": "tf32", "io": None, "way": "floor"}
    floor |= {"run": "floor", "eager_step_ms": 28.9, "compiled_step_ms": 20.1}
    floor |= {"model_steps": 40, "compute_floor_s": 0.8, "store_bytes_expected": 4e9}
    new = floor | {"io_floor_s": 1.25, "io_floor_writers": 8, "floor_s": 2.05}
    new |= {"io_floor_1writer_s": 5.38, "io_sync_s": 2.5}
    old = floor | {"io_floor_s": 5.38, "floor_s": 6.18}  # one writer, not recorded
    text = workflow.tables([new, old]).split("Per step")[1]
    new_line, old_line = [line for line in text.splitlines() if "fcn" in line]
    assert "1.25 (8 writers)" in new_line and "5.38" in new_line
    assert "5.38 (1 writer)" in old_line
    assert "from that many writer threads" in text


def test_workflow_jobs_fcn_ens_and_dlwp_ens_write_what_the_issue_says():
    from earth2studio_compile.tools.bench import workflow

    args = workflow.parse(["--device", "cpu", "--jobs", "fcn-ens,dlwp-ens,fcn"])
    fcn_ens, dlwp, fcn = args.job_list
    assert (fcn_ens["workflow"], fcn_ens["model"]) == ("ensemble", "fcn")
    assert (fcn_ens["members"], fcn_ens["steps"], fcn_ens["batch_size"]) == (8, 10, 4)
    assert fcn_ens["outputs"] == "all"  # every one of FCN's 26 variables
    assert (dlwp["members"], dlwp["steps"], dlwp["batch_size"]) == (16, 20, 8)
    assert dlwp["outputs"] == "few" and fcn["outputs"] == "all"
    # The floor spec carries what the calls write.
    floor = [s for s in workflow.plan(args) if s["kind"] == "floor"]
    assert [(s["job"], s["outputs"]) for s in floor] == [
        ("fcn-ens", "all"),
        ("dlwp-ens", "few"),
        ("fcn", "all"),
    ]


def test_workflow_plan_runs_upstream_on_the_backend_an_overlapped_io_wraps():
    """Each OverlappedIO has its eager + OverlappedIO row, after upstream's eager on
    the backend it wraps (once, whichever order --io lists them in)."""
    from earth2studio_compile.tools.bench import workflow

    argv = ["--device", "cpu", "--jobs", "dlwp-ens", "--ways", "cold"]
    argv += ["--io", "overlapped-memory,memory-zarr,overlapped"]
    specs = workflow.plan(workflow.parse(argv))
    assert [(s["io"], s["way"], s["run"]) for s in specs] == [
        ("memory-zarr", "fresh", "eager"),  # upstream, the wrapped backend
        ("overlapped-memory", "fresh", "eager"),  # eager + OverlappedIO
        ("overlapped-memory", "cold", "compiled"),
        (None, "floor", "floor"),
        ("memory-zarr", "cold", "compiled"),  # its eager ran already
        ("zarr-disk", "fresh", "eager"),
        ("overlapped", "fresh", "eager"),
        ("overlapped", "cold", "compiled"),
    ]
    assert all(s["cache"] is None for s in specs if s["run"] == "eager")


def test_fresh_repeats_come_in_rounds_cold_ones_in_empty_caches():
    """Every row once (the floor early), then rounds of each IO's eager, cold and
    warm processes; the first cold row fills the job's caches, every later cold row
    starts in empty ones of its own, every warm row finds the job's."""
    from earth2studio_compile.tools.bench import workflow

    argv = ["--device", "cpu", "--jobs", "fcn", "--io", "zarr-disk,overlapped"]
    specs = workflow.plan(workflow.parse([*argv, "--fresh-repeats", "2"]))
    got = [(s["io"], s["way"], s["run"], s.get("repeat"), s["cache"]) for s in specs]
    assert got == [
        ("zarr-disk", "fresh", "eager", 1, None),
        ("zarr-disk", "cold", "compiled", 1, "fcn-tf32"),  # fills the job's caches
        ("zarr-disk", "warm", "compiled", 1, "fcn-tf32"),
        ("zarr-disk", "second", "both", 1, "fcn-tf32"),
        (None, "floor", "floor", None, "fcn-tf32"),
        ("overlapped", "fresh", "eager", 1, None),  # upstream's ran in this round
        ("overlapped", "cold", "compiled", 1, None),
        ("overlapped", "warm", "compiled", 1, "fcn-tf32"),
        ("overlapped", "second", "both", 1, "fcn-tf32"),
        ("zarr-disk", "fresh", "eager", 2, None),
        ("zarr-disk", "cold", "compiled", 2, None),  # empty again
        ("zarr-disk", "warm", "compiled", 2, "fcn-tf32"),
        ("zarr-disk", "second", "both", 2, "fcn-tf32"),
        ("overlapped", "fresh", "eager", 2, None),
        ("overlapped", "cold", "compiled", 2, None),
        ("overlapped", "warm", "compiled", 2, "fcn-tf32"),
        ("overlapped", "second", "both", 2, "fcn-tf32"),
    ]
    assert {s["repeats"] for s in specs if s["kind"] == "second"} == {3}
    # One run of each by default, as before the option.
    once = workflow.plan(workflow.parse(argv))
    assert [s["repeat"] for s in once if s["kind"] == "fresh"] == [1] * 6
    assert len(once) == 9
    # Cold rows have a count of their own; 0 keeps only the one that fills the
    # caches; --no-floor drops the floor process.
    argv += ["--fresh-repeats", "3", "--ways", "cold,warm", "--no-floor"]
    for cold, expected in (("0", [1]), ("1", [1, 1]), ("2", [1, 1, 2, 2])):
        specs = workflow.plan(workflow.parse([*argv, "--cold-repeats", cold]))
        assert [s["repeat"] for s in specs if s["way"] == "cold"] == expected
        assert [s["repeat"] for s in specs if s["way"] == "warm"] == [1, 1, 2, 2, 3, 3]
        assert [s["cache"] for s in specs if s["way"] == "cold"][0] == "fcn-tf32"
        assert all(s["kind"] != "floor" for s in specs)
    # Only the cold row that fills the caches waits for its build; a deadline
    # judges the others (a third of its time) by their own kind.
    colds = [s for s in specs if s["way"] == "cold"]
    assert [s["build"] for s in colds] == ["wait", "cancel", "cancel", "cancel"]
    from earth2studio_compile.tools.bench.deadline import Deadline

    deadline = Deadline(100.0, workflow.KIND)
    assert deadline.skip(colds[2], [{**colds[0], "process_s": 178.0}]) is None
    assert deadline.skip(colds[2], [{**colds[1], "process_s": 178.0}]) is not None


# A fresh child of several rounds: it notes whether its caches held anything when
# it started and how many stores and caches of its own earlier children left, then
# leaves a store in its work directory and, compiled, an artifact in its caches.
_REPEAT_CHILD = r"""
import json, os, pathlib, sys, time
spec, out = json.loads(sys.argv[1]), sys.argv[2]
cache = pathlib.Path(os.environ["EARTH2STUDIO_COMPILE_CACHE"])
work = pathlib.Path(spec["workdir"])
row = {"run": spec["run"], "found": cache.exists() and any(cache.iterdir()),
       "stores": len(list(work.parent.glob("*/store.zarr"))),
       "own": len(list(work.parent.glob("own-*")))}
(work / "store.zarr").write_text("x")
if spec["kind"] == "floor":
    row.update(floor_s=2.0, eager_step_ms=20.0, compiled_step_ms=10.0, model_steps=2,
               compute_floor_s=0.02, io_floor_s=1.98, store_bytes_expected=1000)
else:
    walls = {("zarr-disk", "fresh"): [6.0, 8.0, 7.0],
             ("overlapped", "fresh"): [3.0, 5.0, 4.0],
             ("overlapped", "cold"): [2.0, 6.0, 3.0],
             ("overlapped", "warm"): [2.2, 1.8, 2.0]}
    row["wall_s"] = walls[spec["io"], spec["way"]][spec["repeat"] - 1]
    row["first_step_s"] = row["wall_s"] / 10
    if spec["run"] == "compiled":
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "artifact").write_text("x")
        row["report"] = {"regions": [{"status": spec["way"]}]}
json.dump({"import_s": 0.1, "setup_s": 0.01, "rows": [row]}, open(out, "w"))
"""


def test_fresh_repeats_are_medians_in_pairs_ratios_and_tables(
    monkeypatch, tmp_path, capsys
):
    from earth2studio_compile.tools.bench import workflow

    out = tmp_path / "wf.json"
    monkeypatch.setattr(workflow, "CHILD", ("-c", _REPEAT_CHILD))
    argv = ["--jobs", "fcn", "--device", "cpu", "--io", "overlapped"]
    argv += ["--ways", "cold,warm", "--fresh-repeats", "3", "--json", str(out)]
    work = tmp_path / "not" / "made yet"  # made, as `mkdir -p` would
    assert workflow.main([*argv, "--workdir", str(work)]) == 0
    assert work.is_dir()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["io"], r["way"], r.get("repeat")) for r in rows] == [
        ("zarr-disk", "fresh", 1),
        ("overlapped", "fresh", 1),
        ("overlapped", "cold", 1),
        ("overlapped", "warm", 1),
        (None, "floor", None),
        *[
            (io, way, n)
            for n in (2, 3)
            for io, way in [
                ("zarr-disk", "fresh"),
                ("overlapped", "fresh"),
                ("overlapped", "cold"),
                ("overlapped", "warm"),
            ]
        ],
    ]
    by = {}
    for r in rows:
        by.setdefault((r["io"], r["way"]), []).append(r)
    # Every cold child started in empty caches, every warm one in the job's; no
    # child found a store or caches of its own that an earlier child left.
    assert [r["found"] for r in by["overlapped", "cold"]] == [False] * 3
    assert [r["cache"] for r in by["overlapped", "cold"]] == ["cold"] * 3
    assert [r["found"] for r in by["overlapped", "warm"]] == [True] * 3
    assert [r["cache"] for r in by["overlapped", "warm"]] == ["warm"] * 3
    assert {r["stores"] for r in rows} == {0} and {r["own"] for r in rows} == {0}
    # Medians: upstream 7, eager + OverlappedIO 4, cold 3, warm 2.0
    cold, warm = by["overlapped", "cold"], by["overlapped", "warm"]
    assert [r["median"]["wall_s"] for r in cold] == [3.0] * 3
    assert cold[2]["walls"] == [2.0, 6.0, 3.0]
    assert cold[1]["vs_eager"] == pytest.approx(7 / 3)  # the medians' ratio
    assert cold[1]["pair"] == 0 and cold[1]["io_pair"] == 1  # first samples
    assert cold[0]["vs_io_only"] == pytest.approx(4 / 3)
    assert warm[0]["vs_eager"] == pytest.approx(3.5)
    assert warm[0]["wall_over_floor"] == pytest.approx(1.0)  # 2.0 s over 2.0 s
    assert by["overlapped", "fresh"][2]["vs_eager"] == pytest.approx(7 / 4)
    assert warm[0]["median"]["first_step_s"] == pytest.approx(0.2)
    printed = capsys.readouterr().out
    assert "fcn tf32 overlapped cold compiled (repeat 3)" in printed
    whole = printed.split("Whole call")[1].split("Per step")[0]
    lines = [x for x in whole.splitlines() if x.startswith("fcn")]
    assert len(lines) == 2  # cold and warm: one line per row, its samples in it
    cells = [c.strip() for c in re.split(r"\s{2,}", lines[0])]
    assert cells[5:11] == [
        "7.00 (6.00-8.00, n=3)",
        "4.00 (3.00-5.00, n=3)",
        "3.00 (2.00-6.00, n=3)",
        "2.33",
        "1.75",
        "1.33",
    ]
    assert "0.40/0.30" in lines[0]  # first step: eager + OvIO's median, compiled's
    assert "2.00 (1.80-2.20, n=3)" in lines[1]


_STALLING_CHILD = r"""
import json, os, pathlib, sys, time
spec = json.loads(sys.argv[1])
(pathlib.Path(spec["workdir"]) / "store.zarr").write_text("x")
cache = pathlib.Path(os.environ["EARTH2STUDIO_COMPILE_CACHE"])
cache.mkdir(parents=True)
(cache / "artifact").write_text("x")
time.sleep(600)
"""


def test_a_killed_child_leaves_no_store_and_no_caches_of_its_own(monkeypatch, tmp_path):
    from earth2studio_compile.tools.bench import workflow

    monkeypatch.setattr(workflow, "CHILD", ("-c", _STALLING_CHILD))
    args = workflow.parse(["--jobs", "fcn", "--device", "cpu", "--io", "zarr-disk"])
    eager, cold = workflow.plan(args)[:2]
    (row,) = workflow.run_child({**eager, "cache": None}, tmp_path, 3)
    assert row["error"] == "timed out after 3 s"
    assert not list(tmp_path.glob("child-*")) and not list(tmp_path.glob("own-*"))
    workflow.run_child(cold, tmp_path, 3)  # the job's caches stay for warm rows
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["fcn-tf32"]


_CACHE_CHILD = r"""
import json, os, pathlib, sys
from earth2studio_compile.cache import use_local_cache
root = pathlib.Path(os.environ["EARTH2STUDIO_COMPILE_CACHE"])
seen = {"inductor": str(use_local_cache(root))}
seen["triton"] = os.environ.get("TRITON_CACHE_DIR")
out = pathlib.Path(json.loads(sys.argv[1])["workdir"]).parent / "seen.json"
out.write_text(json.dumps(seen))
"""


def test_a_warm_row_finds_the_inductor_cache_of_its_cache_from_root(
    monkeypatch, tmp_path
):
    """``--cache-from``: a user who ran tools.build has its Inductor cache under the
    root; the child had one of its own beside it, so FCN3's Dynamo-path decoder
    compiled cold in the warm row (2026-12-01)."""
    from earth2studio_compile.tools.bench import workflow

    built = tmp_path / "built"
    (built / "inductor" / "fxgraph").mkdir(parents=True)
    monkeypatch.setattr(workflow, "CHILD", ("-c", _CACHE_CHILD))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "machine"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "machine-triton"))
    args = workflow.parse(
        [
            "--jobs",
            "fcn",
            "--device",
            "cpu",
            "--ways",
            "warm",
            "--cache-from",
            str(built),
        ]
    )
    specs = workflow.plan(args)
    warm = next(s for s in specs if s["way"] == "warm")
    caches = tmp_path / "caches"
    caches.mkdir()
    workflow.seed_caches(specs, built, caches)
    workflow.run_child(warm, caches, 60)
    seen = json.loads((caches / "seen.json").read_text())
    assert seen["inductor"] == str(caches / warm["cache"] / "bundles" / "inductor")
    assert (caches / warm["cache"] / "bundles" / "inductor" / "fxgraph").is_dir()
    assert seen["triton"] is None  # Inductor puts Triton's under its own


_TERMINATED_CHILD = r"""
import json, pathlib, signal, sys, time
caches = pathlib.Path(json.loads(sys.argv[1])["workdir"]).parent
def stop(signum, frame):
    (caches / "terminated").write_text("x")
    time.sleep(600)  # a child that cannot end: its group is killed after the grace
signal.signal(signal.SIGTERM, stop)
(caches / "ready").write_text("x")
time.sleep(600)
"""


def test_a_child_past_its_timeout_gets_sigterm_then_sigkill(monkeypatch, tmp_path):
    """SIGTERM first, on which a child cancels its background builds
    (calls.builds_cancelled_on_sigterm), then SIGKILL after the grace; regression:
    the child was killed at once and its build went on."""
    import time

    from earth2studio_compile.tools.bench import workflow

    monkeypatch.setattr(workflow, "CHILD", ("-c", _TERMINATED_CHILD))
    monkeypatch.setattr(workflow, "STOP_GRACE_S", 1.0)
    args = workflow.parse(["--jobs", "fcn", "--device", "cpu", "--io", "zarr-disk"])
    spec = workflow.plan(args)[0]
    start = time.monotonic()
    (row,) = workflow.run_child(spec, tmp_path, 3)
    assert row["error"] == "timed out after 3 s"
    assert (tmp_path / "ready").exists() and (tmp_path / "terminated").exists()
    assert time.monotonic() - start < 3 + 1 + 5


def test_dlwp_ens_all_writes_every_variable_of_16_members_to_disk(capsys):
    """Issue 34's disk target: DLWP 16 x 20, batch 8, all 7 variables; the store
    it implies is the 9.8 GB the help names."""
    import numpy as np
    from earth2studio.models.px.dlwp import VARIABLES

    from earth2studio_compile.tools.bench import workflow
    from earth2studio_compile.tools.bench.ensemble.upstream import store_bytes

    args = workflow.parse(["--device", "cpu", "--jobs", "dlwp-ens-all"])
    (job,) = args.job_list
    assert (job["workflow"], job["model"], job["outputs"]) == (
        "ensemble",
        "dlwp",
        "all",
    )
    assert (job["members"], job["steps"], job["batch_size"]) == (16, 20, 8)
    full = argparse.Namespace(
        input_coords=lambda: {
            "variable": np.array(VARIABLES),
            "lat": np.linspace(90, -90, 721),
            "lon": np.linspace(0, 360, 1440, endpoint=False),
        }
    )
    total = store_bytes(full, job["members"], job["steps"], job["outputs"])
    assert len(VARIABLES) == 7 and total == 16 * 21 * 7 * 721 * 1440 * 4
    assert round(total / 1e9, 1) == 9.8
    with pytest.raises(SystemExit):
        workflow.parse(["--help"])
    assert "9.8 GB" in " ".join(capsys.readouterr().out.split())


def test_attention_reaches_every_child_and_the_meta(monkeypatch, tmp_path):
    """--attention flex,math: each child's spec carries the choice (its compiled
    calls run under it), and the run's meta says which; without it, no spec has
    the field (the rows as before)."""
    from earth2studio_compile.tools.bench import workflow

    argv = ["--jobs", "det:fcn", "--device", "cpu", "--io", "memory-zarr"]
    argv += ["--ways", "cold", "--no-floor"]
    plain = workflow.plan(workflow.parse(argv))
    assert plain and all("attention" not in s for s in plain)
    specs = workflow.plan(workflow.parse([*argv, "--attention", "flex,math"]))
    assert [s["attention"] for s in specs] == [("flex", "math")] * len(specs)
    monkeypatch.setattr(workflow, "CHILD", ("-c", _SEEDED_CHILD))
    out = tmp_path / "wf.json"
    workflow.main([*argv, "--attention", "flex,math", "--json", str(out)])
    assert json.loads(out.read_text())["meta"]["attention"] == ["flex", "math"]
