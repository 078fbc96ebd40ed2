"""The benchmark CLI (tools.bench.__main__): argument errors, derived figures, tables.

The measurements themselves run in fresh processes (``test_cache.py`` runs one); these
tests keep the arithmetic and the error messages honest without timing anything.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from earth2studio_compile.tools.bench import __main__ as cli
from earth2studio_compile.tools.bench.e2e import STEP
from earth2studio_compile.tools.bench.measure import Rollout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--modes", "reduce_overhead"], "unknown mode 'reduce_overhead'"),
        (["--steps", "5"], "--steps must be >= 11"),
        (["--io", "parquet"], "unknown IO backend 'parquet'"),
        (["--skip-rollouts"], "--skip-rollouts leaves nothing to measure without --io"),
        (["--device", "tpu"], "--device must be cuda or cpu"),
        (["--precision", "fp16"], "unknown precision 'fp16'"),
        (["--precision", "tf32", "--fp32"], "--precision sets TF32 per row"),
        (["--writers", "1"], "--writers takes auto or worker counts >= 2, not '1'"),
        (["--writers", "auto,x"], "--writers takes auto or worker counts >= 2"),
    ],
)
def test_bad_arguments_name_the_fix(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli._parse(argv)
    assert message in capsys.readouterr().err


def test_speedup_and_break_even():
    eager = {"steady_ms": 60.0, "first_step_s": 0.5, "peak_gpu_bytes": 100}
    comp = {"steady_ms": 50.0, "first_step_s": 20.5, "peak_gpu_bytes": 110}
    out = cli.derive(eager, comp)
    assert out["speedup"] == pytest.approx(1.2)
    # 20 s extra first step / 10 ms saved per step = 2000 steps, plus the first one.
    assert out["break_even_steps"] == pytest.approx(2001)
    assert out["memory_ratio"] == pytest.approx(1.1)
    slower = cli.derive(eager, {**comp, "steady_ms": 70.0})
    assert slower["break_even_steps"] is None  # never pays back
    assert cli.derive({"error": "x"}, comp) == {}


def test_steady_ms_averages_whole_model_calls():
    # DLWP-like: each network call (10 ms) yields two steps, the second costs 1 ms.
    # Step 1 compiles, step 2 is its free partner.
    steps = [30.0, 0.001] + [0.010, 0.001] * 4
    rollout = Rollout(steps, outputs=[], period=2)
    assert rollout.steady_ms == pytest.approx(5.5)  # mean of each (10 ms, 1 ms) pair
    # A per-step median would report only the free steps, which outnumber the others.
    assert Rollout(steps, outputs=[]).steady_ms == pytest.approx(1.0)


def test_render_merges_json_runs(tmp_path, capsys):
    env = {"torch": "x", "triton": "y", "date": "d", "gpu": "G", "driver": "1"}
    row = {
        "model": "toy",
        "mode": "eager",
        "first_step_s": 0.1,
        "steady_ms": 2.0,
        "step_s": [0.1, 0.002, 0.002],
        "report": None,
    }
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"environment": env, "results": [row]}))
    assert cli.main(["--render", str(path)]) == 0
    assert "toy" in capsys.readouterr().out


def test_eager_precision_rows_scope_the_core_and_restore_it():
    import torch

    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench.measure import eager_precision

    model = zoo.build("toy")
    x = torch.randn(1, 4, 16, 32)
    seen = []
    inner = model.model.net.forward

    def spy(*args):
        seen.append(torch.is_autocast_enabled("cpu"))
        return inner(*args)

    model.model.net.forward = spy
    with eager_precision(model, "bf16"), torch.no_grad():
        out = model.model(x)
        assert "forward" in model.model.__dict__
    assert seen == [True] and out.dtype == torch.float32
    assert "forward" not in model.model.__dict__
    assert not torch.is_autocast_enabled("cpu")


def test_precision_rows_are_labelled_and_compared_at_three_steps():
    row = {
        "model": "fcn",
        "mode": "auto",
        "precision": "bf16",
        "first_step_s": 1.0,
        "steady_ms": 20.0,
        "rel_l2_first": 4e-3,
        "rel_l2_10": 9e-3,
        "rel_l2_last": 0.2,
    }
    line = cli.table([row]).splitlines()[-1]
    assert line.startswith("fcn bf16") and "4.0e-03" in line and "9.0e-03" in line


def test_break_even_is_against_eager_in_the_same_precision():
    fp32 = {"model": "fcn", "mode": "eager", "precision": "fp32"}
    fp32.update(steady_ms=60.0, first_step_s=0.5)
    tf32 = {"model": "fcn", "mode": "eager", "precision": "tf32"}
    tf32.update(steady_ms=30.0, first_step_s=0.5)
    comp = {"model": "fcn", "mode": "reduce-overhead", "precision": "tf32"}
    comp.update(steady_ms=20.0, first_step_s=4.5)
    out = cli._against_eager([fp32, tf32], "fcn", "tf32", comp)
    assert out["speedup"] == pytest.approx(3.0)  # against fp32 eager, TF32 off
    # 4 s extra first step / 10 ms saved against TF32 eager, plus the first step.
    assert out["break_even_steps"] == pytest.approx(401)
    assert out["break_even_against"] == "eager tf32"
    # Without a TF32 eager row it is the fp32 reference's.
    alone = cli._against_eager([fp32], "fcn", "tf32", comp)
    assert alone["break_even_steps"] == pytest.approx(1 + 4000 / 40)


def test_forecast_totals_and_warm_phases():
    warm = {"model": "fcn", "mode": "reduce-overhead", "cache": "warm"}
    warm.update(steady_ms=50.0, first_step_s=4.0, warm_over_cold=0.2)
    warm["report"] = {"regions": [{"phases": {"dynamo": 2.5, "backend": 1.0}}]}
    text = cli.forecast_totals([warm])
    # 4 s + 39 x 50 ms, 4 s + 59 x 50 ms, 4 s + 239 x 50 ms, 4 s + 639 x 50 ms
    assert "5.95" in text and "6.95" in text and "15.95" in text and "35.95" in text
    (line,) = cli.warm_lines([warm])
    assert line.endswith("(20%); dynamo 2.50 s, backend 1.00 s")


def test_e2e_breakdown_attributes_the_time_outside_the_model(monkeypatch, tmp_path):
    """A slow split_coords, data source and progress bar each show in their own
    column, not in the unattributed rest of the loop."""
    import time

    import earth2studio.run as upstream
    import torch

    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench.e2e import breakdown

    delay, nsteps = 0.05, 3
    split, fetch, tqdm = upstream.split_coords, upstream.fetch_data, upstream.tqdm

    def slow(fn):
        def wrapper(*args, **kwargs):
            time.sleep(delay)
            return fn(*args, **kwargs)

        return wrapper

    class SlowBar(tqdm):
        def update(self, n=1):
            time.sleep(delay)
            return super().update(n)

    slow_split = slow(split)
    monkeypatch.setattr(upstream, "split_coords", slow_split)
    monkeypatch.setattr(upstream, "fetch_data", slow(fetch))
    monkeypatch.setattr(upstream, "tqdm", SlowBar)
    model = zoo.build("persistence")
    b = breakdown(model, "zarr", nsteps, torch.device("cpu"), tmp_path)
    # N + 1 writes (the initial state too) over N steps.
    per_step = 1e3 * delay * (nsteps + 1) / nsteps
    assert b["split_coords_ms"] >= per_step and b["progress_ms"] >= per_step
    assert b["data_s"] >= delay and b["setup_s"] >= b["data_s"] + b["add_array_s"]
    assert b["loop_ms"] < 1e3 * delay
    total = b["setup_s"] + nsteps * sum(b[f"{p}_ms"] for p in STEP) / 1e3 + b["tail_s"]
    assert total == pytest.approx(b["wall_s"], rel=1e-6)
    # What the instrumentation replaced is back.
    assert upstream.split_coords is slow_split and upstream.tqdm is SlowBar


# -- Ensemble mode (tools/bench/ensemble/) ------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ensemble", "4", "--batch-size", "2,x"], "--batch-size takes positive"),
        (["--ensemble", "4", "--io", "netcdf4"], "--ensemble writes to"),
        (["--ensemble", "4", "--precision", "fp16"], "unknown precision 'fp16'"),
        (["--ensemble", "2", "--steps", "0"], "--ensemble and --steps must be >= 1"),
    ],
)
def test_ensemble_bad_arguments_name_the_fix(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli._parse(argv)
    assert message in capsys.readouterr().err


def test_ensemble_plan_has_every_row_once():
    from earth2studio_compile.tools.bench.ensemble import plan_rows

    argv = ["--ensemble", "16", "--batch-size", "32,4", "--steps", "3"]
    argv += ["--models", "dlwp", "--precision", "tf32,bf16", "--all-variables"]
    args = cli._parse([*argv, "--device", "cuda"])
    assert args.batch_list == [4, 16]  # sorted, capped at the ensemble size
    specs = plan_rows(args)
    few = [s for s in specs if s["outputs"] == "few"]
    # Per batch size: eager, eager TF32, then per precision a prime and a warm row.
    assert [(s["run"], s["precision"], s["cache"]) for s in few[:6]] == [
        ("eager", None, None),
        ("eager-tf32", None, None),
        ("compiled", "tf32", "cold"),
        ("compiled", "tf32", "warm"),
        ("compiled", "bf16", "cold"),
        ("compiled", "bf16", "warm"),
    ]
    assert len(few) == 12 and few[2]["prime"] and not few[3].get("prime")
    assert few[2]["tag"] == few[3]["tag"] != few[4]["tag"]  # warm reads its prime
    every = [s for s in specs if s["outputs"] == "all"]
    assert [(s["run"], s["batch_size"]) for s in every] == [
        ("eager", 16),
        ("compiled", 16),
        ("compiled", 16),
    ]
    # On the CPU TF32 does nothing: no eager TF32 row; --no-warm: no prime.
    cpu = plan_rows(cli._parse([*argv, "--device", "cpu", "--no-warm"]))
    assert {s["run"] for s in cpu} == {"eager", "compiled"}
    assert not any(s.get("prime") for s in cpu)
    lean = plan_rows(cli._parse([*argv, "--device", "cuda", "--no-precision-eager"]))
    assert "eager-tf32" not in {s["run"] for s in lean}


def _row(run, b, rate, precision=None, io="zarr-disk", **extra):
    return {
        "model": "fcn",
        "io": io,
        "outputs": "few",
        "run": run,
        "precision": precision,
        "batch_size": b,
        "member_steps_per_s": rate,
        **extra,
    }


def test_ensemble_summary_compares_with_upstreams_best_batch():
    from earth2studio_compile.tools.bench.ensemble import summarize, tables

    rows = [
        _row("eager", 4, 10.0),
        _row("eager", 16, 12.0),  # upstream's best batch size
        _row("eager-tf32", 16, 20.0),
        _row("compiled", 4, 30.0, "tf32"),
        _row("compiled", 16, 48.0, "tf32"),
        _row("compiled", 32, None, "tf32", oom=True, error="out of memory: x"),
        _row("compiled", 16, 60.0, "tf32", io="async-zarr"),
        _row("compiled", 16, 1.0, "tf32", prime=True),
    ]
    del rows[5]["member_steps_per_s"], rows[-1]["member_steps_per_s"]
    s = summarize(rows)
    by = {(e["io"], e["run"], e["batch_size"]): e for e in s["rows"]}
    e = by[("zarr-disk", "compiled", 16)]
    assert e["vs_eager"] == pytest.approx(4.0) and e["vs_eager_batch"] == 16
    assert e["vs_eager_tf32"] == pytest.approx(2.4)
    assert by[("async-zarr", "compiled", 16)]["async_vs_zarr"] == pytest.approx(1.25)
    # no eager rows on async-zarr: nothing to compare with there
    assert by[("async-zarr", "compiled", 16)]["vs_eager"] is None
    assert len(s["rows"]) == 6  # the OOM and the prime rows have no throughput
    fits = s["largest_batch"]["fcn zarr-disk few compiled tf32"]
    assert fits == {"fits": 16, "oom_at": 32}
    for r in rows:
        r.setdefault("steady_member_steps_per_s", 1.0)
        r.update(first_step_s=0.5, wall_s=2.0)
    text = tables(rows)
    assert "OOM: out of memory" in text and "4.00 (B=16)" in text
    assert "out of memory at 32" in text


def test_ensemble_cli_writes_json_after_every_row_and_skips_past_oom(
    monkeypatch, tmp_path, capsys
):
    calls = []

    def fake(spec, timeout, workdir):
        calls.append(spec)
        if spec["run"] == "compiled" and spec["batch_size"] == 2:
            return {**spec, "oom": True, "error": "out of memory: CUDA"}
        rate = 10.0 * spec["batch_size"]
        row = {**spec, "member_steps_per_s": rate, "steady_member_steps_per_s": rate}
        return row | {"first_step_s": 0.1, "wall_s": 1.0}

    monkeypatch.setattr(cli, "_run_one", fake)
    out = tmp_path / "ens.json"
    argv = ["--ensemble", "4", "--batch-size", "1,2,4", "--models", "fcn"]
    argv += ["--precision", "fp32", "--no-warm", "--device", "cpu", "--json", str(out)]
    assert cli.main(argv) == 0  # running out of memory is a result, not a failure
    rows = json.loads(out.read_text())["ensemble"]
    assert [(r["run"], r["batch_size"]) for r in rows] == [
        ("eager", 1),
        ("compiled", 1),
        ("eager", 2),
        ("compiled", 2),
        ("eager", 4),
        ("compiled", 4),
    ]
    assert rows[-1]["skipped"] == "skipped: batch 2 ran out of memory"
    assert len(calls) == 5  # the skipped row started no process
    assert "largest batch run 1, out of memory at 2" in capsys.readouterr().out


def test_ensemble_mode_measures_small_fcn(tmp_path):
    """One eager and one compiled row of small FCN in this process: every field
    present and sane (nothing timed against a figure)."""
    from earth2studio_compile.tools.bench.ensemble import STEP, measure_ensemble

    ref = tmp_path / "ref.pt"
    base = {"model": "fcn", "mode": "ensemble", "size": "small", "device": "cpu"}
    base |= {"nensemble": 3, "steps": 2, "io": "zarr-disk", "outputs": "few"}
    base |= {"reference": str(ref), "workdir": str(tmp_path)}
    rows = []
    for run, b in (("eager", 2), ("eager", 3), ("compiled", 2)):
        spec = base | {"run": run, "batch_size": b, "save_reference": run == "eager"}
        if run == "compiled":
            spec |= {"precision": "fp32"}
        rows.append(measure_ensemble(spec))
    for r in rows:
        assert "error" not in r, r.get("error")
        assert r["member_steps"] == 6 and r["member_steps_per_s"] > 0
        assert 0 < r["first_step_s"] < r["wall_s"]
        assert r["steady_member_steps_per_s"] > 0
        assert r["peak_gpu_bytes"] is None and r["peak_gpu_bytes_per_member"] is None
        # 3 members x 3 lead times x 3 variables x 16 x 32 float32, plus metadata
        assert r["store_bytes_expected"] == 4 * 3 * 3 * 3 * 16 * 32
        assert r["store_bytes"] >= r["store_bytes_expected"] // 2
        b = r["breakdown"]
        assert b["steps"] == 2 and all(b[f"{p}_ms"] >= 0 for p in STEP if p != "loop")
        assert b["core_ms"] > 0 and b["write_ms"] > 0 and b["perturb_ms"] > 0
    assert rows[2]["report"]["regions"][0]["status"] == "compiled"
    # Same seeded data and perturbation at the same batch size as the reference.
    assert rows[2]["rel_l2_first"] < 1e-5
    # The compiled row measures its floors in its session: the compiled step, and
    # the same bytes through the workflow mode's storage floor (8 writers and 1).
    assert "floors" not in rows[0] and "floors" not in rows[1]
    f = rows[2]["floors"]
    assert f["model_steps"] == 4 and f["compute_ms"] > 0  # 2 steps x 2 batches
    assert f["store_bytes"] == rows[2]["store_bytes_expected"]
    assert f["io_floor_writers"] == 8 and f["io_floor_1writer_s"] > 0
    assert f["storage_ms"] == pytest.approx(1e3 * f["io_floor_s"] / 4)
    assert f["floor_s"] == pytest.approx(4 * f["floor_ms"] / 1e3)
    assert rows[2]["wall_over_floor"] == pytest.approx(rows[2]["wall_s"] / f["floor_s"])
    assert not list(tmp_path.glob("**/floor-*"))


def test_ensemble_breakdown_sits_beside_the_floors():
    from earth2studio_compile.tools.bench.ensemble import STEP, tables
    from earth2studio_compile.tools.bench.ensemble.tables import floors_of

    phases = {f"{p}_ms": 10.0 for p in STEP} | {"setup_s": 0.5}  # 80 ms a step
    floors = {"compute_ms": 2.0, "storage_ms": 18.0, "floor_ms": 20.0, "floor_s": 0.5}
    extra = {"steady_member_steps_per_s": 1.0, "first_step_s": 0.1, "wall_s": 2.0}
    rows = [
        _row("eager", 8, 1.0, breakdown=phases, **extra),
        _row("compiled", 8, 2.0, "fp32", breakdown=phases, floors=floors, **extra),
        _row("compiled", 8, 2.0, "tf32", floors=floors | {"floor_ms": 1.0}, **extra),
        _row("eager", 4, 1.0, breakdown=phases, **extra),  # no floors at B=4
    ]
    assert floors_of(rows[0], rows) is floors  # eager fp32: the fp32 floors
    assert floors_of(rows[3], rows) is None
    text = tables(rows).split("Per batched step")[1].split("Throughput")[0]
    assert "compute floor ms" in text and "wall/floor" in text
    eager = next(x.split() for x in text.splitlines() if " eager " in x and " 8 " in x)
    # step ms (every phase but the perturbation), the floors, step/floor, wall/floor
    assert eager[-5:] == ["80.0", "2.0", "18.0", "4.00", "4.00"]
    small = next(x.split() for x in text.splitlines() if " 4 " in x)
    assert small[-5:] == ["80.0", "-", "-", "-", "-"]


def test_workflow_store_bytes_count_the_variables_written():
    from earth2studio_compile.tools.bench import calls

    spec = {"workflow": "ensemble", "members": 8, "steps": 10, "outputs": "few"}
    assert calls.store_bytes(spec, _small_fcn()) == 4 * 8 * 11 * 3 * 16 * 32
    spec["outputs"] = "all"
    assert calls.store_bytes(spec, _small_fcn()) == 4 * 8 * 11 * 26 * 16 * 32


def test_render_merges_ensemble_runs(tmp_path, capsys):
    env = {"torch": "x", "triton": "y", "date": "d", "gpu": "G", "driver": "1"}
    rows = {"zarr-disk": 10.0, "async-zarr": 15.0}
    for io, rate in rows.items():
        row = _row("eager", 16, rate, io=io)
        row |= {"steady_member_steps_per_s": rate, "first_step_s": 0.1, "wall_s": 9.0}
        payload = {"environment": env, "ensemble": [row]}
        (tmp_path / f"{io}.json").write_text(json.dumps(payload))
    paths = [str(tmp_path / f"{io}.json") for io in rows]
    assert cli.main(["--render", *paths]) == 0
    assert "1.50" in capsys.readouterr().out  # async-zarr over its zarr-disk twin


def test_an_aot_row_builds_first_and_says_when_the_artifact_was_not_used(
    monkeypatch, tmp_path
):
    """``--aot``: the build runs in its own process on the rows' cache root, and a
    row whose regions did not run their artifact is marked, with the reasons."""
    from earth2studio_compile.tools.bench import __main__ as bench

    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"], seen["env"] = cmd, kwargs["env"]
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    spec = {"model": "fcn", "mode": "auto", "size": "small", "precision": "tf32"}
    out = bench._build_one(spec, 60, tmp_path)
    assert out["build_s"] >= 0.0 and "build_error" not in out
    assert seen["cmd"][-5:] == ["fcn", "--size", "small", "--precision", "tf32"]
    assert seen["env"]["EARTH2STUDIO_COMPILE_CACHE"] == str(
        tmp_path / "bundles-fcn-auto"
    )
    ran = {"cache": "aot", "report": {"regions": [{"executor": "aot", "declined": []}]}}
    bench._say_which_path(ran)
    assert ran["cache"] == "aot"
    reason = "aot: no artifact for this key"
    fell = {
        "cache": "aot",
        "report": {"regions": [{"executor": "dynamo", "declined": [reason]}]},
    }
    bench._say_which_path(fell)
    assert fell["cache"] == "aot-declined" and fell["aot_declined"] == [reason]


# -- workflow mode --------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ways", "warm"], "--ways warm reuses the cold row's caches; add cold"),
        (["--ways", "hot"], "--ways: unknown 'hot'"),
        (["--io", "zarr"], "--io: unknown 'zarr'"),
        (["--io", ","], "--io is empty"),
        (
            ["--jobs", "gfs"],
            "--jobs: unknown 'gfs'; use fcn, dlwp-ens, fcn-ens, det:MODEL",
        ),
        (["--precision", "fp16"], "--precision: unknown 'fp16'"),
        (["--steps", "0"], "--steps must be >= 1, not 0"),
        (["--device", "tpu"], "--device must be cuda or cpu"),
        (["--writers", "0"], "--writers must be >= 1, not 0"),
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
    assert floor["floor_s"] == floor["compute_floor_s"] + floor["io_floor_s"]
    # The storage floor with as many writers as AsyncZarrBackend, and with one.
    assert floor["io_floor_writers"] == 8 and floor["io_floor_1writer_s"] > 0
    assert floor["io_sync_s"] >= 0
    # 3 lead times x 26 variables x 16 x 32 float32
    assert floor["store_bytes_expected"] == 4 * 3 * 26 * 16 * 32
    text = capsys.readouterr().out
    assert "Whole call" in text and " (8 writers)" in text


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
    assert compiled["wall_s"] >= compiled["returned_s"] > 0
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


def test_ensemble_rows_stop_before_a_row_that_cannot_finish(monkeypatch, tmp_path):
    from earth2studio_compile.tools.bench import deadline

    clock = {"t": 0.0}
    monkeypatch.setattr(deadline.time, "perf_counter", lambda: clock["t"])

    def fake(spec, timeout, workdir):
        clock["t"] += 30.0
        row = {**spec, "member_steps_per_s": 1.0, "steady_member_steps_per_s": 1.0}
        return row | {"first_step_s": 0.1, "wall_s": 1.0}

    monkeypatch.setattr(cli, "_run_one", fake)
    out = tmp_path / "ens.json"
    argv = ["--ensemble", "2", "--models", "fcn", "--io", "zarr-disk,async-zarr"]
    argv += ["--precision", "fp32", "--no-warm", "--device", "cpu"]
    assert cli.main([*argv, "--deadline", "70", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["ensemble"]
    assert [(r["io"], r["run"], r.get("skipped", "ran")[:17]) for r in rows] == [
        ("zarr-disk", "eager", "ran"),
        ("zarr-disk", "compiled", "ran"),
        ("async-zarr", "eager", "skipped: deadline"),  # 10 s left, it took 30
        ("async-zarr", "compiled", "skipped: deadline"),
    ]
    assert rows[0]["process_s"] == 30.0
    assert "a row like it took 30 s" in rows[2]["skipped"]
