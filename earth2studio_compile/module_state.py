"""Tensor state a region's modules keep on themselves, kept out of CUDA-graph memory.

Some cores keep a recurrent state on a module instead of returning it:
physicsnemo's ``ConvGRUBlock`` (DLESyM's atmosphere decoder) assigns
``self.h = h_next`` in its forward. Under CUDA graph trees every tensor a compiled
call makes lives in the graph pool, which the next replay overwrites. The region
clones what a call returns; a tensor the call assigned to a module stays there, and
the next call, compiled or the eager fallback, reads memory that is no longer its
(PyTorch raises "accessing tensor output of CUDAGraphs that has been overwritten").

So a region notes what each executor's first call replaced among its modules'
buffers and plain tensor attributes (:class:`HeldTensors`). Where that call ran
CUDA graphs, the region clones the new tensors out of the pool at once
(:func:`take_out`) and compiles the region again without CUDA graphs, in Inductor's
default mode (``earth2studio_compile.first_call``), with an INFO line. Why not
keep CUDA graphs and clone the state after every replay: each call would scan
every module for reassigned tensors and copy them on the steady path; and the
state is the next call's input, which CUDA graph trees re-record for when it is a
static input (as Dynamo marks modules' buffers) at a new address every call. A
region without CUDA graphs costs its launch overhead, but no memory of a pool ever
reaches a module after its first call. The eager fallback and the session's close
take out whatever a CUDA-graph executor left (:meth:`HeldTensors.changed`), so the
eager call and the user's later use read the module's own memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from loguru import logger

from earth2studio_compile import _torch

__all__ = ["HeldTensor", "HeldTensors", "describe", "take_out"]


@dataclass(frozen=True)
class HeldTensor:
    """One tensor a module holds: a buffer or a plain tensor attribute.

    Attributes
    ----------
    module : torch.nn.Module
        The submodule holding it
    path : str
        The attribute's dotted path from the region's module, for messages
    tensor : torch.Tensor
        The tensor it holds now
    """

    module: torch.nn.Module
    path: str
    tensor: torch.Tensor

    @property
    def name(self) -> str:
        """The attribute's name on :attr:`module`."""
        return self.path.rsplit(".", 1)[-1]


class HeldTensors:
    """Which tensor each buffer and plain tensor attribute of a module tree held
    when it was made, weakly (it keeps no replaced state alive).

    Parameters
    ----------
    module : torch.nn.Module
        The region's module
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._held: dict[tuple[int, str], Callable[[], torch.Tensor | None]] = {
            (id(m), n): weakref.ref(t) for m, n, t in _torch.held_tensors(module)
        }

    def changed(self) -> list[HeldTensor]:
        """The buffers and tensor attributes that hold another tensor now (or are
        new), with the tensor each holds now.

        Returns
        -------
        list[HeldTensor]
            In the order of the module tree
        """
        paths = {id(m): p for p, m in self.module.named_modules()}
        out = []
        for m, n, t in _torch.held_tensors(self.module):
            ref = self._held.get((id(m), n))
            if ref is None or ref() is not t:
                path = f"{paths[id(m)]}.{n}" if paths.get(id(m)) else n
                out.append(HeldTensor(m, path, t))
        return out


def take_out(changed: Sequence[HeldTensor]) -> None:
    """Replace each tensor with a clone of its own memory (as an inference tensor
    where it was one, so compiled code's guards see the kind they saw).

    A tensor whose memory was already overwritten (read only after a later
    replay) cannot be copied: it stays, and the log says so at DEBUG.

    Parameters
    ----------
    changed : Sequence[HeldTensor]
        What :meth:`HeldTensors.changed` found
    """
    for held in changed:
        t = held.tensor
        try:
            with torch.inference_mode(t.is_inference()), torch.no_grad():
                copy = t.clone()
        except RuntimeError as err:
            logger.debug(f"{held.path}: not copied out of CUDA-graph memory ({err})")
            continue
        _torch.set_held_tensor(held.module, held.name, copy)


def describe(changed: Sequence[HeldTensor], limit: int = 3) -> str:
    """The reassigned attributes in words, e.g. ``decoder.0.recurrent.h``.

    Parameters
    ----------
    changed : Sequence[HeldTensor]
        What :meth:`HeldTensors.changed` found
    limit : int, optional
        Paths named before "and N more", by default 3

    Returns
    -------
    str
        The paths, comma-separated
    """
    paths = [h.path for h in changed]
    text = ", ".join(paths[:limit])
    if len(paths) > limit:
        text += f" and {len(paths) - limit} more"
    return text
