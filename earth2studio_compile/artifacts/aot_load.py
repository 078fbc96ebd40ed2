"""Load a region's artifact, bind the live weights, run it, verify it against eager.

:func:`load_runner` finds the artifact of a call's key, checks it (:mod:`.store`:
trust, fields, checksum), loads it through AOTInductor's package loader and binds
the live module's parameters and buffers (no copy), and the tensors the core made
while it was built (kept in the artifact), into an :class:`.aot_runner.AotRunner`,
which captures its own CUDA graph on CUDA and, there, replays the convolutions
recorded at build before its first run. :func:`verify` compares a first output
with one eager call.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile._torch import tree_flatten
from earth2studio_compile.artifacts import store
from earth2studio_compile.artifacts.aot_key import (
    CONSTANTS,
    CONVOLUTIONS,
    PACKAGE,
    aot_root,
    effective_precision,
    input_layouts,
)
from earth2studio_compile.artifacts.aot_runner import AotRunner
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.store import META
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.precision import THRESHOLDS, ambient_autocast


def _differences(fields: Mapping[str, Any], directory: Path) -> str:
    """What the artifacts of the same region differ in, for the reason."""
    diffs: set[str] = set()
    for meta_path in directory.glob(f"*/{META}"):
        try:
            other = store.read_meta(meta_path.parent)["fields"]
        except Exception:  # an unreadable neighbour says nothing
            continue
        if (
            other.get("model") != fields["model"]
            or other.get("region") != fields["region"]
        ):
            continue
        diffs.update(k for k in fields if other.get(k) != fields[k])
    if not diffs:
        return ""
    return f"; the artifacts built for this region differ in {', '.join(sorted(diffs))}"


def load_runner(
    target: RegionTarget,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    cudagraphs: bool | None = None,
    clone: bool = True,
    root: Path | None = None,
) -> AotRunner | str:
    """The region's artifact, loaded and bound to its module, or why not.

    Parameters
    ----------
    target : RegionTarget
        The region's core and its settings (:meth:`RegionTarget.aot_key`)
    args : tuple[Any, ...]
        The call's positional arguments (tensors count by shape, dtype, device)
    kwargs : Mapping[str, Any] | None, optional
        Its keyword arguments, by default none
    cudagraphs : bool | None, optional
        Capture a CUDA graph around the artifact; None: when the policy's
        ``mode`` or ``options`` ask for CUDA graphs on a CUDA device, by default
        None
    clone : bool, optional
        Clone CUDA-graph outputs before returning them, by default True
    root : Path | None, optional
        Cache root, by default :func:`cache_root`

    Returns
    -------
    AotRunner | str
        The runner, or the reason it declined: no artifact for the key (naming
        what differs from the region's other artifacts), one not to be used
        (untrusted, made for other fields, checksum, load error), a model that
        cannot be bound, or a PyTorch without the loader
    """
    phases: dict[str, float] = {}
    start = time.perf_counter()
    reason = _torch.missing("aoti_loader")
    if reason is not None:
        return reason
    directory = aot_root(root)
    if directory is None:
        return "the compile cache is off"
    module, device = target.module, target.device
    kwargs = dict(kwargs or {})
    try:
        key, fields = target.aot_key(args, kwargs)
    except Exception as err:  # an odd argument: no artifact can match
        return f"no key for its arguments ({type(err).__name__}: {err})"
    path = directory / key
    found = (path / META).is_file()
    # Each phase starts where the last ended: together they are the whole load.
    phases["key"], start = _lap(start)
    if not found:
        return f"no artifact for its key {key}" + _differences(fields, directory)
    reason = store.distrust(directory.parent, directory.name, key, PACKAGE)
    members = [PACKAGE] + [m for m in (CONSTANTS, CONVOLUTIONS) if (path / m).exists()]
    reason = reason or store.check_dir(path, fields, members)
    if reason is not None:
        return f"artifact {path} not used: {reason}"
    phases["checksum"], start = _lap(start)
    try:
        loader = _torch.aoti_loader(str(path / PACKAGE), device)
        names = list(loader.get_constant_fqns())
        made = (
            torch.load(path / CONSTANTS, map_location=device, weights_only=True)
            if CONSTANTS in members
            else {}
        )
    except Exception as err:  # a damaged or foreign library
        return (
            f"damaged artifact {path}: could not load it ({type(err).__name__}: {err})"
        )
    convolutions = _convolutions(path) if CONVOLUTIONS in members else []
    phases["aot_load"], start = _lap(start)
    if cudagraphs is None:
        cudagraphs = wants_cudagraphs(target)
    leaves = tree_flatten((tuple(args), kwargs))[0]
    inputs = [
        [list(t.shape), str(t.dtype), t.device.type]
        for t in leaves
        if isinstance(t, torch.Tensor)
    ]
    try:
        runner = AotRunner(
            loader,
            module,
            names,
            device,
            target.precision,
            inputs,
            cudagraphs,
            clone,
            path,
            key,
            phases,
            made,
            fields["arguments"],
            target.unused_arguments,
            convolutions,
            input_layouts(args, kwargs),
        )
    except Exception as err:  # binding failed: the model is not what was built
        return f"could not bind the model to {path} ({type(err).__name__}: {err})"
    # From the loaded library to a runner bound to the live weights.
    phases["bind"], _ = _lap(start)
    return runner


def _convolutions(path: Path) -> list[dict[str, Any]]:
    """The artifact's recorded convolutions; none where the record cannot be read
    (checksummed, but perhaps of another layout): it only saves time."""
    try:
        return _torch.read_convolutions((path / CONVOLUTIONS).read_bytes())
    except Exception as err:  # the artifact runs as one without a record
        logger.debug(
            f"Artifact {path}: its convolution record is not used "
            f"({type(err).__name__}: {err})"
        )
        return []


def wants_cudagraphs(target: RegionTarget) -> bool:
    """Whether the region's artifact runs under CUDA graphs: its policy's ``mode``
    or ``options`` ask for them, on a CUDA device (:func:`load_runner`'s default).

    Parameters
    ----------
    target : RegionTarget
        The region and its settings

    Returns
    -------
    bool
        True where a runner loaded for it captures a CUDA graph
    """
    policy = target.policy
    mode = policy.mode
    wants = {**(_torch.mode_options(mode) if mode else {}), **(policy.options or {})}
    return bool(wants.get("triton.cudagraphs")) and target.device.type == "cuda"


def _lap(start: float) -> tuple[float, float]:
    """Seconds since ``start``, and now: the next phase's start."""
    now = time.perf_counter()
    return now - start, now


# Relative L2 of an artifact's first output against one eager call in the same
# precision, above which the artifact is not used. fp32: the same network compiled
# two ways differs by reduction order only (AOTInductor vs eager: 4.9e-7 for FCN on
# an H100, 1.7e-6 max abs on CPU; Dynamo vs eager 2.5e-6 max abs), while a wrong
# graph is off by O(1); 1e-5 leaves a factor of 6-20 for other cores. Reduced
# precisions: both sides round differently, so the documented cost of the
# precision itself (precision.THRESHOLDS) bounds their difference.
TOLERANCES = {"fp32": 1e-5, "tf32": THRESHOLDS["tf32"], "bf16": THRESHOLDS["bf16"]}


def _effective(precision: str | None, device: torch.device) -> str:
    """The region's precision, or bf16 where an autocast to a 16-bit float type is
    on for ``device``: the caller's (AIFS's wrapper runs its network so: two
    correct calls differ by 4e-3 there, 2026-11-30, CPU), or the one a check
    enters again inside an fp32 or tf32 scope for a region its model's wrapper
    autocasts (FCN3's block MLPs: 3.3e-3 apart, H200, 2026-12-01)."""
    if ambient_autocast(device.type) is not None:
        return "bf16"
    return effective_precision(precision, device)


def verify(
    runner_out: Any, eager_out: Any, precision: str | None, quiet: bool = False
) -> str | None:
    """Why an artifact's output is not the eager output, or None if it is; the
    Dynamo executor checks its first compiled call with it too.

    Parameters
    ----------
    runner_out : Any
        The artifact's (or compiled code's) output for one call
    eager_out : Any
        The eager output for the same input, in the same precision
    precision : str | None
        The region's precision; None means PyTorch's settings (TF32 tolerance on a
        GPU where TF32 is enabled)
    quiet : bool, optional
        No DEBUG line when they agree (a compiled workflow logs nothing at DEBUG
        of its own), by default False

    Returns
    -------
    str | None
        The reason, or None when every output is within :data:`TOLERANCES`
    """
    got, got_spec = tree_flatten(runner_out)
    want, want_spec = tree_flatten(eager_out)
    if got_spec != want_spec:
        return "its outputs have another structure than the eager outputs"
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(w, torch.Tensor):
            if g != w:
                return f"output {i} is {g!r}, eager gives {w!r}"
            continue
        if not isinstance(g, torch.Tensor):
            return f"output {i} is not a tensor"
        if g.shape != w.shape or g.dtype != w.dtype:
            return (
                f"output {i} is {list(g.shape)} {g.dtype}, eager gives "
                f"{list(w.shape)} {w.dtype}"
            )
        effective = _effective(precision, w.device)
        tolerance = TOLERANCES[effective]
        if not w.is_floating_point() and not w.is_complex():
            if not torch.equal(g, w.to(g.device)):
                return f"output {i} differs from eager"
            continue
        g, w = g.detach(), w.detach().to(g.device)
        nan = torch.isnan(w)
        if not torch.equal(torch.isnan(g), nan):
            return f"output {i} has NaNs where eager has none (or the reverse)"
        # Overflow where eager overflows, with its sign, is eager's answer (a core
        # answering made-up inputs with inf): compared by position, as NaNs are.
        inf = torch.isinf(w)
        if not torch.equal(torch.isinf(g), inf) or not torch.equal(g[inf], w[inf]):
            return f"output {i} has infinities where eager has none (or the reverse)"
        odd = nan | inf
        error = rel_l2(g[~odd], w[~odd]) if odd.any() else rel_l2(g, w)
        if not math.isfinite(error) or error > tolerance:
            return (
                f"output {i} is off by rel. L2 {error:.1e} against eager, above the "
                f"{tolerance:.0e} allowed for {effective}"
            )
        worst = max(worst, error)
    if not quiet:
        logger.debug(f"Artifact verified against eager: rel. L2 {worst:.1e}")
    return None
