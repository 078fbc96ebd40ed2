"""Loading and verifying an artifact (earth2studio_compile.artifacts.aot_load) on
CPU: the reasons it declines, a fresh process's load, verify's reasons.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from aot_helpers import eager, load, tiny_target

from earth2studio_compile.artifacts.aot_load import load_runner, verify
from earth2studio_compile.artifacts.aot_runner import AotRunner


def _copy_artifact(built, root: Path) -> Path:
    target = root / "aot" / built.result.path.name
    shutil.copytree(built.result.path, target)
    return target


def test_a_damaged_artifact_declines(built, tmp_path):
    target = _copy_artifact(built, tmp_path)
    package = target / "model.pt2"
    data = bytearray(package.read_bytes())
    data[len(data) // 2] ^= 0xFF
    package.write_bytes(bytes(data))
    reason = load(built, root=tmp_path)
    assert isinstance(reason, str) and "checksum" in reason


def test_an_artifact_with_another_answer_is_caught_by_verify(built, planted):
    runner = load(built, root=planted)
    assert isinstance(runner, AotRunner), runner
    reason = verify(runner(*built.args), eager(built.core, built.args), "fp32")
    assert reason is not None and "rel. L2" in reason


def test_verify_reasons():
    a = torch.ones(2, 3)
    assert verify(a, a.clone(), "fp32") is None
    assert "structure" in verify((a,), a, "fp32")
    assert "[3, 2]" in verify(a.T.contiguous(), a, "fp32")
    nan = a.clone()
    nan[0, 0] = float("nan")
    assert "NaN" in verify(nan, a, "fp32")
    assert verify(nan, nan.clone(), "fp32") is None
    assert verify(a * (1 + 1e-3), a, "bf16") is None
    assert "rel. L2" in verify(a * (1 + 1e-3), a, "fp32")


def test_verify_counts_eagers_own_overflow_as_its_answer():
    """Regression: an output that overflows where eager overflows, with the same
    sign, was "off by rel. L2 nan" (a model's legitimate inf refused every compile,
    since the Dynamo path is checked too)."""
    a = torch.ones(2, 3)
    inf = a.clone()
    inf[0, 0], inf[1, 2] = float("inf"), -float("inf")
    assert verify(inf, inf.clone(), "fp32") is None
    assert "infinities" in verify(inf, a, "fp32")
    assert "infinities" in verify(a, inf, "fp32")
    assert "infinities" in verify(-inf, inf, "fp32")
    near = inf.clone()
    near[0, 1] = 1.5
    assert "rel. L2" in verify(near, inf, "fp32")


def test_a_fresh_process_loads_and_matches(built, tmp_path):
    """A new process (empty Inductor cache) loads the artifact; its first call
    is reported against the build time, not asserted."""
    script = textwrap.dedent(
        f"""
        import json, os, time
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = {str(tmp_path / "inductor")!r}
        import torch
        from earth2studio_compile import example_input
        from earth2studio_compile.aot import capture_calls
        from earth2studio_compile.artifacts.aot_load import load_runner
        from earth2studio_compile.artifacts.key import RegionTarget
        from earth2studio_compile.options import CompileOptions
        from earth2studio_compile.metrics import rel_l2
        from earth2studio_compile.tools import zoo
        model = zoo.build("fcn", size="small")
        core = model.model
        x, coords = example_input(model)
        args, kwargs, *_ = capture_calls(model, [core], x, coords)[id(core)]
        args = (torch.randn_like(args[0]),)
        start = time.perf_counter()
        target = RegionTarget.resolve(
            core, owner={built.owner!r}, region="model", device=torch.device("cpu"),
            precision="fp32", options=CompileOptions(),
        )
        runner = load_runner(target, args, kwargs,
                             root=__import__("pathlib").Path({str(built.root)!r}))
        out = runner(*args)
        seconds = time.perf_counter() - start
        with torch.no_grad():
            err = rel_l2(out, core(*args))
        print(json.dumps({{"seconds": seconds, "error": err, "phases": runner.phases}}))
        """
    )
    env = {**os.environ, "EARTH2STUDIO_COMPILE_CACHE": "off"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] <= 1e-5
    build_seconds = sum(
        json.loads((built.result.path / "meta.json").read_text())[
            "build_seconds"
        ].values()
    )
    print(
        f"fresh process: load + first call {result['seconds']:.3f} s, "
        f"build {build_seconds:.1f} s "
        f"({100 * result['seconds'] / build_seconds:.1f}%), phases {result['phases']}"
    )


def test_a_record_changed_after_the_build_fails_the_checksum(conv_built, tmp_path):
    target = tmp_path / "aot" / conv_built.path.name
    shutil.copytree(conv_built.path, target)
    (target / "convolutions.json").write_text("[]")
    reason = load_runner(
        tiny_target(conv_built.core), conv_built.args, {}, root=tmp_path
    )
    assert reason == (
        f"artifact {target} not used: checksum mismatch for convolutions.json"
    )
    (target / "convolutions.json").unlink()
    reason = load_runner(
        tiny_target(conv_built.core), conv_built.args, {}, root=tmp_path
    )
    assert isinstance(reason, str) and "checksums and members differ" in reason


def test_verify_under_the_callers_autocast_allows_its_precision():
    """Regression: a region without a precision of its own, run by its model under
    autocast to bf16 (AIFS's wrapper), was held to fp32's tolerance: two correct
    calls 4e-3 apart were "another answer than eager", and AIFS2ENS's processor
    ran eagerly (CI, 2026-11-30)."""
    a = torch.randn(64, 64)
    near = a * (1 + 1e-3)
    assert "1e-05 allowed for fp32" in verify(near, a, None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert verify(near, a, None) is None
        assert "allowed for bf16" in verify(a * 1.5, a, None)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert verify(near, a, None) is not None


def test_verify_under_an_autocast_entered_again_in_tf32_allows_bf16s_error():
    """A build in tf32 of a region its model's wrapper runs under bf16 autocast
    (FCN3's) verifies under that autocast, entered again inside tf32's scope: the
    artifact and eager both compute in bf16. Held to tf32's tolerance, two of
    FCN3's block MLPs were refused at 3.3e-3 (H200, 2026-12-01)."""
    a = torch.randn(64, 64)
    near = a * (1 + 3.3e-3)
    assert verify(near, a, "tf32") is not None  # fp32's tolerance on a CPU
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert verify(near, a, "tf32") is None
        assert "allowed for bf16" in verify(a * 1.5, a, "fp32")
