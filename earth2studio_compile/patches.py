"""Upstream model methods replaced, bitwise identically, while a session is open.

Some host work a step repeats is upstream's own model code: Earth2Studio 0.19's DLWP
computes the cosine zenith field of every member of a batch, although all members
share one time (16 identical fields, each copied to the device on its own, for an
8-member batch). A :class:`MethodPatch` in a model's table entry
(:attr:`~earth2studio_compile.ModelSpec.patches`) names the method and the
replacement, which must return the same values bitwise: it is the change upstream
could make itself, applied only while a session runs.

A patch may also name a ``key``: calls with equal keys return equal values, so the
first call's result is kept for the session (per model) and later calls get a copy
of it. DLWP's ``_prepare_input`` asks for the zenith fields of the batch's initial
times at every step of a rollout (its lead time is not among the arguments), ~20 ms
of host work a call on the cube sphere's grid, each time the same fields.

A patch may name the class of the model's submodules it is for
(:attr:`MethodPatch.submodules`) instead of the model: microsoft-aurora 2.0.1's Swin
block, whose first cyclic shift (``torch.roll``) fused into the window partition
Triton 3.6 compiled wrongly at the published model's 90x180 stage (torch 2.11, an
H200: Inductor's kernel is right, Triton miscompiles its 32-bit index arithmetic;
the same shift as two slices concatenated is computed right, and is bitwise
``torch.roll``'s result in eager).

A patch applies only to the exact upstream code it was written against: the method
the model's class resolves must have the source the patch names (its SHA-256), so a
subclass that overrides it, or another upstream version, keeps its own method. The
replacement is set on the instance (never the class) and removed on exit. If it
raises, the call is run again by upstream's method, one WARNING says why, and the
model keeps upstream's method for the rest of the session.
"""

from __future__ import annotations

import hashlib
import inspect
import types
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile.report import describe

__all__ = [
    "AURORA_SWIN_SHIFT",
    "DLWP_ZENITH",
    "MethodPatch",
    "Patches",
    "aurora_swin_block_forward",
    "dlwp_cosine_zenith_fields",
    "dlwp_zenith_key",
    "on_submodules",
    "patch_of",
    "rolled",
    "source_digest",
]


@dataclass(frozen=True)
class MethodPatch:
    """A bitwise-identical replacement for one method of an upstream model class.

    Parameters
    ----------
    name : str
        The method's name, e.g. ``"get_cosine_zenith_fields"``
    replacement : Callable
        A function taking the model as its first argument, with the method's
        signature, returning exactly what the method returns
    source : str
        :func:`source_digest` of the upstream method it replaces; a model whose
        class resolves ``name`` to other code keeps its own method
    why : str, optional
        What the replacement saves, for the documentation table
    key : Callable[..., Hashable] | None, optional
        A function of the model and the method's arguments whose value is equal
        only for calls that return equal values (everything the result depends on);
        by default None, meaning nothing is kept. The replacement must then return
        a tensor: calls with a key seen before in the session get a copy of the
        first one's result
    submodules : str, optional
        The class name of the model's submodules whose method it replaces, on each
        such submodule; by default ``""``: the model's own method
    release : Callable[[], None] | None, optional
        Called once the patch is removed, to let go of what its replacement keeps
        beyond the session (a module-level cache), by default None
    """

    name: str
    replacement: Callable[..., Any]
    source: str
    why: str = ""
    key: Callable[..., Hashable] | None = None
    submodules: str = ""
    release: Callable[[], None] | None = None


def on_submodules(
    patches: Iterable[MethodPatch], module: Any
) -> list[tuple[Any, MethodPatch]]:
    """Each patch naming :attr:`MethodPatch.submodules`, paired with every
    submodule of ``module`` (itself included) of that class.

    Parameters
    ----------
    patches : Iterable[MethodPatch]
        A table entry's patches (those for the model itself are left out)
    module : Any
        A model or a region's core; nothing is found in what is not a module

    Returns
    -------
    list[tuple[Any, MethodPatch]]
        ``(submodule, patch)`` pairs, for :class:`Patches`
    """
    if not isinstance(module, torch.nn.Module):
        return []
    return [
        (m, patch)
        for patch in patches
        if patch.submodules
        for m in module.modules()
        if type(m).__name__ == patch.submodules
    ]


def patch_of(method: Any) -> MethodPatch | None:
    """The patch whose replacement ``method`` is (a bound method an installed
    patch set on an instance), or None.

    Parameters
    ----------
    method : Any
        An instance attribute, e.g. a module's ``__dict__["forward"]``

    Returns
    -------
    MethodPatch | None
        The patch, which changes the code a compiled region traces
    """
    return getattr(getattr(method, "__func__", method), "method_patch", None)


def source_digest(function: Callable[..., Any]) -> str:
    """SHA-256 (first 16 hex digits) of a function's source, or ``""`` if unknown.

    Parameters
    ----------
    function : Callable
        A function or method

    Returns
    -------
    str
        The digest
    """
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return ""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class Patches:
    """The patches a session sets on its models' instances, and removes on exit.

    Also a context manager: installed inside the block, removed after (as
    :func:`~earth2studio_compile.build` builds from the code a session runs).

    Parameters
    ----------
    found : Iterable[tuple[Any, MethodPatch]]
        ``(model instance, patch)`` pairs from the models' table entries
    """

    def __init__(self, found: Iterable[tuple[Any, MethodPatch]]) -> None:
        self.pending: list[tuple[Any, MethodPatch]] = []
        self.installed: list[tuple[Any, str, Callable[..., Any]]] = []
        seen: set[tuple[int, str]] = set()
        for model, patch in found:
            where = f"{type(model).__name__}.{patch.name}"
            if (id(model), patch.name) in seen:
                continue  # a model given twice is patched once
            seen.add((id(model), patch.name))
            upstream = getattr(type(model), patch.name, None)
            if patch.name in getattr(model, "__dict__", {}):
                logger.debug(f"{where} is not patched: the instance sets its own")
            elif upstream is None or source_digest(upstream) != patch.source:
                logger.debug(f"{where} is not patched: not the code the patch is for")
            else:
                self.pending.append((model, patch))

    def __enter__(self) -> Patches:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def install(self) -> None:
        """Set each replacement on its model instance."""
        for model, patch in self.pending:
            bound = types.MethodType(_guarded(patch), model)
            model.__dict__[patch.name] = bound
            self.installed.append((model, patch.name, bound))

    def restore(self) -> None:
        """Remove what :meth:`install` set: no instance attribute is left, and
        each patch's ``release`` has run."""
        for model, name, bound in reversed(self.installed):
            if model.__dict__.get(name) is bound:
                del model.__dict__[name]
        self.installed = []
        for patch in {id(p): p for _, p in self.pending}.values():
            if patch.release is not None:
                patch.release()


#: Results a keyed patch keeps per model and session (DLWP: two per initial time).
MEMO_SIZE = 32


def _guarded(patch: MethodPatch) -> Callable[..., Any]:
    """The replacement, falling back to upstream's method for good if it raises;
    with a ``key``, its results kept (for this installation: one model, one
    session)."""
    memo: OrderedDict[Hashable, torch.Tensor] = OrderedDict()

    def replaced(self: Any, *args: Any, **kwargs: Any) -> Any:
        if patch.key is None:
            return patch.replacement(self, *args, **kwargs)
        key = patch.key(self, *args, **kwargs)
        if key in memo:
            memo.move_to_end(key)
            return memo[key].clone()
        out = patch.replacement(self, *args, **kwargs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(
                f"a keyed patch must return a tensor, got {type(out).__name__}"
            )
        # The kept result is never the one handed out: a caller may write to it.
        memo[key] = out.clone()
        if len(memo) > MEMO_SIZE:
            memo.popitem(last=False)
        return out

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return replaced(self, *args, **kwargs)
        except Exception as err:
            upstream = getattr(type(self), patch.name)
            if getattr(self.__dict__.get(patch.name), "__func__", None) is call:
                del self.__dict__[patch.name]
            logger.warning(
                f"{type(self).__name__}.{patch.name}: the session's replacement "
                f"failed ({describe(err)}); upstream's method runs from now on"
            )
            return upstream(self, *args, **kwargs)

    call.method_patch = patch  # type: ignore[attr-defined]
    return call


# -- the table's patches -------------------------------------------------------------


def dlwp_cosine_zenith_fields(
    self: Any,
    times: np.ndarray,
    lead_time: timedelta,
    device: torch.device | str = "cuda",
) -> torch.Tensor:
    """Earth2Studio DLWP's ``get_cosine_zenith_fields``, each distinct time once.

    Upstream computes one field per entry of ``times`` (the batch's times tiled by
    its size) and copies each to the device. Here each distinct time is computed
    once, with upstream's functions, the fields are copied to the device together,
    normalised there as upstream does, and indexed back into ``times``'s order: the
    same float32 values, elementwise operations on the same device.

    Parameters
    ----------
    self : Any
        The DLWP model
    times : np.ndarray
        Times (datetime64), one per sample
    lead_time : timedelta
        Offset from each time
    device : torch.device | str, optional
        Device of the result, by default "cuda"

    Returns
    -------
    torch.Tensor
        ``[len(times), *latgrid.shape]`` normalised cosine zenith fields
    """
    # Upstream's own functions, looked up where its method finds them.
    from earth2studio.models.px import dlwp

    first: dict[Any, int] = {}
    order = [first.setdefault(t, len(first)) for t in dlwp.timearray_to_datetime(times)]
    lon, lat = self.longrid.cpu(), self.latgrid.cpu()
    fields = [
        torch.Tensor(dlwp.cos_zenith_angle(time + lead_time, lon, lat))
        for time in first
    ]
    out = torch.stack(fields, dim=0).to(device)
    out = torch.clamp(out, min=0) - 1.0 / np.pi
    if len(fields) == len(order):
        return out  # no repeats: already in order
    return out[torch.tensor(order, device=out.device)]


def dlwp_zenith_key(
    self: Any,
    times: np.ndarray,
    lead_time: timedelta,
    device: torch.device | str = "cuda",
) -> Hashable:
    """What :func:`dlwp_cosine_zenith_fields` depends on: the times as upstream
    reads them, the lead time, the device, and the grids (their storage and version
    counter: a grid moved or written to is another key).

    Parameters
    ----------
    self : Any
        The DLWP model
    times : np.ndarray
        Times (datetime64), one per sample
    lead_time : timedelta
        Offset from each time
    device : torch.device | str, optional
        Device of the result, by default "cuda"

    Returns
    -------
    Hashable
        The key
    """
    from earth2studio.models.px import dlwp

    grids = tuple(
        (g.device, g.data_ptr(), _torch.tensor_version(g), tuple(g.shape), g.dtype)
        for g in (self.latgrid, self.longrid)
    )
    return (
        tuple(dlwp.timearray_to_datetime(times)),
        lead_time,
        torch.device(device),
        grids,
    )


DLWP_ZENITH = MethodPatch(
    name="get_cosine_zenith_fields",
    replacement=dlwp_cosine_zenith_fields,
    # Earth2Studio 0.19's DLWP.get_cosine_zenith_fields
    source="489b0cb4d863dffc",
    why=(
        "one zenith field per distinct time, not per member, and once per session: "
        "every step of a rollout asks for its initial times' fields"
    ),
    key=dlwp_zenith_key,
)


def rolled(
    x: torch.Tensor, shifts: tuple[int, ...], dims: tuple[int, ...]
) -> torch.Tensor:
    """``torch.roll(x, shifts, dims)`` as two slices concatenated per dimension.

    The same values bit for bit (it moves elements, computes none). Aurora's
    first cyclic shift, fused into the window partition after it, compiled wrong
    at the published model's 90x180 stage (torch 2.11, Triton 3.6, an H200:
    Triton miscompiles the kernel's 32-bit index arithmetic,
    docs/bench/2026-11-30-h200-thirtythird); this form compiled right there.

    Parameters
    ----------
    x : torch.Tensor
        Tensor to shift
    shifts, dims : tuple[int, ...]
        Shift per dimension and the dimensions, as :func:`torch.roll` takes them

    Returns
    -------
    torch.Tensor
        The shifted tensor
    """
    for shift, dim in zip(shifts, dims, strict=True):
        size = x.shape[dim]
        shift %= size
        if shift:
            tail = x.narrow(dim, size - shift, shift)
            x = torch.cat([tail, x.narrow(dim, 0, size - shift)], dim=dim)
    return x


def aurora_swin_block_forward(
    self: Any,
    x: torch.Tensor,
    c: torch.Tensor,
    res: tuple[int, int, int],
    rollout_step: int,
    warped: bool = True,
) -> torch.Tensor:
    """microsoft-aurora 2.0.1's ``Swin3DTransformerBlock.forward``, its cyclic
    shifts done by :func:`rolled` instead of :func:`torch.roll`.

    Otherwise upstream's code line for line, with upstream's own functions: the
    same values bit for bit in eager; compiled on CUDA it gives eager's answer where
    upstream's gave another (:func:`rolled`).

    Parameters
    ----------
    self : Any
        The Swin block
    x : torch.Tensor
        Input tokens ``(B, L, D)``
    c : torch.Tensor
        Conditioning context ``(B, D)``
    res : tuple[int, int, int]
        Resolution of ``x``
    rollout_step : int
        Roll-out step (read by LoRA only)
    warped : bool, optional
        Connect the left and right sides, by default True

    Returns
    -------
    torch.Tensor
        Output tokens
    """
    from aurora.model import swin3d

    C, H, W = res
    B, L, D = x.shape
    assert L == C * H * W, f"Wrong feature size: {L} vs {C}x{H}x{W}={C * H * W}"
    ws, ss = swin3d.maybe_adjust_windows(self.window_size, self.shift_size, res)
    shortcut = x
    x = x.view(B, C, H, W, D)
    shifted = not all(s == 0 for s in ss)
    if shifted:
        shifted_x = rolled(x, (-ss[0], -ss[1], -ss[2]), (1, 2, 3))
        attn_mask, _ = swin3d.compute_3d_shifted_window_mask(
            C, H, W, ws, ss, x.device, x.dtype, warped=warped
        )
    else:
        shifted_x = x
        attn_mask = None
    pad_size = ((-C) % ws[0], (-H) % ws[1], (-W) % ws[2])
    shifted_x = swin3d.pad_3d(shifted_x, pad_size)
    x_windows = swin3d.window_partition_3d(shifted_x, ws)
    x_windows = x_windows.view(-1, ws[0] * ws[1] * ws[2], D)
    attn_windows = self.attn(x_windows, mask=attn_mask, rollout_step=rollout_step)
    attn_windows = attn_windows.view(-1, ws[0], ws[1], ws[2], D)
    _, pad_C, pad_H, pad_W, _ = shifted_x.shape
    shifted_x = swin3d.window_reverse_3d(attn_windows, ws, pad_C, pad_H, pad_W)
    shifted_x = swin3d.crop_3d(shifted_x, pad_size)
    x = rolled(shifted_x, ss, (1, 2, 3)) if shifted else shifted_x
    x = x.reshape(B, C * H * W, D)
    x = shortcut + self.drop_path(self.norm1(x, c))
    x = x + self.drop_path(self.norm2(self.mlp(x), c))
    return x


AURORA_SWIN_SHIFT = MethodPatch(
    name="forward",
    replacement=aurora_swin_block_forward,
    # microsoft-aurora 2.0.1's Swin3DTransformerBlock.forward
    source="4a9344e920396414",
    why=(
        "cyclic shifts as two slices concatenated: Triton 3.6 compiled "
        "Inductor's kernel for torch.roll and the window partition wrong at the "
        "published size (torch 2.11)"
    ),
    submodules="Swin3DTransformerBlock",
)
