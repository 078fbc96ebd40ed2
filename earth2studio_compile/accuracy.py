"""What a reduced precision costs: one call against fp32 eager, measured once.

A region in ``"tf32"`` or ``"bf16"`` (:mod:`earth2studio_compile.precision`)
takes a :class:`Reference` before its first call and, after it, :func:`measure`s
the call's output against the same call in fp32 eager with TF32 off; the error is
reported, and WARNed when above the precision's documented threshold
(:data:`~earth2studio_compile.precision.THRESHOLDS`). The Dynamo executor checks
its first compiled call against a :class:`Reference` run in the region's own
precision (:meth:`Reference.run`), and gives its answer where they differ.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile._torch import tree_flatten, tree_map
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.precision import ENV, THRESHOLDS, scope

__all__ = ["Reference", "log_error", "measure"]


class Reference:
    """An eager reference for one call, taken from the state before the call.

    :meth:`before` copies the call's arguments, the module's buffers and the
    attributes of its modules before the call runs, so a core that updates its
    inputs or buffers in place, or sets a new state on itself (a counter, a
    recurrent state such as DLESyM's ConvGRU's ``self.h = ...``), is measured from
    the state the call started from, and is not updated twice: the reference runs
    on the copies, through ``_call_impl`` (not the region's slot), and the
    attributes the call left are put back after it.

    Parameters
    ----------
    module : torch.nn.Module
        The core
    args : tuple
        Copies of the call's positional arguments
    kwargs : dict
        Copies of its keyword arguments
    buffers : dict[str, torch.Tensor]
        Copies of the module's buffers
    attributes : list[tuple[torch.nn.Module, dict]], optional
        Each module of the tree with a copy of its own attributes (plain tensors
        cloned), by default none
    """

    def __init__(
        self,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        buffers: dict[str, torch.Tensor],
        attributes: list[tuple[torch.nn.Module, dict]] | None = None,
    ) -> None:
        self.module = module
        self.args = args
        self.kwargs = kwargs
        self.buffers = buffers
        self.attributes = attributes or []
        #: The attributes :meth:`run` left (the module keeps its own).
        self.left: list[tuple[torch.nn.Module, dict]] = []

    @classmethod
    def before(
        cls, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Reference:
        """Copy a call's arguments and ``module``'s buffers; call before the call.

        Parameters
        ----------
        module : torch.nn.Module
            The core about to be called
        args, kwargs : tuple[Any, ...], dict[str, Any]
            The call's arguments

        Returns
        -------
        Reference
            The reference, ready for :meth:`error`
        """
        args, kwargs = tree_map(_clone, (args, kwargs))
        buffers = {k: b.clone() for k, b in module.named_buffers()}
        return cls(module, args, kwargs, buffers, _attributes(module, clone=True))

    def error(self, out: Any, device: torch.device) -> float | None:
        """Relative L2 of ``out`` against the same call in fp32 eager, TF32 off.

        Runs the reference once, on the copies (the copies are used up).

        Parameters
        ----------
        out : Any
            The region's output for the call
        device : torch.device
            Where the call computed

        Returns
        -------
        float | None
            The largest relative L2 over the floating outputs; None if there are none
        """
        with scope("fp32", device):
            ref = self.run()
        got = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        want = [t for t in tree_flatten(ref)[0] if isinstance(t, torch.Tensor)]
        errors = [
            rel_l2(g.float(), w.float())
            for g, w in zip(got, want)
            if w.is_floating_point() and g.shape == w.shape
        ]
        return max(errors) if errors else None

    def run(self) -> Any:
        """The call, eager, on the copies, in the caller's precision settings.

        The copies are used up: the copied buffers and arguments take the updates
        of a core that updates them in place, and the attributes the call sets
        are kept apart (the module's are put back) for :meth:`restore`.

        Returns
        -------
        Any
            The module's output
        """
        state = {**dict(self.module.named_parameters()), **self.buffers}
        with (
            torch.no_grad(),
            _attributes_as(self.module, self.attributes) as self.left,
            _torch.reparametrized(self.module, state),
        ):
            return _torch.call_module(self.module, self.args, self.kwargs)

    def restore(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Make the state :meth:`run` left the live call's: its in-place updates
        of ``args``' and ``kwargs``' tensors and of the module's buffers, and the
        attributes it set, where its answer is used in place of another call's
        (compiled code found wrong) that updated them too.

        Parameters
        ----------
        args, kwargs : tuple[Any, ...], dict[str, Any]
            The live call's arguments, whose copies this reference holds
        """
        live, _ = tree_flatten((args, kwargs))
        copies, _ = tree_flatten((self.args, self.kwargs))
        with torch.no_grad():
            for a, c in zip(live, copies, strict=True):
                if isinstance(a, torch.Tensor) and a is not c:
                    a.copy_(c)
            for name, b in self.module.named_buffers():
                b.copy_(self.buffers[name])
        _set(self.left)


def _clone(t: Any) -> Any:
    return t.clone() if isinstance(t, torch.Tensor) else t


def _attributes(
    module: torch.nn.Module, clone: bool
) -> list[tuple[torch.nn.Module, dict]]:
    """Each module of ``module``'s tree with its own attributes (a shallow copy of
    its ``__dict__``; its plain tensors cloned where ``clone``: not its
    parameters, buffers or submodules, which live in dicts of their own)."""
    return [
        (
            m,
            {
                k: v.clone() if clone and type(v) is torch.Tensor else v
                for k, v in vars(m).items()
            },
        )
        for m in module.modules()
    ]


def _set(state: list[tuple[torch.nn.Module, dict]]) -> None:
    for m, attributes in state:
        for k in [k for k in vars(m) if k not in attributes]:
            del vars(m)[k]
        vars(m).update(attributes)


@contextlib.contextmanager
def _attributes_as(
    module: torch.nn.Module, saved: list[tuple[torch.nn.Module, dict]]
) -> Iterator[list[tuple[torch.nn.Module, dict]]]:
    """``module``'s tree with the attributes it had before the call (``saved``),
    and after the block those it has now, whatever the block set: the reference
    call leaves the forecast's state alone. Yields a list that a block ending
    without an exception fills with the attributes it left."""
    now = _attributes(module, clone=False)
    _set(saved)
    left: list[tuple[torch.nn.Module, dict]] = []
    try:
        yield left
        left.extend(_attributes(module, clone=False))
    finally:
        _set(now)


def log_error(label: str, precision: str, error: float | None) -> None:
    """WARN when a precision cost more accuracy than its documented threshold.

    Parameters
    ----------
    label : str
        The region's name
    precision : str
        Its precision, a key of :data:`THRESHOLDS`
    error : float | None
        The measured relative L2 error; None: nothing to check
    """
    if error is None:
        return
    limit = THRESHOLDS[precision]
    if error > limit:
        logger.warning(
            f"{label} in {precision}: rel. L2 {error:.1e} against fp32 eager after one "
            f"call, above the {limit:.0e} expected for {precision}. Check the "
            f"forecast, or use precision='fp32' (unset {ENV})."
        )


def measure(
    reference: Reference, label: str, precision: str, out: Any, device: torch.device
) -> tuple[float | None, float]:
    """The accuracy cost of ``out`` against its fp32 reference, WARNed when above
    the threshold, and the seconds the reference took.

    Parameters
    ----------
    reference : Reference
        The call's reference, taken before it (:meth:`Reference.before`)
    label : str
        The region's name, for the warning
    precision : str
        The region's precision, a key of :data:`THRESHOLDS`
    out : Any
        The region's output for the call
    device : torch.device
        Where the call computed

    Returns
    -------
    tuple[float | None, float]
        The relative L2 error (None when there is none to measure, or the reference
        failed: a measurement must not end a forecast) and the seconds spent
    """
    start = time.perf_counter()
    error = None
    try:
        error = reference.error(out, device)
        log_error(label, precision, error)
    except Exception as err:
        logger.trace(f"No fp32 reference for {label}: {err!r}")
    return error, time.perf_counter() - start
