"""What compiled code is given at a call, and how its effects get back to the caller.

:class:`Call` is one call's arguments with their device and batch size;
:class:`StagedCall` the arguments compiled code sees (copies, a padded batch) and
the way back (mutations written to the caller's tensors, outputs cut back);
:class:`BatchPadding` the region's choice to pad a smaller batch instead of
compiling again.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from earth2studio_compile import _torch
from earth2studio_compile._torch import tree_flatten, tree_map


def first_device(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    module: torch.nn.Module | None = None,
) -> torch.device:
    """The device a call runs on: its first tensor argument's.

    Parameters
    ----------
    args, kwargs : tuple[Any, ...], dict[str, Any]
        The call's arguments, searched in order (nested containers too)
    module : torch.nn.Module | None, optional
        The module called: without a tensor argument, its first parameter's or
        buffer's device

    Returns
    -------
    torch.device
        That device; the CPU when neither has a tensor
    """
    leaves, _ = tree_flatten((args, kwargs))
    tensors: Iterator[torch.Tensor] = (
        leaf for leaf in leaves if isinstance(leaf, torch.Tensor)
    )
    if module is not None:
        tensors = itertools.chain(tensors, module.parameters(), module.buffers())
    for t in tensors:
        return t.device
    return torch.device("cpu")


@dataclass(frozen=True)
class Call:
    """One call's arguments, with what the region derives from them once."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    device: torch.device
    batch: int | None

    @classmethod
    def of(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
        """The call, its device (first tensor's) and batch size (dim 0).

        Parameters
        ----------
        args, kwargs : tuple[Any, ...], dict[str, Any]
            The caller's positional and keyword arguments, kept as they are

        Returns
        -------
        Call
        """
        return cls(args, kwargs, first_device(args, kwargs), batch_size(args))


def clone_tensor(t: Any) -> Any:
    return t.clone() if isinstance(t, torch.Tensor) else t


def no_grad_if_enabled() -> contextlib.AbstractContextManager[Any]:
    # Earth2Studio cores run under inference_mode or no_grad; a core called with
    # grad enabled would trace an autograd graph it never uses. no_grad rather
    # than inference_mode keeps outputs usable by later in-place eager code.
    return torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext()


class StagedCall:
    """The positional arguments compiled code is given, and the way back.

    Compiled code sometimes needs other tensors than the caller's: a copy of a
    normal tensor under inference mode (the first step's input; every later one is
    an inference tensor, and Dynamo would recompile on the difference), or a batch
    padded to the compiled size. Whatever is copied, the caller must see exactly
    what eager would do: in-place updates to a copy (a stateful core updating its
    state argument) are written back to the caller's tensor, and an output that *is*
    a copy is replaced by the caller's tensor.

    Parameters
    ----------
    args : tuple[Any, ...]
        The caller's positional arguments
    copy_normal : bool
        Copy tensors that are not inference tensors (the call runs in inference mode)
    pad_to : int | None
        Pad every positional tensor's dim 0 up to this size (repeating the first
        sample keeps padded rows inside the model's valid input range)
    batch : int | None
        The caller's batch (dim 0), which outputs of a padded call are cut back to
    """

    def __init__(
        self,
        args: tuple[Any, ...],
        copy_normal: bool,
        pad_to: int | None = None,
        batch: int | None = None,
    ) -> None:
        self.originals = args
        self.pad_to = pad_to
        self.batch = batch
        work: list[Any] = []
        for a in args:
            w = a
            if isinstance(a, torch.Tensor):
                if copy_normal and not a.is_inference():
                    w = a.clone()
                if pad_to is not None and a.ndim and a.shape[0] < pad_to:
                    extra = w[:1].expand(pad_to - a.shape[0], *a.shape[1:])
                    w = torch.cat([w, extra], dim=0)
            work.append(w)
        self.args = tuple(work)
        # Inference tensors (copies made in inference mode) keep no version counter:
        # for those, a changed value is what tells a mutation.
        self._versions = [
            None if w is a else (-1 if w.is_inference() else _torch.tensor_version(w))
            for a, w in zip(args, self.args)
        ]

    def finish(self, out: Any) -> Any:
        """Hand mutations of copies back to the caller's tensors; map outputs back.

        Outputs of a padded call are cut back to the caller's batch first.
        """
        if self.pad_to is not None:
            out = tree_map(self._unpad, out)
        for a, w, version in zip(self.originals, self.args, self._versions):
            if version is None:
                continue
            src = w[: a.shape[0]] if w.shape != a.shape else w
            if version >= 0 and _torch.tensor_version(w) == version:
                continue
            if version < 0 and torch.equal(src, a):
                continue
            with torch.no_grad():
                a.copy_(src)
        copies = {id(w): a for a, w in zip(self.originals, self.args) if w is not a}
        if not copies:
            return out
        return tree_map(
            lambda t: copies.get(id(t), t) if isinstance(t, torch.Tensor) else t, out
        )

    def _unpad(self, t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.ndim and t.shape[0] == self.pad_to:
            return t[: self.batch]
        return t


class BatchPadding:
    """Pads a smaller batch (dim 0) up to the first call's instead of recompiling.

    Only for cores whose samples do not interact (the table's ``pad_batch``).

    Parameters
    ----------
    enabled : bool
        Whether the region pads at all
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.size: int | None = None

    def pad_to(self, batch: int | None) -> int | None:
        """The size to pad a call of ``batch`` samples to; None to run it as is."""
        if not self.enabled or batch is None:
            return None
        if self.size is None:
            self.size = batch
        return self.size if batch < self.size else None

    def needed(self, batch: int | None) -> bool:
        """Whether a call of ``batch`` samples differs from the compiled batch."""
        return self.enabled and self.size is not None and batch not in (None, self.size)


def batch_size(args: tuple[Any, ...]) -> int | None:
    """Size of dim 0 shared by every positional tensor argument, if any."""
    sizes = {a.shape[0] for a in args if isinstance(a, torch.Tensor) and a.ndim}
    return sizes.pop() if len(sizes) == 1 else None
