"""Bad input is a clear error before any model work."""

from __future__ import annotations

import pytest
import torch
from conftest import eager_backend

from earth2studio_compile import CompileOptions, CompileSession, ModelSpec
from earth2studio_compile.options import CompilePolicy


def test_unknown_mode_names_the_fix():
    with pytest.raises(ValueError, match="reduce-overhead") as err:
        CompileOptions(mode="reduce_overhead")
    assert "Did you mean 'reduce-overhead'" in str(err.value)


def test_mode_and_options_are_exclusive():
    with pytest.raises(ValueError, match="either mode or options"):
        CompileOptions(mode="default", options={"triton.cudagraphs": True})


def test_unknown_inductor_option():
    with pytest.raises(ValueError, match="Did you mean 'triton.cudagraphs'"):
        CompileOptions(options={"triton.cudagraph": True})


def test_mode_needs_inductor():
    with pytest.raises(ValueError, match="only applies to backend='inductor'"):
        CompileOptions(mode="default", backend="eager")


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"mode": 3}, "mode must be a str"),
        ({"fullgraph": "yes"}, "fullgraph must be a bool"),
        ({"dynamic": 1}, "dynamic must be a bool or None"),
        ({"backend": 42}, "backend must be a backend name"),
        ({"options": ["x"]}, "options must be a dict"),
    ],
)
def test_wrong_types(kwargs, pattern):
    with pytest.raises(TypeError, match=pattern):
        CompileOptions(**kwargs)


def test_unknown_backend():
    with pytest.raises(ValueError, match="Unknown torch.compile backend 'inductr'"):
        CompileOptions(backend="inductr")


def policy(
    options: CompileOptions,
    device: torch.device,
    table_cudagraphs: bool = True,
    table_options=None,
) -> CompilePolicy:
    table = ModelSpec(
        regions=("core",), cudagraphs=table_cudagraphs, inductor_options=table_options
    )
    return CompilePolicy.resolve(options, device, table)


def test_torch_compile_gets_exactly_the_policys_torch_kwargs(monkeypatch):
    class Breaking(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.full((2,), 2.0))

        def forward(self, x):
            x = x + 1
            torch._dynamo.graph_break()
            return x * self.scale

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.core = Breaking()

    seen = []
    original = CompilePolicy.torch_kwargs

    def strict(self):
        # What production passes is what this returns: fullgraph turns the
        # graph break into a compile failure, hence a fallback.
        kwargs = {**original(self), "fullgraph": True}
        seen.append(kwargs)
        return kwargs

    monkeypatch.setattr(CompilePolicy, "torch_kwargs", strict)
    model = Holder()
    with CompileSession(model, backend=eager_backend) as session, torch.no_grad():
        out = model.core(torch.ones(2))
    torch.testing.assert_close(out, torch.full((2,), 4.0))
    assert len(seen) == 1 and seen[0]["backend"] is eager_backend
    assert session.report.regions[0].status == "eager"


def test_mode_choice_per_device():
    opts = CompileOptions()
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert policy(opts, cuda).mode == "reduce-overhead"
    assert policy(opts, cuda).cudagraphs
    assert policy(opts, cpu).mode is None
    assert not policy(opts, cpu).cudagraphs
    assert "mode" not in policy(opts, cpu).torch_kwargs()
    no_graphs = CompileOptions(mode="max-autotune-no-cudagraphs")
    assert policy(no_graphs, cuda).cudagraphs is False
    assert policy(CompileOptions(options={"triton.cudagraphs": True}), cuda).cudagraphs


def test_table_can_turn_default_cuda_graphs_off_but_not_the_users_mode():
    cuda = torch.device("cuda")
    off = policy(CompileOptions(), cuda, table_cudagraphs=False)
    assert off.mode is None and not off.cudagraphs
    assert off.label == "inductor/default"
    chosen = policy(
        CompileOptions(mode="reduce-overhead"), cuda, table_cudagraphs=False
    )
    assert chosen.cudagraphs


def test_a_region_keeping_tensor_state_gets_no_cuda_graphs_whatever_was_asked():
    cuda = torch.device("cuda")
    for options, label in [
        (CompileOptions(), "inductor/default"),
        (CompileOptions(mode="reduce-overhead"), "inductor/default"),
        (CompileOptions(mode="max-autotune"), "inductor/max-autotune-no-cudagraphs"),
    ]:
        chosen = CompilePolicy.resolve(options, cuda, without_cudagraphs=True)
        assert not chosen.cudagraphs and chosen.mode != "reduce-overhead", options
        assert not (chosen.options or {}).get("triton.cudagraphs"), chosen.options
        assert chosen.label.split("+")[0] == label
    asked = CompileOptions(options={"triton.cudagraphs": True, "max_autotune": False})
    chosen = CompilePolicy.resolve(asked, cuda, without_cudagraphs=True)
    assert not chosen.cudagraphs and chosen.options == {
        "triton.cudagraphs": False,
        "max_autotune": False,
    }


def test_session_checks_options_and_regions():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError):
        CompileSession(model, mode="fast")
    with pytest.raises(TypeError, match="single model"):
        CompileSession(model, torch.nn.Linear(2, 2), regions=("weight",))
    with pytest.raises(TypeError, match="at least one model"):
        CompileSession()


@pytest.mark.parametrize("flag", [1, "True", None, 0.0])
@pytest.mark.parametrize("name", ["deterministic", "diagnostic", "ensemble"])
def test_compile_flag_must_be_bool(name, flag):
    from earth2studio_compile import run

    class Untouchable:
        def __getattr__(self, item):
            raise AssertionError("the workflow touched the model before validating")

    workflow = getattr(run, name)
    n = len(__import__("inspect").signature(workflow).parameters)
    args = [Untouchable()] * (n - 1)
    with pytest.raises(TypeError, match="compile must be True or False"):
        workflow(*args, compile=flag)


def test_table_options_apply_only_when_the_user_chose_nothing():
    cuda = torch.device("cuda")
    table = {"layout_optimization": False}
    auto = policy(CompileOptions(), cuda, table_options=table)
    # CUDA graphs and the table's options together: the mode's preset is merged in,
    # since torch.compile takes a mode or options, not both
    assert auto.torch_kwargs()["options"] == {"triton.cudagraphs": True, **table}
    assert "mode" not in auto.torch_kwargs()
    assert auto.cudagraphs
    assert auto.label == "inductor/reduce-overhead+layout_optimization=False"
    assert "layout_optimization=False" in auto.cache_text
    mine = policy(CompileOptions(mode="default"), cuda, table_options=table)
    assert mine.torch_kwargs()["mode"] == "default"
    assert "options" not in mine.torch_kwargs()
    calls = []
    picked = policy(
        CompileOptions(), cuda, table_options=lambda d: calls.append(d.type) or {"a": 1}
    )
    assert picked.options == {"triton.cudagraphs": True, "a": 1} and calls == ["cuda"]


def test_autotune_modes_are_quiet_and_skip_the_failing_cpu_fusion(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED", raising=False)
    on_cpu = policy(CompileOptions(mode="max-autotune-no-cudagraphs"), cpu)
    kwargs = on_cpu.torch_kwargs()
    # torch.compile takes a mode or options: the mode's own settings are carried over
    assert "mode" not in kwargs and kwargs["options"]["max_autotune"] is True
    assert kwargs["options"]["epilogue_fusion"] is False
    assert kwargs["options"]["autotune_num_choices_displayed"] == 0
    assert on_cpu.label == ("inductor/max-autotune-no-cudagraphs+epilogue_fusion=False")
    on_cuda = policy(CompileOptions(mode="max-autotune"), cuda)
    assert "epilogue_fusion" not in on_cuda.options
    assert on_cuda.options["autotune_num_choices_displayed"] == 0
    assert on_cuda.cudagraphs and on_cuda.label == "inductor/max-autotune"
    # The user's own choices win; modes that do not autotune are passed as they are.
    mine = {"max_autotune": True, "epilogue_fusion": True}
    assert policy(CompileOptions(options=mine), cpu).options["epilogue_fusion"]
    assert policy(CompileOptions(mode="default"), cpu).torch_kwargs()["mode"] == (
        "default"
    )
    monkeypatch.setenv("TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED", "5")
    shown = policy(CompileOptions(mode="max-autotune"), cpu).options
    assert "autotune_num_choices_displayed" not in shown


_MAX_AUTOTUNE_FCN_CORE = """
import json, torch
from physicsnemo.models.afno import AFNO
from earth2studio_compile import CompileSession

torch.manual_seed(0)
core = AFNO(inp_shape=[16, 32], in_channels=26, out_channels=26, patch_size=[4, 4],
            embed_dim=32, depth=2, num_blocks=4)
x = torch.randn(1, 26, 16, 32)
with torch.inference_mode():
    want = core(x)
    with CompileSession(core, mode="max-autotune-no-cudagraphs", cache=False) as s:
        got = [core(x), core(x)]
r = s.report.regions[0]
err = max(float((g - want).abs().max() / want.abs().max()) for g in got)
print(json.dumps({"status": r.status, "reason": r.reason, "mode": r.mode, "err": err}))
"""


def test_max_autotune_compiles_the_fcn_core_on_cpu_without_printing_tables(tmp_path):
    # The README's power-user mode on FCN's AFNO core (the demo's small size): on
    # torch 2.14.1 it fell back with "InductorError ... AssertionError: buf15" and
    # printed Inductor's AUTOTUNE tables. A fresh process with an empty Inductor
    # cache, so autotuning really runs (a failed compile can also leave Dynamo
    # unusable for the rest of a process).
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    for name in (
        "TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED",
        "TORCHINDUCTOR_MAX_AUTOTUNE_REPORT_CHOICES_STATS",
    ):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-c", _MAX_AUTOTUNE_FCN_CORE],
        cwd=Path(__file__).parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == "compiled", out["reason"]
    assert out["err"] < 1e-5
    assert "AUTOTUNE" not in proc.stdout + proc.stderr
    assert "Autotune Choices Stats" not in proc.stdout + proc.stderr
