"""The one package that touches PyTorch internals: each feature missing, no crash.

The package ``earth2studio_compile._torch`` reaches every private PyTorch name
through a *feature*. A PyTorch that lacks one must cost a figure in the report or a
fallback to eager with a reason, never a crash and never a wrong answer. No module
outside it imports or reaches those names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conftest import eager_backend, messages

import earth2studio_compile
from earth2studio_compile import CompileSession, _torch
from earth2studio_compile.tools import zoo

PACKAGE = Path(earth2studio_compile.__file__).parent
ADAPTOR = Path(_torch.__file__).parent  # the only place allowed torch's internals


def _outside_the_adaptor() -> list[Path]:
    """The package's modules, less those of ``earth2studio_compile._torch``."""
    return [p for p in PACKAGE.rglob("*.py") if not p.is_relative_to(ADAPTOR)]


@pytest.fixture
def without(monkeypatch):
    """Makes a feature's probe fail, as on a PyTorch that lacks the internal."""

    def declare(feature: str) -> None:
        def probe() -> None:
            raise AttributeError(f"{feature} removed (test)")

        purpose = _torch.FEATURES[feature][0]
        monkeypatch.setitem(_torch.FEATURES, feature, (purpose, probe))
        _torch._probe.cache_clear()

    yield declare
    _torch._probe.cache_clear()  # the real probes run again once restored


@pytest.mark.parametrize("feature", sorted(_torch.FEATURES))
def test_each_feature_missing_costs_no_crash_and_no_wrong_answer(
    feature, without, logs
):
    without(feature)
    # Inductor for the feature only Inductor needs (it then falls back before any
    # build); a tracing-only backend for the rest keeps the test fast.
    name = "sfno" if feature == "reparametrize" else "toy"
    backend = "inductor" if feature == "inductor_wrapper" else eager_backend
    model = zoo.build(name)
    x = torch.randn(
        1,
        *[
            len(v)
            for k, v in model.input_coords().items()
            if k not in ("batch", "lead_time")
        ],
    )
    with torch.no_grad():
        expected = model.model(x)
    with CompileSession(model, backend=backend) as session, torch.no_grad():
        outs = [model.model(x) for _ in range(3)]
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    region = session.report.regions[0]
    if feature in ("inductor_wrapper", "reparametrize"):
        assert region.status == "eager", session.report.summary()
        assert _torch.FEATURES[feature][0] in region.reason
        assert len(messages(logs, "WARNING")) == 1
    else:
        assert region.status == "compiled", session.report.summary()


def test_the_adaptor_is_the_torch_package_and_only_it():
    # Guards the two tests below against exempting too much (or nothing).
    assert ADAPTOR == PACKAGE / "_torch"
    outside = {p.relative_to(PACKAGE).as_posix() for p in _outside_the_adaptor()}
    assert "region.py" in outside and "executors/dynamo.py" in outside
    assert not any(p.startswith("_torch/") for p in outside), outside
    assert len(list(ADAPTOR.glob("*.py"))) > 1


def test_only_the_adaptor_imports_torch_internals():
    private = ("torch._dynamo", "torch._inductor", "torch._subclasses", "torch.utils._")
    offenders = []
    for path in _outside_the_adaptor():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith(private)]
    assert not offenders, offenders


def _torch_private_names() -> set[str]:
    """Private attribute names of torch's module, ``nn.Module``, ``Tensor`` and
    compiled modules: what only ``_torch``'s modules may reach."""
    from torch._dynamo.eval_frame import OptimizedModule

    objects = (torch, torch.nn.Module, torch.nn.Module(), torch.Tensor, OptimizedModule)
    names = {
        n
        for obj in objects
        for n in dir(obj)
        if n.startswith("_") and not n.startswith("__")
    }
    # Set in OptimizedModule.__init__, so absent from dir() of the class.
    return names | {"_orig_mod", "dynamo_ctx"}


def test_only_the_adaptor_reaches_private_torch_attributes():
    """By attribute (``x._version``), or by name (``__dict__["_compiled_call_impl"]``,
    ``hasattr(m, "_orig_mod")``), not only by import."""
    private = _torch_private_names()
    offenders = []
    for path in _outside_the_adaptor():
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    name = node.attr
            elif isinstance(node, ast.Constant) and node.value in private:
                name = node.value
            if name is not None:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {name}")
    assert not offenders, offenders
