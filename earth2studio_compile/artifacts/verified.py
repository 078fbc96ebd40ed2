"""Which weights an ahead-of-time artifact has given eager's answer with.

An artifact's first call in a process was verified against one eager call on the
same input, every process again. A fresh process pays that eager call (0.2-0.5 s on
an H100 for DLWP and FCN, their first eager kernels included: the figures
"ensembles-h100-6bdb8a0-phases" of docs/performance.md) beside the workflow's
start, where a call bound by its storage cannot hide it, and the verification of
the next process adds no evidence: the same package (its sha256) with the same
weights (their values) on the same device, torch and CUDA (the artifact's key) is
the same computation. So an artifact that passed records a seal of the two beside
it (``verified.json``), and a later first call with a seal it holds skips the eager
call. Another package under the key (rebuilt, planted, replaced) or other weights
(another checkpoint, an update in place) have another seal and are verified again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from loguru import logger

from earth2studio_compile import _torch, precision
from earth2studio_compile.artifacts import store
from earth2studio_compile.artifacts.aot_key import PACKAGE
from earth2studio_compile.artifacts.aot_load import load_runner, verify

if TYPE_CHECKING:
    from earth2studio_compile.artifacts.aot_runner import AotRunner
    from earth2studio_compile.artifacts.key import RegionTarget

__all__ = [
    "FILE",
    "Sealed",
    "against_eager",
    "known",
    "record",
    "seal",
    "seal_built",
    "weights_print",
]

FILE = "verified.json"
#: Seals kept per artifact: the weights it was verified with most recently.
KEEP = 16
#: Elements per group of tensors summed together: few kernel launches (each one
#: waits for the GIL beside a busy workflow thread: one per tensor took 0.42 s for
#: FCN's 150 tensors on an H100, 2026-11-26), and a bounded temporary copy.
_GROUP = 1 << 26
#: Positions are weighted by ``i % _PERIOD + 1``.
_PERIOD = 251
#: Integer dtypes of each element size: a tensor's bits are summed, not its values
#: (a NaN, an infinity or -0.0 counts like any other pattern).
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def weights_print(module: torch.nn.Module) -> str:
    """A fingerprint of the values of ``module``'s parameters and buffers.

    Their names, shapes, dtypes and devices, and per group of tensors of one
    device and element size (laid end to end): two sums of the elements' bit
    patterns as integers, one weighted by position modulo 251 (a permutation
    changes it unless it keeps every element's position modulo 251), summed in
    float64 on the device, one transfer per device.

    Parameters
    ----------
    module : torch.nn.Module
        A region's core

    Returns
    -------
    str
        A sha256 in hex; equal for equal tensors on the same device
    """
    described: list[str] = []
    groups: dict[tuple[torch.device, int], list[list[torch.Tensor]]] = {}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        described.append(f"{name}:{tuple(t.shape)}:{t.dtype}:{t.device}")
        bits = _bits(t.detach())
        found = groups.setdefault((t.device, bits.element_size()), [[]])
        if sum(b.numel() for b in found[-1]) + bits.numel() > _GROUP:
            found.append([])
        found[-1].append(bits)
    h = hashlib.sha256("|".join(described).encode())
    sums: dict[torch.device, list[torch.Tensor]] = {}
    with torch.no_grad():
        # Sorted by key alone: str() of an item formats its tensors, reading
        # elements one by one to the host (0.55 s for FCN's weights on an H100).
        for (device, _), found in sorted(groups.items(), key=lambda kv: str(kv[0])):
            sums.setdefault(device, []).extend(_sums(g) for g in found if g)
    for device in sorted(sums, key=str):
        h.update(torch.stack(sums[device]).cpu().numpy().tobytes())
    return h.hexdigest()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as integers of their size, flat."""
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.reshape(-1).view(_BITS[t.element_size()])


def _sums(group: list[torch.Tensor]) -> torch.Tensor:
    """The plain and the position-weighted sum of ``group`` laid end to end."""
    n = sum(t.numel() for t in group)
    pad = -n % _PERIOD
    tail = torch.zeros(pad, dtype=group[0].dtype, device=group[0].device)
    rows = torch.cat([*group, tail]).view(-1, _PERIOD)
    columns = rows.sum(dim=0, dtype=torch.float64)
    weights = torch.arange(1, _PERIOD + 1, dtype=torch.float64, device=rows.device)
    return torch.stack([columns.sum(), (columns * weights).sum()])


def against_eager(
    runner: AotRunner,
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    precision: str | None,
) -> str | None:
    """Whether ``out``, the artifact's output for one call, is eager's answer: at
    once where the artifact gave it with ``module``'s weights before (its seal is
    known: ``runner.verified_earlier`` is set), else by one eager call compared
    with it (:func:`~earth2studio_compile.artifacts.aot_load.verify`), its seal
    recorded when it is.

    Parameters
    ----------
    runner : AotRunner
        The artifact, loaded and bound to ``module``
    module : torch.nn.Module
        The region's core
    args : tuple[Any, ...]
        The call's positional arguments
    kwargs : dict[str, Any]
        Its keyword arguments
    out : Any
        The artifact's output for them
    precision : str | None
        The region's precision

    Returns
    -------
    str | None
        Why ``out`` is not eager's answer; None when it is
    """
    sealed, held = _seal_held(runner, module)
    if held:
        return None
    return _eager_agrees(runner, module, args, kwargs, out, precision, sealed)


def _seal_held(runner: AotRunner, module: torch.nn.Module) -> tuple[str | None, bool]:
    """The artifact's :func:`seal` with ``module``'s weights, and whether it is
    known; where it is, ``runner.verified_earlier`` is set."""
    sealed = seal(runner.path, weights_print(module))
    held = known(runner.path, sealed)
    if held:
        runner.verified_earlier = True
    return sealed, held


def _eager_agrees(
    runner: AotRunner,
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    precision: str | None,
    sealed: str | None,
) -> str | None:
    """:func:`against_eager` for a seal not held: one eager call compared with
    ``out``, and ``sealed`` recorded when they agree."""
    eager = _torch.call_module(module, args, kwargs)
    reason = verify(out, eager, precision)
    if reason is None:
        record(runner.path, sealed)
    return reason


class Sealed(NamedTuple):
    """What :func:`seal_built` did.

    Attributes
    ----------
    why : str | None
        Why the artifact was not sealed; None when it was
    runner : AotRunner | None
        The artifact, loaded without CUDA graphs and bound to the region's
        module; None where it was not loaded
    wrong : bool
        It ran, and gave another answer than eager (``why`` says how far): no
        process should run it
    """

    why: str | None
    runner: AotRunner | None
    wrong: bool = False


def seal_built(
    target: RegionTarget,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    root: Path | None,
    runner: AotRunner | None = None,
) -> Sealed:
    """Verify an artifact just built (or found) against eager on the forecast's
    first-call inputs, here, and record its seal if it gives eager's answer: the
    forecast's next process then loads it without an eager call of its own beside
    its first step (0.41 s of FCN's first step on an H100, 2026-11-27). What
    :func:`~earth2studio_compile.build` and the background build do after building;
    the runner comes back, so a caller that runs the artifact again without CUDA
    graphs (``build()``'s speed timing on the CPU) needs no load of its own.

    Both calls run in the region's precision, as its first call in a forecast
    does; a bf16 region that keeps submodules in fp32 is left to verify at that
    first call, where the session holds them in fp32.

    Parameters
    ----------
    target : RegionTarget
        The region the artifact was built for
    args : tuple[Any, ...]
        The forecast's first-call positional arguments
    kwargs : dict[str, Any]
        Its keyword arguments
    root : Path | None
        Cache root
    runner : AotRunner | None, optional
        The artifact, already loaded without CUDA graphs (a caller that looked
        for it has it); by default it is loaded here

    Returns
    -------
    Sealed
        Why it was not sealed (None when it was), and the runner
    """
    if target.precision == "bf16" and target.fp32_modules:
        left = "a bf16 region with submodules kept in fp32: its first call verifies"
        return Sealed(left, runner)
    try:
        if runner is None:
            loaded = load_runner(target, args, kwargs, cudagraphs=False, root=root)
            if isinstance(loaded, str):
                return Sealed(loaded, None)
            runner = loaded
        # A seal already held needs no call: a build that finds its artifact
        # (tools.build run again) runs neither the artifact nor eager.
        sealed, held = _seal_held(runner, target.module)
        if held:
            return Sealed(None, runner)
        with (
            torch.no_grad(),
            precision.scope(target.precision, target.device),
            precision.autocast_of(target.autocast, target.device),
        ):
            out = runner(*args, **kwargs)
            reason = _eager_agrees(
                runner, target.module, args, kwargs, out, target.precision, sealed
            )
            return Sealed(reason, runner, wrong=reason is not None)
    except Exception as err:  # the forecast's first call verifies instead
        return Sealed(f"{type(err).__name__}: {err}", runner)


def seal(path: Path, weights: str) -> str | None:
    """The seal of the artifact at ``path`` with weights of ``weights_print``.

    Parameters
    ----------
    path : Path
        The artifact's directory
    weights : str
        :func:`weights_print` of the module bound to it

    Returns
    -------
    str | None
        A sha256 of the package's own (from ``meta.json``) and ``weights``; None
        when ``meta.json`` holds none
    """
    try:
        package = store.read_meta(path)["sha256"][PACKAGE]
    except Exception:  # no seal: verified as ever
        return None
    return hashlib.sha256(f"{package}|{weights}".encode()).hexdigest()


def known(path: Path, sealed: str | None) -> bool:
    """Whether the artifact at ``path`` has given eager's answer with ``sealed``.

    Parameters
    ----------
    path : Path
        The artifact's directory
    sealed : str | None
        Its :func:`seal` with the live weights

    Returns
    -------
    bool
        False as well when the record is missing or unreadable
    """
    if sealed is None:
        return False
    try:
        return sealed in _read(path)
    except Exception:  # a damaged record: verify
        return False


def record(path: Path, sealed: str | None) -> None:
    """Note that the artifact at ``path`` gave eager's answer with ``sealed``.

    Never raises: a cache the process cannot write only means the next process
    verifies again.

    Parameters
    ----------
    path : Path
        The artifact's directory
    sealed : str | None
        Its :func:`seal` with the weights it was verified with
    """
    if sealed is None:
        return
    try:
        try:
            seals = [s for s in _read(path) if s != sealed]
        except Exception:  # missing or damaged: start again
            seals = []
        seals = [*seals, sealed][-KEEP:]
        store.write_file(path / FILE, json.dumps({"verified": seals}).encode())
    except OSError as err:
        logger.debug(f"Could not record the verification of {path}: {err!r}")


def _read(path: Path) -> list[str]:
    seals = json.loads((path / FILE).read_text())["verified"]
    if not isinstance(seals, list) or not all(isinstance(s, str) for s in seals):
        raise ValueError(f"{FILE} is not a list of seals")
    return seals
