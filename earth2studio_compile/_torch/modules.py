"""Private attributes of modules and tensors, and running a module outside a trace.

The slot ``nn.Module.compile()`` fills, a module's own call past it, a tensor's
version counter, whether anything else holds a tensor's storage, what marks a
``torch.compile``'d module; and for opaque submodules
(run on meta tensors to learn their output shapes), leaving fake-tensor tracing and
swapping a module's parameters for a block.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

# The slot ``nn.Module.compile()`` fills: ``nn.Module.__call__`` calls it instead of
# ``_call_impl`` when set, so hooking it leaves parameters and forward untouched.
MODULE_SLOT = "_compiled_call_impl"


def call_module(module: torch.nn.Module, args: Any, kwargs: Any) -> Any:
    """The module's own call (hooks included), past a region in :data:`MODULE_SLOT`.

    Parameters
    ----------
    module : torch.nn.Module
        The module to call
    args, kwargs : tuple, dict
        Its positional and keyword arguments

    Returns
    -------
    Any
        The module's output
    """
    return module._call_impl(*args, **kwargs)


def tensor_version(t: torch.Tensor) -> int:
    """The tensor's in-place version counter: it changes when the tensor is mutated
    (not kept by inference tensors, which raise)."""
    return t._version


def storage_holders(t: torch.Tensor) -> int:
    """References to ``t``'s storage (tensors and views, numpy arrays made from
    them), as PyTorch counts them: :func:`storage_shared` compares it with a lone
    tensor's (PyTorch has no public name for this count)."""
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


def storage_shared(t: torch.Tensor) -> bool:
    """Whether anything but ``t`` itself holds its storage: a view, or a numpy
    array made from one (an in-memory Zarr store keeps those)."""
    return storage_holders(t) > _lone_holders()


@functools.cache
def _lone_holders() -> int:
    # What the count reads for a tensor alone (the Python storage object counts).
    return storage_holders(torch.empty(1))


def is_optimized_module(module: torch.nn.Module) -> bool:
    """Already wrapped by ``torch.compile(module)`` (an ``OptimizedModule``)."""
    return hasattr(module, "_orig_mod") and hasattr(module, "dynamo_ctx")


def real_tensors() -> contextlib.AbstractContextManager[Any]:
    """Leave fake-tensor tracing for a block (to run a module on meta tensors)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def reparametrized(
    module: torch.nn.Module, state: dict[str, torch.Tensor]
) -> contextlib.AbstractContextManager[Any]:
    """``module`` with its parameters and buffers swapped for ``state`` in a block.

    ``torch.func.functional_call`` does this for one call; the meta-tensor run
    calls the module's saved ``forward`` instead, so the swap itself is needed.

    Parameters
    ----------
    module : torch.nn.Module
        The module whose tensors are swapped
    state : dict[str, torch.Tensor]
        Tensors by qualified name (``named_parameters``/``named_buffers`` names)

    Returns
    -------
    contextlib.AbstractContextManager[Any]
        The block's context manager; leaving it restores the module's own tensors
    """
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, state)


def held_tensors(module: torch.nn.Module) -> list[tuple[torch.nn.Module, str, Any]]:
    """Every tensor ``module``'s tree holds besides its parameters: its buffers and
    plain tensor attributes (set by ``self.name = tensor`` in a forward).

    Parameters
    ----------
    module : torch.nn.Module
        The root of the tree (each submodule once)

    Returns
    -------
    list[tuple[torch.nn.Module, str, Any]]
        ``(submodule, name, tensor)`` for each
    """
    held: list[tuple[torch.nn.Module, str, Any]] = []
    for m in module.modules():
        held.extend((m, n, t) for n, t in m._buffers.items() if t is not None)
        held.extend(
            (m, n, v)
            for n, v in vars(m).items()
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)
        )
    return held


def set_held_tensor(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Put ``tensor`` where ``module`` holds ``name``: its buffers, or its
    ``__dict__`` for a plain attribute (no hook, no new buffer).

    Parameters
    ----------
    module : torch.nn.Module
        The submodule
    name : str
        The buffer's or attribute's name
    tensor : torch.Tensor
        What it holds from now on
    """
    if name in module._buffers:
        module._buffers[name] = tensor
    else:
        vars(module)[name] = tensor
