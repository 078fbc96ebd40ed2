"""Ahead-of-time compiled regions: AOTInductor's compile and package loader."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from earth2studio_compile._imports import quiet_imports

# What the C++ wrapper's int-array declarations are keyed on, held on each wrapper.
_WRITERS = "_earth2studio_compile_writers"


def _int_array_var(
    self: Any,
    int_array: str,
    writeline: Callable[..., None],
    known_statically: bool = False,
    graph: Any = None,
) -> str:
    """``CppWrapperCpu.codegen_int_array_var``, its cache keyed on a writer that
    stays alive.

    PyTorch keys the cache on ``id(writeline)`` (2.11) or on the id of the
    object it is bound to (2.14): a writer made for one call site (an
    ``IndentedBuffer`` for a custom op's arguments) is freed, the next one gets
    its address, and the cache hands it a variable declared in the freed one,
    so the C++ does not compile (``'int_array_20' was not declared``: AIFS's
    processor with flash-attn's op, H200, torch 2.11, 2026-11-30; pytorch
    PRs #193621, #193628). Holding every writer keyed on until the wrapper goes
    keeps the ids distinct; the declarations are PyTorch's own.
    """
    owner = getattr(writeline, "__self__", writeline)
    writers = self.__dict__.setdefault(_WRITERS, {})
    writers[id(owner)] = owner
    key = (int_array, id(owner), known_statically, id(graph) if graph else None)
    cache = self.codegen_int_array_var_cache
    if key not in cache:
        cache[key] = self._codegen_int_array_var_impl(
            int_array, writeline, known_statically
        )
    return str(cache[key])


@contextlib.contextmanager
def _int_arrays_declared() -> Iterator[None]:
    """:func:`_int_array_var` in place of PyTorch's for the block, where the C++
    wrapper has the method and cache it replaces (else nothing changes)."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    original = CppWrapperCpu.__dict__.get("codegen_int_array_var")
    fits = (
        original is not None
        and hasattr(CppWrapperCpu, "_codegen_int_array_var_impl")
        and list(inspect.signature(original).parameters)
        == ["self", "int_array", "writeline", "known_statically", "graph"]
    )
    if not fits:
        yield
        return
    CppWrapperCpu.codegen_int_array_var = _int_array_var  # type: ignore[method-assign]
    try:
        yield
    finally:
        CppWrapperCpu.codegen_int_array_var = original  # type: ignore[method-assign,assignment]


def aoti_compile(program: Any, path: str, configs: Mapping[str, Any]) -> str:
    """``torch._inductor.aoti_compile_and_package`` of an exported program, its
    C++ wrapper's int-array declarations kept (:func:`_int_array_var`).

    Parameters
    ----------
    program : torch.export.ExportedProgram
        The exported region
    path : str
        Where the ``.pt2`` package goes
    configs : Mapping[str, Any]
        Inductor settings for the compile

    Returns
    -------
    str
        The package's path
    """
    from torch._inductor import aoti_compile_and_package

    with _int_arrays_declared():
        return aoti_compile_and_package(
            program, package_path=path, inductor_configs=dict(configs)
        )


def aoti_loader(path: str, device: torch.device) -> Any:
    """AOTInductor's package loader for ``path``, without ``aoti_load_package``.

    ``torch._inductor.aoti_load_package`` goes through ``load_pt2``, which imports
    Inductor's compile machinery and probes the CPU's vector ISA by compiling test
    programs (5.8 s on a 2-core CPU, 13-58 s on an H100 host with an empty Inductor
    cache; pytorch issue #191715). The loader itself only unpacks and ``dlopen``s
    the compiled library (~0.01 s on CPU). ``run_single_threaded``: the runner
    skips its own thread synchronisation, which CUDA-graph capture needs; a region
    calls it from one thread.

    On an H100 with torch 2.11 the loader crashed the process (SIGSEGV, for any
    package, a one-layer one included) unless ``earth2studio.models.px`` had been
    imported first; with it, it loaded FCN's package in 0.15 s
    (docs/bench/2026-11-24-h100/aot-probe/). The cause is not known and a crash
    cannot be caught, so every load on CUDA makes that import first: a process
    with an Earth2Studio model has made it already, a background build's process
    had not (its package check crashed, 2026-11-27).

    Parameters
    ----------
    path : str
        The ``.pt2`` package
    device : torch.device
        Where the model computes (a CUDA device without an index: the current one)

    Returns
    -------
    torch._C._aoti.AOTIModelPackageLoader
        The loaded model
    """
    if device.type == "cuda":
        with quiet_imports():
            importlib.import_module("earth2studio.models.px")
    index = device.index if device.type == "cuda" and device.index else -1
    return torch._C._aoti.AOTIModelPackageLoader(path, "model", True, 1, index)
