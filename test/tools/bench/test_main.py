"""The benchmark CLI (tools.bench.__main__): argument errors, derived figures, tables.

The measurements themselves run in fresh processes (``artifacts/test_bundles.py``
runs one); these tests keep the arithmetic and the error messages honest without
timing anything. The ensemble, workflow and end-to-end modes have test files of
their own.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from earth2studio_compile.tools.bench import __main__ as cli
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


# -- Ensemble mode: its arguments, plan and rows (tools/bench/ensemble/) ------------
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


def test_a_rollout_row_names_its_worst_variable(tmp_path, monkeypatch):
    """Before, a row kept only the whole state's relative L2, which the largest
    fields dominate: an H200 run read 1.8e-3 for Aurora while a per-variable check
    found 3.9e-2 in q200."""
    from loguru import logger

    from earth2studio_compile.tools.bench import measure

    monkeypatch.setattr(logger, "remove", lambda *a, **k: None)
    monkeypatch.setattr(logger, "add", lambda *a, **k: 0)
    ref = tmp_path / "ref.pt"
    spec = {"model": "toy", "size": "small", "device": "cpu", "steps": 2}
    measure.measure({**spec, "mode": "eager", "reference": str(ref)})
    saved = torch.load(ref)
    saved["first"][..., 1, :, :] *= 1.01  # (time, lead, variable, lat, lon): u10m
    torch.save(saved, ref)
    row = measure.measure(
        {**spec, "mode": "eager", "reference": str(ref), "save_reference": False}
    )
    name, worst = row["rel_l2_first_worst"]
    assert name == "u10m" and worst == pytest.approx(0.01 / 1.01, rel=1e-6)
    assert row["rel_l2_first"] < worst


def test_a_compiled_rollout_row_runs_under_the_attention_it_was_given(
    tmp_path, monkeypatch
):
    """``--attention``: a compiled row's model runs under that choice, the eager
    row under the table's, and the table is as it was after each."""
    from loguru import logger

    from earth2studio_compile.models import lookup
    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench import measure

    monkeypatch.setattr(logger, "remove", lambda *a, **k: None)
    monkeypatch.setattr(logger, "add", lambda *a, **k: 0)
    seen = []

    def rollout(model, *args, **kwargs):
        seen.append(lookup(model)[1].attention_backends)
        raise RuntimeError("timed elsewhere")

    monkeypatch.setattr(measure, "time_rollout", rollout)
    before = lookup(zoo.build("fcn", size="small"))[1]
    spec = {"model": "fcn", "size": "small", "device": "cpu", "steps": 2}
    spec |= {"reference": str(tmp_path / "ref.pt"), "attention": ["flex", "math"]}
    for mode in (measure.EAGER, measure.AUTO):
        with pytest.raises(RuntimeError, match="timed elsewhere"):
            measure.measure({**spec, "mode": mode})
        assert lookup(zoo.build("fcn", size="small"))[1] is before
    assert seen == [before.attention_backends, ("flex", "math")]
    args = cli._parse(["--attention", "FLEX,math", "--device", "cpu"])
    assert args.attention == ("flex", "math")


def test_only_the_compiled_rows_are_given_the_attention_choice(monkeypatch):
    from earth2studio_compile.tools.bench.rollouts import run_rollouts

    specs = []

    def run_one(spec, timeout, workdir):
        specs.append(spec)
        return {**spec, "error": "not run (test)"}

    args = cli._parse(["--models", "fcn", "--small", "--device", "cpu"])
    args.attention = ("flex", "math")
    args.warm = False
    run_rollouts(args, run_one, run_one)
    assert [(s["mode"], s["attention"]) for s in specs] == [
        ("eager", None),
        *((mode, ["flex", "math"]) for mode in args.mode_list),
    ]
