"""What a build process gets of a region's module: a copy without the region.

A background build (:mod:`.background`) hands the child process a deep copy of the
live module, made on a thread, and checks first, on the caller's step, that the
module's structure can be pickled at all, and with which pickler: Python's own, or
cloudpickle where only it can (a function held as an attribute: Aurora's Swin
attention keeps ``lambda *args, **kwargs: 0`` in place of its LoRA layers, and a
forecast of it compiled all six stages on its first call, minutes, for want of a
build process). Both leave out what a region installed on the module (its
compiled-call slot, wrapped ``forward`` methods) and the model table's method
patches set on it (the child sets those of its target itself): those hold locks,
the report and closures, and the child builds the bare module.
"""

from __future__ import annotations

import copy
import io
import pickle
from types import ModuleType
from typing import Any

import torch

from earth2studio_compile._torch import MODULE_SLOT
from earth2studio_compile.patches import patch_of

__all__ = ["HOOK_MARK", "check_picklable", "installed", "snapshot_module"]

#: Marks a function that a region installs on a module (``forward`` wrappers):
#: what a copy of the module for the build must not carry.
HOOK_MARK = "_earth2studio_compile_hook"


def _set_on(m: torch.nn.Module) -> list[str]:
    """Names of ``m``'s instance attributes a region's hooks (a wrapped
    ``forward``) or the table's method patches set: never copied to a build."""
    names = [n for n, v in m.__dict__.items() if patch_of(v) is not None]
    forward = m.__dict__.get("forward")
    if forward is not None and getattr(forward, HOOK_MARK, False):
        names.append("forward")
    return names


def installed(module: torch.nn.Module) -> set[int]:
    """Ids of what a region installed on ``module``: not part of its copy.

    Parameters
    ----------
    module : torch.nn.Module
        The region's module, hooks installed or not

    Returns
    -------
    set[int]
        ``id`` of each installed object
    """
    ids = set()
    for m in module.modules():
        if m.__dict__.get(MODULE_SLOT) is not None:
            ids.add(id(m.__dict__[MODULE_SLOT]))
        ids.update(id(m.__dict__[name]) for name in _set_on(m))
    return ids


def snapshot_module(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``module`` without what a region installed on it.

    The copy shares nothing with the live module (its tensors are copies on the
    same device), so the build may trace and patch it freely.

    Parameters
    ----------
    module : torch.nn.Module
        The region's module

    Returns
    -------
    torch.nn.Module
        The copy
    """
    memo: dict[int, Any] = {}
    for m in module.modules():
        slot = m.__dict__.get(MODULE_SLOT)
        if slot is not None:
            memo[id(slot)] = None
    clone = copy.deepcopy(module, memo)
    for m in clone.modules():
        if MODULE_SLOT in m.__dict__ and m.__dict__[MODULE_SLOT] is None:
            del m.__dict__[MODULE_SLOT]
        for name in _set_on(m):
            del m.__dict__[name]
    return clone


def _dump_structure(pickler: ModuleType, payload: Any, skip: set[int]) -> None:
    """Pickle ``payload`` with ``pickler``'s ``Pickler`` into nothing: tensors, and
    the objects in ``skip``, stand for themselves by id (no tensor data written)."""

    class NoData(pickler.Pickler):  # type: ignore[name-defined,misc]
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(
                obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)
            ):
                return id(obj)
            return id(obj) if id(obj) in skip else None

    NoData(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(payload)


def check_picklable(payload: Any, skip: set[int]) -> ModuleType:
    """The pickler that can hand ``payload`` to a build process: :mod:`pickle`, or
    ``cloudpickle`` (a dependency of this package; ImportError aside) where only
    it can; raises where neither can. Writes no tensor data.

    Milliseconds, on the caller's step, not in the child. Python's pickle fails on
    a lambda or a function defined in a function (cloudpickle stores those by
    value, for the child's interpreter, which runs the same code), both on an open
    file or a lock.

    Parameters
    ----------
    payload : Any
        What the build process will be given
    skip : set[int]
        Ids of objects to leave out (:func:`installed`)

    Returns
    -------
    ModuleType
        The module to pass to ``torch.save`` as ``pickle_module`` (``torch.load``
        reads either with Python's own)
    """
    try:
        _dump_structure(pickle, payload, skip)
        return pickle
    except Exception as err:
        try:
            import cloudpickle
        except ImportError:
            raise err from None
        try:
            _dump_structure(cloudpickle, payload, skip)
        except Exception:
            raise err from None  # Python's reason: what to change in the model
        return cloudpickle
