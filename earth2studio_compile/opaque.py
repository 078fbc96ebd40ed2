"""Submodules kept eager inside a compiled region, each called as one opaque operator.

Some submodules cannot go through Inductor: torch-harmonics' spherical-harmonic
transforms and spectral convolutions do complex64 arithmetic, which Inductor cannot
generate Triton code for on CUDA (``KeyError: 'complex64'``). Splitting the region
around them (:attr:`~earth2studio_compile.ModelSpec.exclude`) leaves many small
graphs with eager glue between them, and each CUDA-graph replay copies its inputs
and clones its outputs: on SFNO that ran slower than eager.

Here such a submodule is instead called through one custom operator
(``torch.ops.earth2studio_compile.opaque``). Dynamo records the call as a single
node, Inductor compiles everything around it into one graph, and the opaque call's
own eager kernels run between CUDA graphs of the compiled parts (Inductor's graph
partitions), since eager code we do not control may not be capturable. Output shapes
for tracing come from running the submodule on ``meta`` tensors, so nothing runs
twice on the device.

The submodule's ``forward`` is overridden on the instance while a session is open
and restored exactly afterwards; parameters, buffers and ``state_dict`` keys are
never touched.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from earth2studio_compile import _torch

__all__ = ["OpaqueSubmodule", "find_opaque"]

_FORWARD = "forward"
# Handles are plain ints so Dynamo can bake them into the graph as constants. They
# are derived from what the operator is (its label), never from a process-wide
# counter, so the compiled graph, and Inductor's cache key for it, do not depend on
# the order in which sessions were created.
_MODULES: dict[int, OpaqueSubmodule] = {}


def _handle(label: str, module: torch.nn.Module) -> int:
    """A stable handle for ``label``; the next free one if another live module has it.

    Two *open* sessions on two instances of one model class share labels; only
    then does the second get a different handle (and a graph of its own).
    """
    digest = hashlib.sha256(label.encode()).digest()
    handle = int.from_bytes(digest[:6], "big")
    while handle in _MODULES and _MODULES[handle].module is not module:
        handle += 1
    return handle


# (shape, stride, dtype) of each tensor input: hashable, so Dynamo can pass it as a
# constant to the structure query below.
TensorSpec = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]


def find_opaque(
    module: torch.nn.Module, classes: Sequence[str]
) -> list[tuple[str, torch.nn.Module]]:
    """Outermost submodules of ``module`` whose class name is in ``classes``.

    Parameters
    ----------
    module : torch.nn.Module
        A region's root module
    classes : Sequence[str]
        Class names, e.g. ``("SpectralConvS2",)``

    Returns
    -------
    list[tuple[str, torch.nn.Module]]
        ``(dotted path, submodule)`` pairs; nested matches are covered by their
        outermost ancestor
    """
    if not classes:
        return []
    found: list[tuple[str, torch.nn.Module]] = []

    def visit(prefix: str, mod: torch.nn.Module) -> None:
        for name, child in mod.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if type(child).__name__ in classes:
                found.append((path, child))
            else:
                visit(path, child)

    visit("", module)
    return found


class _Signature(NamedTuple):
    """What a call returns, for one set of input shapes: found once, at trace time."""

    is_tuple: bool
    # For each output, the index of the input it is (returned as is), or -1.
    alias: tuple[int, ...]
    # Meta tensors of the outputs that are not inputs: what the operator returns.
    fresh: tuple[torch.Tensor, ...]


def _signature(handle: int, specs: tuple[TensorSpec, ...]) -> _Signature:
    """Run the submodule's own forward on meta tensors once per input signature.

    Dynamo (the output structure) and fake-tensor tracing (the output shapes) both
    ask; the answer is kept on the submodule until the session ends.
    """
    op = _MODULES[handle]
    if specs in op.signatures:
        return op.signatures[specs]
    module = op.module
    with _torch.real_tensors(), torch.no_grad():
        inputs = [
            torch.empty_strided(shape, stride, dtype=dtype, device="meta")
            for shape, stride, dtype in specs
        ]
        state = {
            name: torch.empty_like(t, device="meta")
            for name, t in itertools.chain(
                module.named_parameters(remove_duplicate=False),
                module.named_buffers(remove_duplicate=False),
            )
        }
        with _torch.reparametrized(module, state):
            out = op.forward(*inputs)
    outs = _outputs(out, op.label)
    alias = tuple(next((k for k, t in enumerate(inputs) if o is t), -1) for o in outs)
    signature = _Signature(
        is_tuple=isinstance(out, (tuple, list)),
        alias=alias,
        fresh=tuple(o for o, k in zip(outs, alias) if k < 0),
    )
    op.signatures[specs] = signature
    return signature


def _specs(tensors: Sequence[torch.Tensor]) -> tuple[TensorSpec, ...]:
    return tuple((tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors)


def _outputs(out: Any, label: str) -> list[torch.Tensor]:
    tensors = list(out) if isinstance(out, (tuple, list)) else [out]
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError(
            f"{label} returned {type(out).__name__}; an opaque submodule must return a "
            "tensor or a tuple of tensors. Keep it out of the region with "
            "ModelSpec(exclude=...) instead of opaque=..."
        )
    return tensors


@torch.compiler.assume_constant_result
def _reject(problem: str) -> bool:
    raise TypeError(
        f"{problem}; an opaque submodule takes tensors only. Keep it out of the region "
        "with ModelSpec(exclude=...) instead of opaque=..."
    )


@torch.compiler.assume_constant_result
def _structure(
    handle: int, specs: tuple[TensorSpec, ...]
) -> tuple[bool, tuple[int, ...]]:
    """(returns a tuple?, per output the input it is or -1): a trace-time constant."""
    signature = _signature(handle, specs)
    return signature.is_tuple, signature.alias


# The submodule's eager code may do what CUDA-graph capture forbids (torch-harmonics'
# inverse FFT writes a host scalar into a device tensor), so Inductor must not capture
# it: with graph partitioning (torch >= 2.9) the compiled code around each call is
# captured as its own CUDA graph; without, Inductor skips CUDA graphs and the session
# reports that.
_UNSAFE = (
    (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()
)


@torch.library.custom_op("earth2studio_compile::opaque", mutates_args=(), tags=_UNSAFE)
def _opaque(inputs: list[torch.Tensor], handle: int) -> list[torch.Tensor]:
    op = _MODULES[handle]
    outs = _outputs(op.forward(*inputs), op.label)
    fresh: list[torch.Tensor] = []
    seen = {t.untyped_storage().data_ptr() for t in inputs}
    for o in outs:
        if any(o is t for t in inputs):
            continue  # the wrapper hands the input itself back
        # A custom operator's outputs may not share memory with its inputs or with
        # each other; copy the rare view that would.
        ptr = o.untyped_storage().data_ptr()
        if ptr in seen:
            o = o.clone()
        seen.add(o.untyped_storage().data_ptr())
        fresh.append(o)
    return fresh


@_opaque.register_fake
def _opaque_fake(inputs: list[torch.Tensor], handle: int) -> list[torch.Tensor]:
    return [
        inputs[0].new_empty_strided(o.shape, o.stride(), dtype=o.dtype)
        for o in _signature(handle, _specs(inputs)).fresh
    ]


class OpaqueSubmodule:
    """One submodule called as an opaque operator from compiled code.

    Parameters
    ----------
    module : torch.nn.Module
        The submodule to keep eager
    label : str
        Name for messages, e.g. ``"SFNO.model.sfno.blocks.0.global_conv"``
    """

    def __init__(self, module: torch.nn.Module, label: str) -> None:
        self.module = module
        self.label = label
        self.handle = -1  # assigned when installed: unique among live modules
        self.forward: Callable[..., Any] = module.forward
        self.signatures: dict[tuple[TensorSpec, ...], _Signature] = {}
        self._saved: tuple[bool, Any] | None = None

    def install(self) -> None:
        """Route the submodule's ``forward`` through the opaque operator."""
        if self._saved is not None:
            return
        d = self.module.__dict__
        self._saved = (_FORWARD in d, d.get(_FORWARD))
        self.forward = self.module.forward
        self.handle = _handle(self.label, self.module)
        _MODULES[self.handle] = self
        handle, label, forward = self.handle, self.label, self.forward

        def opaque_forward(*args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling():
                return forward(*args, **kwargs)
            if kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args):
                # Raised from a trace-time constant, not from traced code, which Dynamo
                # would turn into a silent graph break.
                _reject(f"{label} was called with non-tensor or keyword arguments")
            is_tuple, alias = _structure(handle, _specs(args))
            fresh = iter(_opaque(list(args), handle))
            outs = [args[k] if k >= 0 else next(fresh) for k in alias]
            return tuple(outs) if is_tuple else outs[0]

        # What a copy of the core for another process leaves out: the child
        # installs its own (artifacts.snapshot.HOOK_MARK).
        opaque_forward._earth2studio_compile_hook = True  # type: ignore[attr-defined]
        d[_FORWARD] = opaque_forward

    def restore(self) -> None:
        """Put ``forward`` back as it was: no key left in the instance ``__dict__``."""
        if self._saved is None:
            return
        had, value = self._saved
        d = self.module.__dict__
        if had:
            d[_FORWARD] = value
        else:
            d.pop(_FORWARD, None)
        self._saved = None
        self.signatures.clear()
        _MODULES.pop(self.handle, None)
