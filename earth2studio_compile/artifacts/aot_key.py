"""The key of an ahead-of-time artifact, and the artifact directory's layout.

An artifact may serve a call only under its key: everything that changes the
compiled code (the core's classes and their source, its tensors' names, shapes
and dtypes, the input signature, precision, mode and options, the software and
the device) is hashed into it.
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

from earth2studio_compile import precision as _precision
from earth2studio_compile._torch import tree_flatten
from earth2studio_compile.cache import (
    artifact_key,
    cache_root,
    key_fields,
)

# Version of the artifact layout and of what the key covers; bump it when either
# changes, and every older artifact stops matching.
AOT_FORMAT = 1
PACKAGE = "model.pt2"
META = "meta.json"
TMP_PREFIX = ".e2sc-"
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

    Instance-level ``forward`` overrides (other than this package's own) count too.

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
        if fn is not None and not _ours(fn):
            digest.update(f"instance {name}.forward\n{_function_text(fn)}".encode())
    return digest.hexdigest()


def _constants_text(module: torch.nn.Module) -> str:
    tensors = itertools.chain(
        module.named_parameters(remove_duplicate=False),
        module.named_buffers(remove_duplicate=False),
    )
    text = json.dumps([[n, list(t.shape), str(t.dtype)] for n, t in tensors])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def effective_precision(precision: str | None, device: torch.device) -> str:
    """The precision a region computes in; None: what PyTorch's flags say."""
    if precision is not None:
        return precision
    # Read without the legacy getters, which raise when the two APIs were mixed.
    tf32 = device.type == "cuda" and any(_precision.tf32_enabled())
    return "tf32" if tf32 else "fp32"


def _mode_text(
    mode: str | None, options: Mapping[str, Any] | None, fp32: Sequence[str]
) -> str:
    shown = sorted((str(k), repr(v)) for k, v in (options or {}).items())
    return f"aot|mode={mode or 'default'}|options={shown}|fp32_modules={sorted(fp32)}"


def key_for(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    device: torch.device,
    precision: str | None,
    mode: str | None,
    owner: str,
    region: str = "",
    options: Mapping[str, Any] | None = None,
    fp32_modules: Sequence[str] = (),
) -> tuple[str, dict[str, Any]]:
    """The key of a region's artifact, and the fields it hashes.

    Parameters
    ----------
    module : torch.nn.Module
        The region's core
    args, kwargs : tuple, Mapping
        Its call's arguments (tensors count by shape, dtype and device)
    device : torch.device
        Device the core computes on
    precision : str | None
        The region's precision (:mod:`earth2studio_compile.precision`)
    mode : str | None
        Inductor mode (``None``: default; ``"reduce-overhead"`` adds CUDA graphs,
        which the runner captures itself)
    owner : str
        Qualified class name of the model that owns the region
    region : str, optional
        Dotted path of the region in the model, by default ""
    options : Mapping[str, Any] | None, optional
        Further Inductor options, by default None
    fp32_modules : Sequence[str], optional
        Class names kept in fp32 under ``"bf16"``, by default none

    Returns
    -------
    tuple[str, dict[str, Any]]
        A 32-character hex key and the JSON-serialisable fields
    """
    fields = key_fields(
        owner,
        region,
        module,
        args,
        kwargs,
        _mode_text(mode, options, fp32_modules),
        device,
    )
    leaves, _ = tree_flatten((tuple(args), dict(kwargs)))
    fields.update(
        {
            "aot_format": AOT_FORMAT,
            "constants": _constants_text(module),
            "source": source_hash(module),
            "precision": precision or f"global:{effective_precision(None, device)}",
            "training": any(m.training for m in module.modules()),
            "cuda": torch.version.cuda if device.type == "cuda" else None,
            "arguments": [
                None if isinstance(x, torch.Tensor) else repr(x) for x in leaves
            ],
        }
    )
    return artifact_key(fields), json.loads(json.dumps(fields, default=str))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def live_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        **dict(module.named_parameters(remove_duplicate=False)),
        **dict(module.named_buffers(remove_duplicate=False)),
    }


def strip_core(name: str) -> str:
    return name.removeprefix(f"{CORE}.")
