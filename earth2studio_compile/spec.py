"""What one model's table entry says: :class:`ModelSpec` (the dotted paths of its
tensor-only core network(s), or why it runs eagerly, and how they compile), and the
checks made of it.

The entries themselves are :mod:`earth2studio_compile.models`'s table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from earth2studio_compile.options import (
    TableAttention,
    TableOptions,
    attention_backends,
)
from earth2studio_compile.patches import MethodPatch, on_submodules

__all__ = ["ModelSpec", "check_paths", "region_patches", "unused_arguments"]


@dataclass(frozen=True)
class ModelSpec:
    """What to compile in one model class.

    Parameters
    ----------
    regions : tuple[str, ...], optional
        Dotted attribute paths of the ``nn.Module`` cores to compile in place, e.g.
        ``("model",)``. Empty means the model runs eagerly and ``reason`` says why.
    reason : str | None, optional
        Why the model is not compiled (required when ``regions`` is empty)
    exclude : tuple[str, ...], optional
        Class names of submodules kept eager by splitting the region: its largest
        subtrees without them compile, each as its own graph
    opaque : tuple[str, ...], optional
        Class names of submodules kept eager *inside* the region: each call becomes
        one opaque operator in a single compiled graph (and CUDA graph), see
        :mod:`earth2studio_compile.opaque`. They must take and return tensors only
    cudagraphs : bool, optional
        With the default ``mode=None`` on CUDA, compile with CUDA graphs
        (``"reduce-overhead"``). False picks Inductor's default mode instead, for
        models where replaying graphs costs more than it saves (measured, see the
        note), by default True
    inductor_options : Mapping | Callable[..., Mapping] | None, optional
        Inductor options for this model, or a function returning them of the
        device, or of the device and the region's precision (``"tf32"``, ...;
        None: PyTorch's flags as they are), used when the user chose neither
        ``mode`` nor ``options``, by default None
    attention_backends : tuple[str, ...] | Callable | None, optional
        The SDPA backends (``torch.nn.attention.SDPBackend`` names: ``"math"``,
        ...) the regions' compiled code is traced and lowered with, or a function
        of the device and the region's precision giving them (empty: PyTorch's
        choice); eager calls keep the user's. ``"flex"`` makes the SDPA calls
        FlexAttention can serve FlexAttention in the traced graph (the other names
        serve the rest) on CUDA (elsewhere the other names serve every call);
        such regions compile on the Dynamo path only, with no ahead-of-time
        artifact. A choice the graph keeps, so it is part of the
        compiled code's cache keys, by default None
    pad_batch : bool, optional
        The core treats batch samples independently, so a smaller batch (an
        ensemble's last one) is padded to the compiled size instead of recompiling
    wrapped : tuple[str, ...], optional
        Paths of models this model wraps (``"dx_model.*"`` for each element of a
        list); their own table entries apply under that prefix
    fp32_modules : tuple[str, ...], optional
        Class names of submodules kept in fp32, outside autocast, when a session
        runs the model in ``"bf16"`` (spectral convolutions: complex bf16 FFTs are
        not supported, and their error would dominate)
    precisions_refused : Mapping[str, str], optional
        Precisions this model must not run in, each with the reason; a session
        asked for one runs the model with PyTorch's global settings and says why
    devices_refused : Mapping[str, str], optional
        Device types (``"cuda"``) this model's regions are not compiled on, each
        with the reason (a wrong answer measured there and not yet explained): a
        region's first call on one runs eagerly from then on, and the session warns
        once per model
    covers : tuple[str, ...], optional
        Paths of further submodules whose parameters the entry describes (an eager
        entry's network, say). A subclass that matches the entry only through a base
        class and holds parameters outside ``regions``, ``wrapped`` and ``covers``
        is not what the entry describes: it takes the generic path
    patches : tuple[MethodPatch, ...], optional
        Bitwise-identical replacements for the model's own methods, set on the
        instance while a session is open (:mod:`earth2studio_compile.patches`)
    unused_arguments : Mapping[str, tuple[str, ...]], optional
        Non-tensor parameters of a region's ``forward``, each with the class names
        of the submodules that read it: in a region holding none of them its
        value changes nothing, and an ahead-of-time artifact built for one value
        serves every value (export bakes values in; otherwise each value is
        another artifact)
    quiet_nvtx : bool, optional
        Make ``torch.cuda.nvtx``'s range and mark functions no-ops for the
        duration of each of the regions' calls (:mod:`earth2studio_compile.nvtx`),
        for cores that mark NVTX ranges where CUDA is available: Dynamo cannot put
        those calls in a graph, and each one breaks it (physicsnemo's HEALPix
        padding broke DLESyM's at every pad). A profile then shows no such ranges
        while the regions run, by default False
    note : str, optional
        Where the core comes from, for the documentation table
    """

    regions: tuple[str, ...] = ()
    reason: str | None = None
    exclude: tuple[str, ...] = ()
    opaque: tuple[str, ...] = ()
    cudagraphs: bool = True
    inductor_options: TableOptions = field(default=None, compare=False)
    attention_backends: TableAttention = field(default=None, compare=False)
    pad_batch: bool = False
    wrapped: tuple[str, ...] = ()
    fp32_modules: tuple[str, ...] = ()
    precisions_refused: Mapping[str, str] = field(default_factory=dict, compare=False)
    devices_refused: Mapping[str, str] = field(default_factory=dict, compare=False)
    covers: tuple[str, ...] = ()
    patches: tuple[MethodPatch, ...] = field(default=(), compare=False)
    unused_arguments: Mapping[str, tuple[str, ...]] = field(
        default_factory=dict, compare=False
    )
    quiet_nvtx: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        for name in (
            "regions",
            "exclude",
            "opaque",
            "wrapped",
            "fp32_modules",
            "covers",
        ):
            object.__setattr__(self, name, check_paths(getattr(self, name), name))
        if not all(isinstance(p, MethodPatch) for p in self.patches):
            raise TypeError(
                f"patches must hold MethodPatch objects, got {self.patches!r}"
            )
        object.__setattr__(self, "patches", tuple(self.patches))
        if self.attention_backends is not None and not callable(
            self.attention_backends
        ):
            object.__setattr__(
                self,
                "attention_backends",
                attention_backends(self.attention_backends, "attention_backends"),
            )
        if not self.regions and not self.wrapped and not self.reason:
            raise ValueError(
                "A ModelSpec without regions needs a reason saying why the model "
                "runs eagerly."
            )

    def refused_on(self, device: torch.device) -> str | None:
        """Why this model is not compiled on ``device`` (``devices_refused``), as
        a region's report and :func:`~earth2studio_compile.build` say it; None
        where it is compiled.

        Parameters
        ----------
        device : torch.device
            Where the regions run

        Returns
        -------
        str | None
            ``"not compiled on <type>: <reason>"``, or None
        """
        why = self.devices_refused.get(device.type)
        return None if why is None else f"not compiled on {device.type}: {why}"


def unused_arguments(spec: ModelSpec, core: torch.nn.Module) -> tuple[str, ...]:
    """The parameters of ``core``'s ``forward`` that ``spec`` says it does not
    read: those whose reading submodules it holds none of.

    Parameters
    ----------
    spec : ModelSpec
        The model's table entry
    core : torch.nn.Module
        One of its regions' cores

    Returns
    -------
    tuple[str, ...]
        The parameter names, sorted
    """
    held = {type(m).__name__ for m in core.modules()}
    named = spec.unused_arguments.items()
    return tuple(sorted(n for n, readers in named if not held & set(readers)))


def region_patches(spec: ModelSpec, core: torch.nn.Module) -> tuple[MethodPatch, ...]:
    """The entry's patches for submodules ``core`` holds: the code its compiled
    calls run, which a build in another process sets on its copy of the core.

    Parameters
    ----------
    spec : ModelSpec
        The model's table entry
    core : torch.nn.Module
        One of its regions' cores

    Returns
    -------
    tuple[MethodPatch, ...]
        Those patches, in the entry's order
    """
    # One rule for which submodule a patch is for: the one that sets it.
    return tuple(dict.fromkeys(p for _, p in on_submodules(spec.patches, core)))


def check_paths(value: Any, name: str) -> tuple[str, ...]:
    """Validate a tuple of dotted paths or class names (``regions=``, ``exclude=``...).

    Parameters
    ----------
    value : Any
        What the caller passed
    name : str
        The parameter's name, for the error

    Returns
    -------
    tuple[str, ...]
        The names as a tuple

    Raises
    ------
    TypeError
        ``value`` is a bare string, not a sequence, or holds a non-string or an
        empty string
    """
    if isinstance(value, str):
        raise TypeError(
            f"{name} must be a tuple of strings, got the str {value!r}. "
            f"Write {name}=({value!r},)."
        )
    if not isinstance(value, (tuple, list)):
        raise TypeError(
            f"{name} must be a tuple of strings, got {type(value).__name__} "
            f"({value!r}). For example {name}=('model',)."
        )
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise TypeError(
                f"{name} must hold non-empty strings (dotted submodule paths such as "
                f"'model' or 'net.blocks.0'), got {item!r} in {tuple(value)!r}."
            )
    return tuple(value)
