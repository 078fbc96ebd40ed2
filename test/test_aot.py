"""Ahead-of-time compiled regions (earth2studio_compile.aot, .artifacts) on CPU.

Two real AOTInductor builds per session (each 25-90 s on 2 cores): the small FCN
core through ``earth2studio_compile.build`` (module fixture), and a cheap core with
another ``forward`` planted under the FCN core's key. Key changes are checked by
changing a ``RegionTarget`` or the arguments of its ``aot_key``, without rebuilding.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from earth2studio_compile.aot import capture_calls
from earth2studio_compile.artifacts.aot_build import build_region
from earth2studio_compile.artifacts.aot_load import (
    AotRunner,
    SignatureMismatch,
    load_runner,
    verify,
)
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.options import CompileOptions

CPU = torch.device("cpu")


def _target(module, owner, precision="fp32", device=CPU, mode=None):
    """The settings ``compile=True`` and ``build`` use for the region ``model``."""
    return RegionTarget.resolve(
        module,
        owner=owner,
        region="model",
        device=device,
        precision=precision,
        options=CompileOptions(mode=mode),
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The small FCN's core built ahead of time in a fresh cache root."""
    from earth2studio_compile import build, example_input
    from earth2studio_compile.tools import zoo

    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EARTH2STUDIO_COMPILE_CACHE", str(root))
        model = zoo.build("fcn", size="small")
        [result] = build(model, precision="fp32")
        x, coords = example_input(model)
        core = model.model
        args, kwargs = capture_calls(model, [core], x, coords)[id(core)]
        yield SimpleNamespace(
            root=root,
            model=model,
            core=core,
            args=(torch.randn_like(args[0]),),
            kwargs=kwargs,
            owner=f"{type(model).__module__}.{type(model).__qualname__}",
            result=result,
        )


def _load(b, module=None, args=None, root=None, precision="fp32"):
    return load_runner(
        _target(module if module is not None else b.core, b.owner, precision),
        args if args is not None else b.args,
        b.kwargs,
        root=root if root is not None else b.root,
    )


def _eager(core, args):
    with torch.no_grad():
        return core(*args)


def test_build_writes_an_artifact_that_matches_eager(built):
    assert built.result.status == "built", built.result
    assert built.result.path.parent == built.root / "aot"
    meta = json.loads((built.result.path / "meta.json").read_text())
    assert set(meta["sha256"]) == {"model.pt2"}
    runner = _load(built)
    assert isinstance(runner, AotRunner), runner
    out = runner(*built.args)
    ref = _eager(built.core, built.args)
    assert rel_l2(out, ref) <= 1e-5
    assert verify(out, ref, "fp32") is None
    # Each phase measured, none a remainder.
    for phase in ("key", "checksum", "aot_load", "bind", "first_run"):
        assert runner.phases[phase] >= 0.0, phase


def test_outputs_follow_weight_changes(built):
    runner = _load(built)
    assert isinstance(runner, AotRunner), runner
    before = runner(*built.args)
    weight = built.core.head.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.5)  # in place: the bound tensor itself
        changed = runner(*built.args)
        assert rel_l2(changed, before) > 1e-3
        assert rel_l2(changed, _eager(built.core, built.args)) <= 1e-5
        # A replaced parameter (not updated in place) is rebound, never stale.
        built.core.head.weight = torch.nn.Parameter(saved * 0.5)
        replaced = runner(*built.args)
        assert rel_l2(replaced, _eager(built.core, built.args)) <= 1e-5
    finally:
        built.core.head.weight = weight
        with torch.no_grad():
            weight.copy_(saved)
    assert rel_l2(runner(*built.args), before) == 0.0


def test_another_input_shape_is_refused_by_the_runner(built):
    runner = _load(built)
    assert isinstance(runner, AotRunner), runner
    with pytest.raises(SignatureMismatch):
        runner(torch.cat([built.args[0]] * 2))


def test_build_again_finds_the_artifact(built, monkeypatch):
    from earth2studio_compile import build

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    [again] = build(built.model, precision="fp32")
    assert again.status == "present"
    assert again.path == built.result.path


def test_cli_finds_the_artifact(built, monkeypatch, capsys):
    from earth2studio_compile.tools import build as cli

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    code = cli.main(
        ["fcn", "--size", "small", "--device", "cpu", "--precision", "fp32"]
    )
    assert code == 0
    assert f"present: {built.result.path}" in capsys.readouterr().out


def _patched_filter_forward(self, x):
    return x


@pytest.mark.parametrize(
    "change", ["structure", "source", "precision", "shape", "torch_version"]
)
def test_each_key_change_declines(built, monkeypatch, change):
    base, _ = _target(built.core, built.owner).aot_key(built.args, built.kwargs)
    module, args, precision = built.core, built.args, "fp32"
    if change == "structure":
        module = copy.deepcopy(built.core)
        module.register_buffer("extra", torch.zeros(1))
    elif change == "source":
        filter_cls = type(built.core.blocks[0].filter)
        monkeypatch.setattr(filter_cls, "forward", _patched_filter_forward)
    elif change == "precision":
        precision = "tf32"
    elif change == "shape":
        args = (torch.cat([built.args[0]] * 2),)
    else:
        monkeypatch.setattr(torch, "__version__", "9.9.9")
    key, _ = _target(module, built.owner, precision).aot_key(args, built.kwargs)
    assert key != base
    reason = _load(built, module=module, args=args, precision=precision)
    assert isinstance(reason, str)
    assert "no artifact" in reason


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
    reason = _load(built, root=tmp_path)
    assert isinstance(reason, str) and "checksum" in reason


class _Shifted(torch.nn.Module):
    """Another forward over the same parameters: a wrong graph for the FCN core."""

    def forward(self, x):
        return x + self.head.weight.sum()


@pytest.fixture(scope="module")
def planted(built, tmp_path_factory):
    """A cache root holding an artifact of another forward under the FCN core's key."""
    tmp_path = tmp_path_factory.mktemp("planted")
    other = copy.deepcopy(built.core)
    other.__class__ = type("Shifted", (_Shifted, type(built.core)), {})
    built_other = build_region(
        _target(other, built.owner), built.args, {}, root=tmp_path
    )
    # Planted under the FCN core's own key, with that key's fields.
    key, fields = _target(built.core, built.owner).aot_key(built.args, built.kwargs)
    planted = tmp_path / "plant" / "aot" / key
    shutil.copytree(built_other, planted)
    meta = json.loads((planted / "meta.json").read_text())
    meta["fields"] = fields
    (planted / "meta.json").write_text(json.dumps(meta))
    return tmp_path / "plant"


def test_an_artifact_with_another_answer_is_caught_by_verify(built, planted):
    runner = _load(built, root=planted)
    assert isinstance(runner, AotRunner), runner
    reason = verify(runner(*built.args), _eager(built.core, built.args), "fp32")
    assert reason is not None and "rel. L2" in reason


def _session_call(built, root, monkeypatch):
    """One call of the FCN core inside a fp32 session on ``root``: output, report."""
    from earth2studio_compile import CompileSession

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(root))
    with CompileSession(built.model, precision="fp32", probe=False) as session:
        with torch.no_grad():
            out = built.core(*built.args)
            again = built.core(*built.args)
    return out, again, session.report.regions[0]


def test_a_session_runs_the_artifact_when_its_key_matches(built, monkeypatch):
    out, again, region = _session_call(built, built.root, monkeypatch)
    assert region.status == "compiled" and region.executor == "aot", region
    assert region.graphs == 0  # torch.compile never ran
    for phase in ("key", "checksum", "aot_load", "bind", "first_run", "verify"):
        assert region.phases[phase] >= 0.0, phase
    assert "dynamo" not in region.phases
    # The phases are consecutive laps: together, the whole first call.
    assert region.first_call_seconds == pytest.approx(region.compile_seconds)
    ref = _eager(built.core, built.args)
    assert rel_l2(out, ref) < 1e-5 and rel_l2(again, ref) < 1e-5
    assert "ahead-of-time artifact" in region_summary(region)


def region_summary(region):
    from earth2studio_compile.report import CompileReport

    return CompileReport([region]).summary()


def test_a_wrong_artifact_takes_the_dynamo_path_with_one_warning(
    built, planted, monkeypatch
):
    from loguru import logger

    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    try:
        out, again, region = _session_call(built, planted, monkeypatch)
    finally:
        logger.remove(sink)
    assert region.status == "compiled" and region.executor == "dynamo", region
    assert any("failed verification" in d for d in region.declined), region.declined
    # The artifact's load, run and verification are part of the first call.
    assert region.phases["declined"] > 0
    assert region.first_call_seconds == pytest.approx(region.compile_seconds)
    assert sum("another answer than eager" in w for w in warnings) == 1, warnings
    ref = _eager(built.core, built.args)
    assert rel_l2(out, ref) < 1e-5 and rel_l2(again, ref) < 1e-5
    assert "aot not used" in region_summary(region)


def test_inputs_the_artifact_was_not_built_for_go_to_dynamo_not_eager(
    built, monkeypatch, logs
):
    """A later call with another batch size: the artifact declines it before
    running, and Dynamo compiles it (a recompile) instead of the region turning
    eager for good with a WARNING."""
    from conftest import messages

    from earth2studio_compile import CompileSession

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    wider = tuple(
        torch.cat([a, a]) if isinstance(a, torch.Tensor) else a for a in built.args
    )
    with CompileSession(built.model, precision="fp32", probe=False) as session:
        with torch.no_grad():
            first = built.core(*built.args)
            out = built.core(*wider)
            again = built.core(*wider)
    [region] = session.report.regions
    assert region.status == "compiled" and region.executor == "dynamo", region
    assert region.recompiles == 1 and region.eager_calls == 0, region
    assert any("built for other inputs" in d for d in region.declined), region
    assert not messages(logs, "WARNING")
    assert rel_l2(first, _eager(built.core, built.args)) < 1e-5
    ref = _eager(built.core, wider)
    assert rel_l2(out, ref) < 1e-5 and rel_l2(again, ref) < 1e-5


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
        args, kwargs = capture_calls(model, [core], x, coords)[id(core)]
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


@pytest.mark.gpu
def test_cuda_graph_runner_keeps_held_outputs(tmp_path):
    """On CUDA the runner captures its own graph at call 2 and clones outputs."""
    from earth2studio_compile import example_input
    from earth2studio_compile.precision import scope
    from earth2studio_compile.tools import zoo

    device = torch.device("cuda")
    model = zoo.build("fcn", size="small").to(device)
    core = model.model
    x, coords = example_input(model)
    args, kwargs = capture_calls(model, [core], x, coords)[id(core)]
    owner = f"{type(model).__module__}.{type(model).__qualname__}"
    target = _target(core, owner, "fp32", device, mode="reduce-overhead")
    build_region(target, args, kwargs, root=tmp_path)
    runner = load_runner(target, args, kwargs, root=tmp_path)
    assert isinstance(runner, AotRunner), runner
    assert runner.cudagraphs
    inputs = [torch.randn_like(args[0]) for _ in range(3)]
    outs = [runner(i) for i in inputs]
    assert runner.phases["cudagraph_capture"] >= 0.0
    for i, out in zip(inputs, outs):
        with torch.no_grad(), scope("fp32", device):
            assert verify(out, core(i), "fp32") is None


def test_a_later_session_runs_the_loaded_artifact_again(built, monkeypatch):
    """The loaded artifact is kept for the next session in the process: nothing
    is loaded or verified again."""
    _session_call(built, built.root, monkeypatch)
    out, again, region = _session_call(built, built.root, monkeypatch)
    assert region.status == "compiled" and region.executor == "aot", region
    assert region.reused is not None and region.compile_seconds == 0.0, region
    ref = _eager(built.core, built.args)
    assert rel_l2(out, ref) < 1e-5 and rel_l2(again, ref) < 1e-5
