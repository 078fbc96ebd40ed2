"""What an ahead-of-time artifact's key hashes about the core, and its layout.

An artifact may serve a call only under its key
(:meth:`~earth2studio_compile.artifacts.key.RegionTarget.aot_key`): everything
that changes the compiled code (the core's classes and their source, its tensors'
names, shapes and dtypes, the input signature, precision, mode and options, the
software and the device) is hashed into it. This module hashes the core; the
directory ``aot/<key>/`` is an entry of :mod:`.store`.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from earth2studio_compile import _torch
from earth2studio_compile import precision as _precision
from earth2studio_compile.cache import cache_root
from earth2studio_compile.patches import patch_of

# Version of the artifact layout and of what the key covers; bump it when either
# changes, and every older artifact stops matching.
# 2: the inputs' layouts (:func:`input_layouts`) are in the key.
AOT_FORMAT = 2
PACKAGE = "model.pt2"
#: Tensors the core makes from its code while it runs (a mask cached by shape),
#: which export lifts as constants with no name in the module: kept in the
#: artifact, as the build traced them (:func:`made_in_forward`).
CONSTANTS = "constants.pt"
#: The distinct convolutions the artifact made when it was built
#: (:func:`~earth2studio_compile._torch.record_convolutions`), replayed before
#: its first run on CUDA: a member (checksummed), not part of the key, absent
#: where the core has none or they could not be recorded.
CONVOLUTIONS = "convolutions.json"
# The core is exported inside a wrapper (to scope autocast in the graph), so the
# package names constants ``core.<name>``.
CORE = "core"


def aot_root(root: Path | None = None) -> Path | None:
    """Where artifacts live: ``root/aot``, by default under :func:`cache_root`."""
    root = root if root is not None else cache_root()
    return None if root is None else root / "aot"


def _ours(fn: Any) -> bool:
    # The package's own forward overrides (KeepFp32, opaque operators) are part of
    # the region's settings (precision, fp32_modules), not of the model's code.
    return str(getattr(fn, "__module__", "")).startswith("earth2studio_compile")


def _function_text(fn: Any) -> str:
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return repr(fn)
        # No source (a class built with type(), a REPL): the bytecode and constants
        # still change with the code, and the Python version is in the key.
        return f"{code.co_code.hex()}|{code.co_consts!r}|{code.co_names!r}"


def _class_text(cls: type) -> str:
    # Each function's own source rather than inspect.getsource(cls): that finds
    # the class by name in its file (so a method patched in at run time would not
    # show) and parses the whole file on Python < 3.13 (0.1-0.5 s per file).
    parts = []
    for name, value in sorted(vars(cls).items()):
        if isinstance(value, property):
            value = value.fget
        fn = inspect.unwrap(getattr(value, "__func__", value))
        if inspect.isfunction(fn):
            parts.append(f"{name}:{_function_text(fn)}")
        elif not name.startswith("__"):
            parts.append(f"{name}={type(value).__name__}")
    return "\n".join(parts)


def _module_classes(module: torch.nn.Module) -> list[type]:
    """Every class the core's modules are built from, torch's own excepted."""
    seen: dict[str, type] = {}
    for m in module.modules():
        for cls in type(m).__mro__:
            top = cls.__module__.split(".", 1)[0]
            if top in ("torch", "builtins"):
                continue  # covered by the torch version in the key
            seen.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    return [seen[name] for name in sorted(seen)]


def source_hash(module: torch.nn.Module) -> str:
    """sha256 of the source of every module class in ``module``, in a stable order.

    Instance-level ``forward`` overrides count too: the user's, and the table's
    method patches (:mod:`earth2studio_compile.patches`), not this package's
    other overrides (their settings are in the key).

    Parameters
    ----------
    module : torch.nn.Module
        A region's core

    Returns
    -------
    str
        Hex digest
    """
    digest = hashlib.sha256()
    for cls in _module_classes(module):
        digest.update(f"{cls.__module__}.{cls.__qualname__}\n".encode())
        digest.update(_class_text(cls).encode())
    for name, m in module.named_modules():
        fn = m.__dict__.get("forward")
        patch = patch_of(fn)
        if patch is not None:  # the table's patch: its code is what gets traced
            fn = patch.replacement
        if fn is not None and (patch is not None or not _ours(fn)):
            digest.update(f"instance {name}.forward\n{_function_text(fn)}".encode())
    return digest.hexdigest()


def constants_text(module: torch.nn.Module) -> str:
    tensors = itertools.chain(
        module.named_parameters(remove_duplicate=False),
        module.named_buffers(remove_duplicate=False),
    )
    text = json.dumps([[n, list(t.shape), str(t.dtype)] for n, t in tensors])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def effective_precision(precision: str | None, device: torch.device) -> str:
    """The precision a region computes in; None: what PyTorch's flags say.

    Parameters
    ----------
    precision : str | None
        The region's precision; None to read PyTorch's flags
    device : torch.device
        Where the region computes (TF32 applies on CUDA only)

    Returns
    -------
    str
        ``precision``, else ``"tf32"`` or ``"fp32"``; ``"fp32"`` for ``"tf32"``
        off CUDA
    """
    if device.type != "cuda":
        # TF32 is a CUDA matmul and convolution mode: elsewhere "tf32" computes
        # fp32, and a CPU build(precision="tf32") serves a CPU forecast under any
        # TF32 flags (each missed the other's artifacts and verdicts before).
        return "fp32" if precision in (None, "tf32") else precision
    if precision is not None:
        return precision
    # Read without the legacy getters, which raise when the two APIs were mixed.
    return "tf32" if any(_precision.tf32_enabled()) else "fp32"


#: What the key and the runner write for an argument the core does not read.
UNUSED = "<unused>"


def counted(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    unused: Sequence[str] = (),
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's arguments as an artifact's key counts them: those named in
    ``unused`` (parameters of the core's ``forward`` it never reads, from the
    model table) replaced by :data:`UNUSED`, whatever their value.

    Parameters
    ----------
    module : torch.nn.Module
        The region's core
    args, kwargs : tuple[Any, ...], Mapping[str, Any]
        The call's arguments
    unused : Sequence[str], optional
        Names of ``module.forward``'s parameters whose values do not count

    Returns
    -------
    tuple[tuple[Any, ...], dict[str, Any]]
        The arguments, the unused ones replaced
    """
    if unused:
        try:
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
        except TypeError:  # not a call of forward's signature: every value counts
            pass
        else:
            for name in set(unused) & set(bound.arguments):
                bound.arguments[name] = UNUSED
            return tuple(bound.args), dict(bound.kwargs)
    return tuple(args), dict(kwargs)


def argument_texts(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    unused: Sequence[str] = (),
) -> list[str | None]:
    """The non-tensor arguments of a call as counted (:func:`counted`), each as
    its ``repr`` (None for a tensor), in flattened order: what an artifact was
    built for. Export bakes every Python number, string and flag in as a
    constant, so an artifact answers for those values only; its runner compares
    them at every call.

    Parameters
    ----------
    module, args, kwargs, unused
        As :func:`counted`'s

    Returns
    -------
    list[str | None]
        One entry per flattened leaf
    """
    leaves, _ = _torch.tree_flatten(counted(module, args, kwargs, unused))
    return [None if isinstance(x, torch.Tensor) else repr(x) for x in leaves]


def built_layout(t: torch.Tensor) -> list[int]:
    """The strides an artifact's code reads input ``t`` with: those of its clone.

    The build exports and compiles a clone of the first call's inputs
    (:func:`~earth2studio_compile.artifacts.aot_build.detached`): a dense tensor
    keeps its strides, an expanded or overlapping one (Aurora's Perceiver latents,
    one row expanded over every patch) becomes contiguous. Worked out on the meta
    device: no copy.

    Parameters
    ----------
    t : torch.Tensor
        An input

    Returns
    -------
    list[int]
        Its clone's strides
    """
    return list(torch.empty_like(t, device="meta").stride())


def input_layouts(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[list[int]]:
    """:func:`built_layout` of each tensor of a call, in the package's input order
    (flattened ``(args, kwargs)``).

    Parameters
    ----------
    args, kwargs : tuple[Any, ...], Mapping[str, Any]
        The call's arguments

    Returns
    -------
    list[list[int]]
        The strides the artifact's code reads each tensor with
    """
    leaves = _torch.tree_flatten((tuple(args), dict(kwargs)))[0]
    return [built_layout(t) for t in leaves if isinstance(t, torch.Tensor)]


def live_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        **dict(module.named_parameters(remove_duplicate=False)),
        **dict(module.named_buffers(remove_duplicate=False)),
    }


def made_in_forward(name: str) -> bool:
    """Whether the exported constant ``name`` is a tensor the core made while it
    ran, not one it holds: ``torch.export`` names a tensor found on no module
    attribute ``lifted_tensor_<n>`` (Aurora's shifted-window masks, made once per
    shape by an ``lru_cache``), one held as an attribute by its path."""
    return name.rsplit(".", 1)[-1].startswith("lifted_tensor_")


def strip_core(name: str) -> str:
    return name.removeprefix(f"{CORE}.")
