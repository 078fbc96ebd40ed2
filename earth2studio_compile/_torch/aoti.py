"""Ahead-of-time compiled regions: AOTInductor's compile and package loader."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from earth2studio_compile._imports import quiet_imports


def aoti_compile(program: Any, path: str, configs: Mapping[str, Any]) -> str:
    """``torch._inductor.aoti_compile_and_package`` of an exported program.

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
