"""AOTInductor's package loader (earth2studio_compile._torch.aoti): what every
load does before the library is opened."""

from __future__ import annotations

import contextlib
import itertools
import sys

import earth2studio.models
import pytest
import torch

from earth2studio_compile._torch import aoti


@pytest.fixture
def loads(monkeypatch):
    """The loader's constructions, each with whether Earth2Studio's prognostic
    models were imported when it ran; ``earth2studio.models.px`` unimported."""
    seen: list[tuple[bool, tuple]] = []

    class Loader:
        def __init__(self, *args) -> None:
            seen.append(("earth2studio.models.px" in sys.modules, args))

    monkeypatch.setattr(earth2studio.models, "px", earth2studio.models.px)
    monkeypatch.delitem(sys.modules, "earth2studio.models.px")
    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", Loader)
    return seen


def test_a_cuda_load_imports_the_prognostic_models_first(loads):
    # Without the import, the loader crashed an H100 process (a background
    # build's package check, 2026-11-27): a crash no caller can catch.
    aoti.aoti_loader("model.pt2", torch.device("cuda", 1))
    assert loads == [(True, ("model.pt2", "model", True, 1, 1))]


def test_a_cpu_load_imports_nothing(loads):
    aoti.aoti_loader("model.pt2", torch.device("cpu"))
    assert loads == [(False, ("model.pt2", "model", True, 1, -1))]


def _undeclared(declared) -> int:
    """How many int arrays a C++ wrapper hands out undeclared, for five call
    sites that each write into a buffer of their own, freed after the call
    (as a custom op's arguments are written)."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.utils import IndentedBuffer

    wrapper = CppWrapperCpu.__new__(CppWrapperCpu)
    wrapper.codegen_int_array_var_cache = {}
    wrapper.int_array_id = itertools.count()
    wrapper.declared_int_array_vars = set()
    missing = 0
    with declared:
        for _ in range(5):
            buffer = IndentedBuffer()
            name = wrapper.codegen_int_array_var("{4, 8}", buffer.writeline)
            missing += f"{name}[]" not in buffer.getvalue()
            del buffer
    return missing


def test_every_int_array_the_cpp_wrapper_uses_is_declared_where_it_is_used():
    """Regression (H200, torch 2.11, 2026-11-30): AIFS's processor with
    flash-attn's op failed to build, ``'int_array_20' was not declared``: PyTorch
    keyed its declarations on a freed writer's address, which the next writer
    got. Still so in torch 2.14 (the first count)."""
    assert _undeclared(contextlib.nullcontext()) > 0
    assert _undeclared(aoti._int_arrays_declared()) == 0


def test_the_compile_runs_with_the_declarations_kept(monkeypatch):
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    seen = []

    def compile_and_package(program, package_path, inductor_configs):
        seen.append(CppWrapperCpu.codegen_int_array_var is aoti._int_array_var)
        return package_path

    monkeypatch.setattr(
        torch._inductor, "aoti_compile_and_package", compile_and_package
    )
    assert aoti.aoti_compile(None, "model.pt2", {}) == "model.pt2"
    assert seen == [True]
    assert CppWrapperCpu.codegen_int_array_var is not aoti._int_array_var
