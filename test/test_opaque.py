"""Opaque submodules: run eagerly as one operator each, inside one compiled graph."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_unchanged, messages, snapshot

from earth2studio_compile import MODEL_TABLE, CompileSession, register_model
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.models import sfno_inductor_options
from earth2studio_compile.opaque import find_opaque
from earth2studio_compile.tools import zoo


class Recorder:
    """A backend that keeps every FX graph Dynamo hands it and compiles nothing."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.__name__ = "recorder"

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def opaque_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if "earth2studio_compile.opaque" in str(n.target)]


def tensor_dtypes(gm: torch.fx.GraphModule) -> set[torch.dtype]:
    values = [n.meta.get("example_value") for n in gm.graph.nodes]
    return {v.dtype for v in values if isinstance(v, torch.Tensor)}


def test_spectral_convolutions_become_opaque_nodes_of_one_graph(logs):
    model = zoo.build("sfno")
    before = snapshot(model)
    layers = len(model.model.sfno.blocks)
    x = torch.randn(1, 4, 16, 32)
    with torch.no_grad():
        expected = model.model(x)
    recorder = Recorder()
    with CompileSession(model, backend=recorder) as session:
        # the table's cudagraphs=False and Inductor options reach the region
        (region,) = session._open
        assert region.spec.cudagraphs is False
        assert region.spec.inductor_options is sfno_inductor_options
        with torch.no_grad():
            out = model.model(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert_unchanged(model, before)
    region = session.report.regions[0]
    assert (region.region, region.status) == ("model", "compiled")
    assert (region.graphs, region.graph_breaks, region.opaque) == (1, 0, layers)
    (gm,) = recorder.graphs
    assert len(opaque_nodes(gm)) == layers
    # Complex values are what Inductor cannot compile on CUDA: none may reach it.
    dtypes = tensor_dtypes(gm)
    assert torch.float32 in dtypes
    assert not any(d.is_complex for d in dtypes), dtypes
    assert "opaque submodule(s)" in messages(logs, "INFO")[-1]


def test_opaque_sfno_under_inductor_matches_eager():
    model = zoo.build("sfno")
    x = torch.randn(1, 4, 16, 32)
    with torch.no_grad():
        expected = [model.model(x)]
        expected.append(model.model(expected[0]))
    with CompileSession(model) as session:
        with torch.no_grad():
            first = model.model(x)
            second = model.model(first)
    assert session.report.compiled
    assert rel_l2(first, expected[0]) <= 1e-5
    assert rel_l2(second, expected[1]) <= 1e-5


class Island(torch.nn.Module):
    """Returns a new tensor and its own input: the input must come back as itself."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sin(x) * self.scale, x


class KwIsland(Island):
    pass


class Net(torch.nn.Module):
    def __init__(self, island: torch.nn.Module) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.island = island

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, skip = (
            self.island(self.lin(x))
            if not isinstance(self.island, KwIsland)
            else self.island(x=self.lin(x))
        )
        return y + skip


class Holder(torch.nn.Module):
    def __init__(self, island: torch.nn.Module) -> None:
        super().__init__()
        self.net = Net(island)


@pytest.fixture
def holder_spec():
    key = f"{Holder.__module__}.{Holder.__qualname__}"
    register_model(Holder, regions=("net",), opaque=("Island", "KwIsland"))
    yield
    MODEL_TABLE.pop(key, None)


def test_output_that_is_the_input_comes_back_as_the_input(holder_spec, monkeypatch):
    devices = []
    forward = Island.forward

    def recording(self, x):
        devices.append(x.device.type)
        return forward(self, x)

    monkeypatch.setattr(Island, "forward", recording)
    model = Holder(Island())
    before = snapshot(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model.net(x)
    recorder = Recorder()
    with CompileSession(model, backend=recorder) as session:
        with torch.no_grad():
            out = model.net(x)
    torch.testing.assert_close(out, expected)
    assert session.report.regions[0].status == "compiled"
    (gm,) = recorder.graphs
    (node,) = opaque_nodes(gm)
    # only the new tensor crosses the operator; the skip is the traced input itself
    assert len(node.meta["example_value"]) == 1
    # Dynamo's structure query and the fake kernel share one meta run
    assert devices.count("meta") == 1
    assert_unchanged(model, before)


def test_keyword_call_falls_back_naming_the_fix(holder_spec, logs):
    model = Holder(KwIsland())
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model.net(x)
    with CompileSession(model, backend=Recorder()) as session:
        with torch.no_grad():
            out = model.net(x)
    torch.testing.assert_close(out, expected)  # the call was re-run eagerly
    assert session.report.regions[0].status == "eager"
    (warning,) = messages(logs, "WARNING")
    assert "opaque submodule takes tensors only" in warning
    assert "exclude" in warning


def test_an_instance_forward_of_the_users_survives(holder_spec):
    island = Island()
    own = island.forward
    island.forward = lambda x: own(x)  # e.g. a user's instance-level patch
    patched = island.__dict__["forward"]
    model = Holder(island)
    with CompileSession(model, backend=Recorder()):
        assert model.net.island.__dict__["forward"] is not patched
        with torch.no_grad():
            model.net(torch.randn(2, 8))
    assert model.net.island.__dict__["forward"] is patched


def test_find_opaque_takes_the_outermost_match():
    model = zoo.build("sfno").model
    convs = find_opaque(model, ("SpectralConvS2",))
    assert [p for p, _ in convs] == [
        f"sfno.blocks.{i}.global_conv" for i in range(len(model.sfno.blocks))
    ]
    both = [p for p, _ in find_opaque(model, ("SpectralConvS2", "RealSHT"))]
    assert set(p for p, _ in convs) <= set(both)
    # the SHTs inside each convolution are covered by it, not listed again
    assert not [p for p in both if any(p.startswith(c + ".") for c, _ in convs)]
    assert find_opaque(model, ()) == []


def test_opaque_must_be_a_tuple():
    from earth2studio_compile import ModelSpec

    with pytest.raises(TypeError, match=r"opaque=\('RealSHT',\)"):
        ModelSpec(regions=("model",), opaque="RealSHT")


def test_sfno_mlps_run_as_matmuls_only_where_precision_is_kept(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    torch.set_float32_matmul_precision("highest")
    # PyTorch's defaults: TF32 convolutions, fp32 matmuls. As matmuls the 1x1
    # convolutions would lose TF32 (slower) and change the numbers.
    assert "conv_1x1_as_mm" not in sfno_inductor_options(cuda)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert sfno_inductor_options(cuda)["conv_1x1_as_mm"] is True
    assert "conv_1x1_as_mm" not in sfno_inductor_options(torch.device("cpu"))


def test_sfno_options_of_a_precision_are_those_of_its_flags(monkeypatch):
    """A region in a precision runs under the TF32 flags it pins, whatever the
    flags when its policy is resolved: tf32 pins both on, fp32 both off, so the
    1x1 convolutions run as matmuls in either; None reads the flags as they are."""
    from earth2studio_compile.models import TORCH_HARMONICS_SFNO
    from earth2studio_compile.options import CompileOptions, CompilePolicy

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    torch.set_float32_matmul_precision("highest")  # PyTorch's defaults
    for precision in ("tf32", "fp32"):
        assert sfno_inductor_options(cuda, precision)["conv_1x1_as_mm"] is True
        policy = CompilePolicy.resolve(
            CompileOptions(), cuda, TORCH_HARMONICS_SFNO, precision=precision
        )
        assert policy.options is not None and policy.options["conv_1x1_as_mm"]
    assert "conv_1x1_as_mm" not in sfno_inductor_options(cuda, None)
    assert "conv_1x1_as_mm" not in sfno_inductor_options(torch.device("cpu"), "tf32")
    # Under bf16 cuDNN's 1x1 convolutions beat matrix multiplies (FCN3's MLP).
    assert sfno_inductor_options(cuda, "bf16") == {"layout_optimization": False}


def test_a_table_function_of_the_device_alone_still_serves():
    """A user's register_model entry written for the device alone keeps working."""
    from earth2studio_compile.models import ModelSpec
    from earth2studio_compile.options import CompileOptions, CompilePolicy

    seen: list[tuple] = []

    def of_device(device):
        seen.append((device,))
        return {"epilogue_fusion": False}

    def of_both(device, precision):
        seen.append((device, precision))
        return {"epilogue_fusion": False}

    cpu = torch.device("cpu")
    for function in (of_device, of_both):
        table = ModelSpec(regions=("core",), inductor_options=function)
        policy = CompilePolicy.resolve(CompileOptions(), cpu, table, precision="tf32")
        assert policy.options == {"epilogue_fusion": False}
    assert seen == [(cpu,), (cpu, "tf32")]


def test_operator_handles_do_not_depend_on_session_history():
    # Handles are baked into the compiled graph (and Inductor's cache key): the same
    # model must get the same graph whatever sessions came before it.
    def handles() -> list[int]:
        model = zoo.build("sfno")
        with CompileSession(model, backend=Recorder()) as session:
            return [op.handle for region in session._open for op in region.hooks.opaque]

    first = handles()
    zoo.build("sfno")  # unrelated work in between
    assert handles() == first and len(set(first)) == len(first)
