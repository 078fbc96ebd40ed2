"""The benchmark CLI's logic: argument errors, derived figures, tables, kernel families.

The measurements themselves run in fresh processes (``test_cache.py`` runs one); these
tests keep the arithmetic and the error messages honest without timing anything.
"""

from __future__ import annotations

import json

import pytest

from earth2studio_compile.tools.bench import __main__ as cli
from earth2studio_compile.tools.bench.e2e import SETUP, STEP, _derive_rows, e2e_table
from earth2studio_compile.tools.bench.kernels import _family
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


def test_tables_render_errors_and_figures():
    rows = [
        {
            "model": "fcn",
            "mode": "eager",
            "first_step_s": 0.4,
            "steady_ms": 62.0,
            "report": None,
        },
        {"model": "fcn", "mode": "auto", "error": "timed out after 9 s"},
    ]
    text = cli.table(rows)
    assert "62.00" in text and "error: timed out" in text
    # runs with TF32 off are another comparison, and say so
    fp32 = cli.table([rows[0] | {"fp32": True}])
    assert "fcn fp32" in fp32 and "fcn fp32" not in text
    b = {f"{p}_ms": 1.0 for p in STEP} | {f"{p}_s": 0.1 for p in SETUP}
    b |= {"setup_s": 0.5, "tail_s": 0.1, "wall_s": 6.5}
    r = {
        "breakdown": {"eager": b | {"model_ms": 60.0}, "compiled": b},
        "rows": [
            {"run": "eager", "model_run": "eager", "wall_s": 6.5},
            {"run": "compiled+overlap", "model_run": "compiled", "wall_s": 3.7},
        ],
    }
    _derive_rows(r, nsteps=20)
    text = e2e_table("fcn", {"nsteps": 20, "backends": {"zarr": r}})
    assert "6.50" in text and "3.70" in text and "zarr" in text and "1.76" in text
    # The floor: set-up plus 20 compiled model steps, for eager rows too.
    assert r["rows"][1]["floor_s"] == pytest.approx(0.5 + 20 * 1e-3)
    assert r["rows"][0]["floor_ratio"] == pytest.approx(6.5 / 0.52)


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


@pytest.mark.parametrize(
    "kernel, family",
    [
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", "gemm"),
        ("ampere_sgemm_128x64_tn", "gemm"),
        ("regular_fft_factor<...>", "fft"),
        ("cudnn::winograd_nonfused::winogradForwardData4x4", "conv"),
        ("triton_poi_fused_add_gelu_0", "triton"),
        ("Memcpy DtoD (Device -> Device)", "copy"),
        (
            "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>",
            "other",
        ),
    ],
)
def test_kernel_families(kernel, family):
    assert _family(kernel) == family


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
