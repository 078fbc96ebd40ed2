"""What a region's first call was given, kept so that a later process can start its
first call before the workflow reaches it.

A fresh process that loads a region's ahead-of-time artifact pays for it at the
workflow's first model step: the artifact's first run (its kernels loaded) and one
eager call to verify it, ~0.45 s for DLWP on an H200 (2026-11-26), while the workflow
had spent the time before that step fetching data. Its key depends on the call's
inputs, which are known only then; the shapes of the last first call on this region
are a good guess, and a wrong one costs nothing on the caller's path. A hint is
written after a first call that found an artifact or started building one, in
``aot/hints/`` under the cache root, whole or not at all; it holds the inputs' tree
structure, each tensor's shape and dtype, and the autograd mode, never values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile.artifacts.aot_key import (
    aot_root,
    built_layout,
    constants_text,
    effective_precision,
)
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.store import write_file
from earth2studio_compile.cache import make_private_dir

__all__ = ["Hint", "hint_path", "recall", "remember"]

#: Version of the hint's layout: another one is not read.
HINT_FORMAT = 2  # 2: each tensor's layout

Hint = tuple[tuple[Any, ...], dict[str, Any], bool]


def hint_path(target: RegionTarget, root: Path | None) -> Path | None:
    """The hint file of ``target``'s region: keyed by every setting but the inputs
    (:meth:`RegionTarget.resident_key`, its precision the effective one) and the core's
    constants (their names, shapes and dtypes: a model of another size is another
    region).

    Parameters
    ----------
    target : RegionTarget
        The region and its settings
    root : Path | None
        Cache root (None: the cache is off)

    Returns
    -------
    Path | None
        Where its hint lives, None without a cache
    """
    directory = aot_root(root) if root is not None else None
    if directory is None:
        return None
    # What it computes in, however it was asked for, as the artifact's key counts
    # it: a build(precision="tf32") leaves the hint a forecast under PyTorch's TF32
    # flags looks for (regression: it found none, docs/bench/2026-11-28-h200-twentieth).
    computes = effective_precision(target.precision, target.device)
    settings = dataclasses.replace(target, precision=computes).resident_key()
    text = f"{settings}|{constants_text(target.module)}"
    return (
        directory / "hints" / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"
    )


def remember(
    target: RegionTarget,
    root: Path | None,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    inference: bool | None = None,
) -> None:
    """Keep the structure of a first call's inputs (tensors only; a call with other
    arguments is not kept). Never raises: a hint is only ever a guess.

    Parameters
    ----------
    target : RegionTarget
        The region and its settings
    root : Path | None
        Cache root
    args, kwargs : tuple[Any, ...], Mapping[str, Any]
        The call's arguments, as the region was called
    inference : bool | None, optional
        Whether the call ran in inference mode; None: whether it is on here, by
        default None
    """
    try:
        path = hint_path(target, root)
        leaves, spec = _torch.tree_flatten((tuple(args), dict(kwargs)))
        if path is None or not all(isinstance(x, torch.Tensor) for x in leaves):
            return
        hint = {
            "format": HINT_FORMAT,
            "tree": _torch.treespec_dumps(spec),
            # The layout too: the made-up call then has the real one's key, and its
            # artifact reads the real inputs as they come (Aurora's Perceiver
            # takes a transposed view).
            "tensors": [
                [list(x.shape), str(x.dtype).removeprefix("torch."), built_layout(x)]
                for x in leaves
            ],
            "inference": (
                torch.is_inference_mode_enabled() if inference is None else inference
            ),
        }
        make_private_dir(path.parent)
        write_file(path, json.dumps(hint).encode())
    except Exception as err:
        logger.debug(f"{target.label}: no hint of its first call kept ({err!r})")


def recall(target: RegionTarget, root: Path | None) -> Hint | None:
    """Made-up inputs of the shapes of the region's last first call: normal values
    from a generator of their own on the target's device (the caller's random
    state is never touched), zeros for integer and bool tensors, made there.

    Parameters
    ----------
    target : RegionTarget
        The region and its settings
    root : Path | None
        Cache root

    Returns
    -------
    Hint | None
        ``(args, kwargs, inference)``: the call and whether it ran in inference
        mode; None without a readable hint of this layout
    """
    try:
        path = hint_path(target, root)
        if path is None or not path.is_file():
            return None
        hint = json.loads(path.read_text())
        if hint.get("format") != HINT_FORMAT:
            return None
        device = target.device
        # Drawn where they are used: FCN's (432 MB) drawn on the host and copied
        # over took its first call ahead a second on an H200, beside the
        # workflow's first steps (docs/bench/2026-11-29-h200-twentyfifth).
        generator = torch.Generator(device=device).manual_seed(0)
        leaves = []
        for shape, name, strides in hint["tensors"]:
            dtype = getattr(torch, name)
            if not isinstance(dtype, torch.dtype):
                return None
            x = torch.empty_strided(shape, strides, dtype=dtype, device=device)
            if dtype.is_floating_point:
                x.normal_(generator=generator)
            else:
                x.zero_()
            leaves.append(x)
        args, kwargs = _torch.tree_unflatten(
            leaves, _torch.treespec_loads(hint["tree"])
        )
        return tuple(args), dict(kwargs), bool(hint["inference"])
    except Exception as err:
        logger.debug(f"{target.label}: its hint is not usable ({err!r})")
        return None
