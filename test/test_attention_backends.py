"""A table entry's SDPA backends: compiled code traced with them, eager left alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from aot_helpers import tiny_target
from tiny_cores import SdpaCore, WindowAttentionCore
from torch._dynamo.backends.common import aot_autograd

from earth2studio_compile import (
    MODEL_TABLE,
    CompileSession,
    ModelSpec,
    options,
    register_model,
)
from earth2studio_compile.options import CompileOptions, CompilePolicy

CPU = torch.device("cpu")
# What SDPA lowers to on the CPU when PyTorch chooses (its fused kernel).
FUSED = "aten._scaled_dot_product_flash_attention_for_cpu.default"


class Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = SdpaCore()


@pytest.fixture
def on_math():
    key = f"{Holder.__module__}.{Holder.__qualname__}"
    register_model(Holder, regions=("net",), attention_backends=("math",))
    yield
    MODEL_TABLE.pop(key, None)


def traced_ops(model: torch.nn.Module, x: torch.Tensor) -> list[set[str]]:
    """The ATen ops of each graph a session compiles for ``model.net``."""
    graphs: list[set[str]] = []

    def record(gm, example_inputs):
        graphs.append(
            {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        )
        return gm

    with CompileSession(model, backend=aot_autograd(fw_compiler=record)):
        with torch.no_grad():
            model.net(x)
            model.net(x)
    return graphs


def test_a_region_is_traced_on_the_tables_backend_and_the_flags_come_back(on_math):
    x = torch.randn(2, 4, 8, 16)
    graphs = traced_ops(Holder(), x)
    assert len(graphs) == 1
    assert FUSED not in graphs[0] and "aten.bmm.default" in graphs[0]
    # Outside the compiled calls, PyTorch's own choice again.
    assert torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.mem_efficient_sdp_enabled()


def test_without_an_entry_the_region_keeps_pytorchs_choice():
    graphs = traced_ops(Holder(), torch.randn(2, 4, 8, 16))
    assert len(graphs) == 1 and FUSED in graphs[0]


def test_the_backends_are_in_the_label_and_every_key():
    plain = ModelSpec(regions=("core",))
    math = ModelSpec(regions=("core",), attention_backends=("MATH",))
    assert math.attention_backends == ("math",)
    a = CompilePolicy.resolve(CompileOptions(), CPU, plain)
    b = CompilePolicy.resolve(CompileOptions(), CPU, math)
    assert b.attention == ("math",) and a.attention == ()
    assert b.label == "inductor/default+attention=math"
    assert a.cache_text != b.cache_text
    # The on-disk artifact's factor too, which is built from its own fields.
    core = SdpaCore()
    targets = [
        dataclasses.replace(tiny_target(core), policy=policy) for policy in (a, b)
    ]
    fa, fb = (t.factors() for t in targets)
    assert fa["aot"] != fb["aot"] and "attention=math" in fb["aot"]


def test_a_function_of_device_and_precision_is_asked_at_resolve():
    asked = []

    def backends(device, precision):
        asked.append((device.type, precision))
        return ("math",) if precision == "tf32" else ()

    table = ModelSpec(regions=("core",), attention_backends=backends)
    tf32 = CompilePolicy.resolve(CompileOptions(), CPU, table, precision="tf32")
    fp32 = CompilePolicy.resolve(CompileOptions(), CPU, table, precision="fp32")
    assert (tf32.attention, fp32.attention) == (("math",), ())
    assert asked == [("cpu", "tf32"), ("cpu", "fp32")]


@pytest.mark.parametrize("names", [("maths",), "math"])
def test_a_name_that_is_no_backend_is_a_clear_error(names):
    with pytest.raises(ValueError, match="attention_backends") as err:
        ModelSpec(regions=("core",), attention_backends=names)
    assert "math" in str(err.value)


def test_a_table_function_giving_no_backend_is_a_clear_error():
    table = ModelSpec(regions=("core",), attention_backends=lambda d, p: ("fast",))
    with pytest.raises(ValueError, match="ModelSpec.attention_backends names 'fast'"):
        CompilePolicy.resolve(CompileOptions(), CPU, table)


class WindowHolder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = WindowAttentionCore()


@pytest.fixture
def on_flex():
    key = f"{WindowHolder.__module__}.{WindowHolder.__qualname__}"
    register_model(WindowHolder, regions=("net",), attention_backends=("flex", "math"))
    yield
    MODEL_TABLE.pop(key, None)


def assert_compiled_as_eager(model, x, expected, attention: str, tol: float) -> None:
    """``model.net(x)`` in a session: compiled, traced with ``attention``, eager's
    ``expected`` within ``tol``, no torch function mode left behind."""
    with CompileSession(model) as session, torch.no_grad():
        out = model.net(x)
    [region] = session.report.regions
    assert region.status == "compiled", region
    assert region.mode.endswith(f"+attention={attention}"), region
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    assert torch._C._len_torch_function_stack() == 0


def test_on_the_cpu_the_flex_choice_leaves_sdpa_to_the_backends_beside_it(on_flex):
    """Regression: Inductor's CPU FlexAttention template computed this region
    into NaNs on an AVX2 CPU (the CI machine, torch 2.11, 2026-12-01), so the
    session fell back to eager there: "flex" applies on CUDA only."""
    model = WindowHolder().eval()
    x = torch.randn(3, 24, 32)
    with torch.no_grad():
        expected = model.net(x)
    graphs = traced_ops(model, x)
    assert len(graphs) == 1 and not any("flex_attention" in op for op in graphs[0])
    assert FUSED not in graphs[0] and "aten.bmm.default" in graphs[0]
    assert_compiled_as_eager(model, x, expected, "math", tol=1e-5)


@pytest.mark.gpu
def test_the_flex_choice_compiles_flexattention_on_cuda_and_matches_eager(on_flex):
    model = WindowHolder().eval().cuda()
    x = torch.randn(3, 24, 32, device="cuda")
    with torch.no_grad():
        expected = model.net(x)
    assert_compiled_as_eager(model, x, expected, "flex|math", tol=1e-4)


def test_flex_is_chosen_on_cuda_and_the_backends_beside_it_elsewhere():
    table = ModelSpec(regions=("net",), attention_backends=("flex", "math"))
    cuda = CompilePolicy.resolve(CompileOptions(), torch.device("cuda"), table)
    cpu = CompilePolicy.resolve(CompileOptions(), CPU, table)
    assert (cuda.attention, cpu.attention) == (("flex", "math"), ("math",))
    assert "attention=math" in cpu.cache_text and "flex" not in cpu.cache_text
    alone = ModelSpec(regions=("net",), attention_backends=("flex",))
    assert CompilePolicy.resolve(CompileOptions(), CPU, alone).attention == ()


def test_a_region_with_the_flex_choice_gets_no_artifact(monkeypatch, tmp_path):
    """AOTInductor cannot compile FlexAttention (pytorch/pytorch#140400): the
    executors that serve artifacts decline the region, so it takes the Dynamo
    path without a build being tried."""
    from earth2studio_compile.artifacts import background
    from earth2studio_compile.executors import (
        AotExecutor,
        BackgroundExecutor,
        Target,
    )
    from earth2studio_compile.report import RegionReport

    monkeypatch.setenv(background.ENV, "on")
    # The choice as on CUDA, where it applies: the build is not tried here.
    monkeypatch.setattr(options, "FLEX_DEVICES", frozenset({"cpu", "cuda"}))
    target = Target.resolve(
        WindowAttentionCore(),
        owner=f"{WindowHolder.__module__}.WindowHolder",
        region="net",
        device=CPU,
        precision=None,
        table=ModelSpec(regions=("net",), attention_backends=("flex",)),
        report=RegionReport("WindowHolder", "net"),
        artifacts=tmp_path / "artifacts",
    )
    assert target.no_artifact is not None and "FlexAttention" in target.no_artifact
    for executor in (AotExecutor, BackgroundExecutor):
        assert executor.build(target) == target.no_artifact
    # Without the choice, both would serve it.
    plain = dataclasses.replace(
        target, policy=CompilePolicy.resolve(CompileOptions(), CPU, None)
    )
    assert plain.no_artifact is None
    assert isinstance(AotExecutor.build(plain), AotExecutor)
    assert isinstance(BackgroundExecutor.build(plain), BackgroundExecutor)
