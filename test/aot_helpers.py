"""Shared by the ahead-of-time tests (artifacts/test_aot_*.py,
executors/test_executors_aot.py, test_aot.py, test_first_call.py,
tools/test_build.py, tools/zoo/test_aifs.py): the small FCN core built once, an
artifact of another forward planted under its key, the calls they make, a model
built and run from its artifact, and a stand-in for the ahead-of-time executor.

One real AOTInductor build per fixture (each 25-90 s on 2 cores): the fixtures are
session-scoped, so the files share them (conftest.py makes them visible).
"""

from __future__ import annotations

import copy
import json
import shutil
import threading
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
import torch

from earth2studio_compile.aot import capture_calls
from earth2studio_compile.artifacts.aot_build import build_region
from earth2studio_compile.artifacts.aot_load import (
    load_runner,
)
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.options import CompileOptions

CPU = torch.device("cpu")


class Seen(NamedTuple):
    """A first call the stand-in ran: on which thread, its first input (a copy),
    and whether in inference mode."""

    thread: str
    input: torch.Tensor
    inference: bool


def aot_stand_in(monkeypatch, seen: list, runner: Any = None) -> None:
    """Make the ahead-of-time executor an eager one that says it runs an artifact:
    each first call it runs is appended to ``seen`` (:class:`Seen`); with
    ``runner`` (the artifact's ``path`` and ``device``), it holds that runner as
    the real executor holds its artifact's."""
    from earth2studio_compile import executors, first_call_ahead

    class Artifact(executors.EagerExecutor):
        name = "aot"

        def first_call(self, args, kwargs, laps):
            thread = threading.current_thread().name
            inference = torch.is_inference_mode_enabled()
            seen.append(Seen(thread, args[0].clone(), inference))
            if runner is not None:
                self.runner = runner
            return super().first_call(args, kwargs, laps)

    def build(target, made_up=False):
        return Artifact(target.module)

    monkeypatch.setattr(executors, "CANDIDATES", [build])
    monkeypatch.setattr(
        first_call_ahead, "AotExecutor", type("Aot", (), {"build": build})
    )


def aot_target(module, owner, precision="fp32", device=CPU, mode=None):
    """The settings ``compile=True`` and ``build`` use for the region ``model``."""
    return RegionTarget.resolve(
        module,
        owner=owner,
        region="model",
        device=device,
        precision=precision,
        options=CompileOptions(mode=mode),
    )


def tiny_target(module, unused=()) -> RegionTarget:
    """A tiny core's (tiny_cores.py) region ``core`` on the CPU, PyTorch's flags;
    ``unused``: the parameters of its forward the table would say it never reads."""
    return RegionTarget.resolve(
        module,
        owner=f"tiny_cores.{type(module).__name__}",
        region="core",
        device=CPU,
        precision=None,
        unused_arguments=unused,
    )


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The small FCN's core built ahead of time in a fresh cache root."""
    from earth2studio_compile import build, example_input
    from earth2studio_compile.tools import zoo

    root = tmp_path_factory.mktemp("cache")
    # The cache is rooted there for the build only: the fixture lives for the
    # session, and the tests that need the root name it.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EARTH2STUDIO_COMPILE_CACHE", str(root))
        model = zoo.build("fcn", size="small")
        [result] = build(model, precision="fp32")
        x, coords = example_input(model)
        core = model.model
        args, kwargs, *_ = capture_calls(model, [core], x, coords)[id(core)]
    return SimpleNamespace(
        root=root,
        model=model,
        core=core,
        args=(torch.randn_like(args[0]),),
        kwargs=kwargs,
        owner=f"{type(model).__module__}.{type(model).__qualname__}",
        result=result,
    )


def load(b, module=None, args=None, root=None, precision="fp32"):
    return load_runner(
        aot_target(module if module is not None else b.core, b.owner, precision),
        args if args is not None else b.args,
        b.kwargs,
        root=root if root is not None else b.root,
    )


def eager(core, args):
    with torch.no_grad():
        return core(*args)


class _Shifted(torch.nn.Module):
    """Another forward over the same parameters: a wrong graph for the FCN core."""

    def forward(self, x):
        return x + self.head.weight.sum()


@pytest.fixture(scope="session")
def planted(built, tmp_path_factory):
    """A cache root holding an artifact of another forward under the FCN core's key."""
    tmp_path = tmp_path_factory.mktemp("planted")
    other = copy.deepcopy(built.core)
    other.__class__ = type("Shifted", (_Shifted, type(built.core)), {})
    built_other = build_region(
        aot_target(other, built.owner), built.args, {}, root=tmp_path
    )
    # Planted under the FCN core's own key, with that key's fields.
    key, fields = aot_target(built.core, built.owner).aot_key(built.args, built.kwargs)
    planted = tmp_path / "plant" / "aot" / key
    shutil.copytree(built_other, planted)
    meta = json.loads((planted / "meta.json").read_text())
    meta["fields"] = fields
    (planted / "meta.json").write_text(json.dumps(meta))
    return tmp_path / "plant"


def session_call(built, root, monkeypatch):
    """One call of the FCN core inside a fp32 session on ``root``: output, report."""
    from earth2studio_compile import CompileSession

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(root))
    with CompileSession(built.model, precision="fp32", probe=False) as session:
        with torch.no_grad():
            out = built.core(*built.args)
            again = built.core(*built.args)
    return out, again, session.report.regions[0]


def unverified(root):
    """Forget which weights the artifacts under ``root`` were verified with: their
    next first call verifies against eager (the suite's tests share ``built``)."""
    from earth2studio_compile.artifacts import verified

    for found in root.glob(f"**/{verified.FILE}"):
        found.unlink()


def another_process(b):
    """``b`` with another instance of its model holding the same weights, for which
    this process keeps no compiled code, as in a new process."""
    from earth2studio_compile.tools import zoo

    model = zoo.build("fcn", size="small")
    model.model.load_state_dict(b.core.state_dict())
    return SimpleNamespace(**{**vars(b), "model": model, "core": model.model})


def region_summary(region):
    from earth2studio_compile.report import CompileReport

    return CompileReport([region]).summary()


@pytest.fixture(scope="session")
def conv_built(tmp_path_factory):
    """A small conv net (tiny_cores.ConvCore) built ahead of time on the CPU in a
    fresh cache root: an artifact with recorded convolutions."""
    from tiny_cores import ConvCore

    root = tmp_path_factory.mktemp("conv")
    torch.manual_seed(0)
    core, x = ConvCore().eval(), torch.randn(2, 3, 8, 8)
    path = build_region(tiny_target(core), (x,), {}, root=root)
    return SimpleNamespace(root=root, core=core, args=(x,), path=path)


def built_then_run_from_its_artifact(model: Any, calls: int = 1) -> None:
    """``build()`` the model's one region into the test's cache (the test sets
    ``EARTH2STUDIO_COMPILE_CACHE``, background builds off), check it was built and
    verified, then run it as a later process's first ``calls`` calls: from the
    artifact, with eager's answer (within bf16's rounding: the models here
    autocast)."""
    from earth2studio_compile import CompileSession, build, example_input, resident

    [result] = build(model)
    assert result.status == "built" and result.verified, result
    resident.release()  # no compiled code kept in this process
    x, coords = example_input(model)
    with torch.no_grad():
        eager, _ = model(x, coords)
    with CompileSession(model) as session:
        with torch.no_grad():
            outs = [model(x, coords)[0] for _ in range(calls)]
    [region] = session.report.regions
    assert region.executor == "aot", session.report.summary()
    for out in outs:
        assert ((out - eager).norm() / eager.norm()).item() < 1e-2


def autocasting_model() -> Any:
    """A user prognostic (the zoo's ``GridPrognostic``, a small conv core) whose
    own forward runs its core under bfloat16 autocast on bf16 inputs, as AIFS's
    wrappers run their networks."""
    from earth2studio_compile.tools.zoo.grid import Grid
    from earth2studio_compile.tools.zoo.user import GridPrognostic, ToyCore

    class Autocasting(GridPrognostic):
        @torch.inference_mode()
        def _forward(self, x: torch.Tensor) -> torch.Tensor:
            shape = x.shape
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = self.model(x.reshape(-1, *shape[-3:]).to(torch.bfloat16))
            return out.float().reshape(shape)

    torch.manual_seed(0)
    return Autocasting(ToyCore(2).eval(), ["a", "b"], Grid(16, 32))


def _autocast_kernel_op() -> Any:
    """A custom operator with kernels of its own at the CPU and CUDA autocast keys
    that run it in bfloat16, as torch-harmonics' DISCO contraction has at CUDA's
    (built once per process)."""
    name = "e2sc_test::autocast_kernel_scale"
    try:
        return torch.ops.e2sc_test.autocast_kernel_scale.default
    except (AttributeError, RuntimeError):
        pass

    @torch.library.custom_op(name, mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0

    @scale.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    for key in ("AutocastCPU", "AutocastCUDA"):

        @torch.library.impl(name, key)
        def _(x: torch.Tensor) -> torch.Tensor:
            with torch.autocast(x.device.type, enabled=False):
                return scale(x.to(torch.bfloat16))

    return torch.ops.e2sc_test.autocast_kernel_scale.default


def autocast_kernel_model() -> Any:
    """A user prognostic whose forward runs its core under bfloat16 autocast on
    fp32 inputs (FCN3's wrapper), the core calling a custom operator with an
    autocast kernel (:func:`_autocast_kernel_op`) with autocast off around it
    (FCN3's DISCO encoders): in the exported graph it is a plain call in fp32."""
    from earth2studio_compile.tools.zoo.grid import Grid
    from earth2studio_compile.tools.zoo.user import GridPrognostic

    op = _autocast_kernel_op()

    class Core(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Conv2d(2, 8, 1)
            self.out = torch.nn.Conv2d(8, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autocast(x.device.type, enabled=False):
                y = op(self.inp(x.float()))
            return x + self.out(y).float()

    class Autocasting(GridPrognostic):
        @torch.inference_mode()
        def _forward(self, x: torch.Tensor) -> torch.Tensor:
            shape = x.shape
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                out = self.model(x.reshape(-1, *shape[-3:]))
            return out.float().reshape(shape)

    torch.manual_seed(0)
    return Autocasting(Core().eval(), ["a", "b"], Grid(16, 32))
