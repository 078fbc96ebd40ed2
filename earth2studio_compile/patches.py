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
    "MethodPatch",
    "Patches",
    "dlwp_cosine_zenith_fields",
    "dlwp_zenith_key",
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
    """

    name: str
    replacement: Callable[..., Any]
    source: str
    why: str = ""
    key: Callable[..., Hashable] | None = None


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

    def install(self) -> None:
        """Set each replacement on its model instance."""
        for model, patch in self.pending:
            bound = types.MethodType(_guarded(patch), model)
            model.__dict__[patch.name] = bound
            self.installed.append((model, patch.name, bound))

    def restore(self) -> None:
        """Remove what :meth:`install` set: no instance attribute is left."""
        for model, name, bound in reversed(self.installed):
            if model.__dict__.get(name) is bound:
                del model.__dict__[name]
        self.installed = []


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
