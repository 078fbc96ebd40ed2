"""Kernel families of a profile (earth2studio_compile.tools.bench.kernels)."""

from __future__ import annotations

import json

import pytest

from earth2studio_compile.tools.bench.kernels import _family, main


@pytest.mark.parametrize(
    "kernel, family",
    [
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", "gemm"),
        ("ampere_sgemm_128x64_tn", "gemm"),
        # cuBLASLt's Hopper kernels (bf16 linear layers on an H200): read as
        # "other" until 2026-11-29.
        ("nvjet_sm90_tst_128x288_64x4_2x1_v_bz_coopA_bias_TNT", "gemm"),
        (
            "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention)",
            "attention",
        ),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "attention"),
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


def test_eager_run_only_in_a_precision(tmp_path):
    out = tmp_path / "k.json"
    argv = ["--models", "toy", "--small", "--device", "cpu", "--steps", "1"]
    argv += ["--options", '{"layout_optimization": false}']  # compiled runs only
    assert (
        main([*argv, "--runs", "eager", "--precision", "fp32", "--json", str(out)]) == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [(r["run"], r["precision"], r["options"]) for r in rows] == [
        ("eager", "fp32", None)
    ]
    assert rows[0]["wall_ms"] > 0 and "attention_ms" in rows[0]
    assert json.loads(out.read_text())["environment"]["torch"]  # the docs name it


def test_unknown_run_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--runs", "eager,fast"])
    assert "--runs takes eager, compiled or both" in capsys.readouterr().err


def test_a_compiled_profile_waits_for_its_builds_and_says_what_ran(
    background_on, monkeypatch
):
    """With its artifact building in the background a region runs eagerly: the
    compiled profile waits for the build and names the regions' statuses, so an
    eager profile is never taken for a compiled one."""
    import torch

    from earth2studio_compile.artifacts import build_job
    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench import kernels

    monkeypatch.setattr(build_job, "CHILD", "import time; time.sleep(1)")
    import earth2studio_compile

    waited = []
    real = earth2studio_compile.wait_for_builds

    def wait(*args, **kwargs):
        waited.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(earth2studio_compile, "wait_for_builds", wait)
    model = zoo.build("toy", size="small")
    row = kernels.profile_steps(model, torch.device("cpu"), 1, compiled=True)
    assert waited
    assert row["statuses"] and "building" not in row["statuses"], row["statuses"]
    assert row["modes"] == ["inductor/default"], row["modes"]
    assert row["top"] == []  # device kernels only: none on the CPU


def test_attention_replaces_the_tables_choice_for_compiled_runs_only(monkeypatch):
    """``--attention flex,math``: the compiled run's regions are traced with that
    choice (their label says it), the eager run is told none, and the model table
    is as it was afterwards."""
    from earth2studio_compile.models import lookup
    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench import kernels

    seen = []

    def profile(model, device, steps, compiled, precision, options):
        seen.append((compiled, lookup(model)[1].attention_backends))
        return {"wall_ms": 1.0, "top": []}

    monkeypatch.setattr(kernels, "profile_steps", profile)
    monkeypatch.setattr(kernels, "table", lambda rows: "")
    before = lookup(zoo.build("fcn", size="small"))[1]
    argv = ["--models", "fcn", "--small", "--device", "cpu", "--steps", "1"]
    assert main([*argv, "--attention", "flex,MATH"]) == 0
    assert seen == [(False, before.attention_backends), (True, ("flex", "math"))]
    assert lookup(zoo.build("fcn", size="small"))[1] is before


def test_an_attention_choice_that_is_none_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--attention", "flex,flexible"])
    assert "'flexible'" in capsys.readouterr().err
