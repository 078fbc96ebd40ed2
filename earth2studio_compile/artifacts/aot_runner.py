"""The runner of a loaded artifact: bound to the live module, called like it.

An :class:`AotRunner` holds an artifact's AOTInductor loader (made by
:func:`.aot_load.load_runner`), binds the live module's parameters and buffers (no
copy) and the tensors the core made while it was built, checks each call against
the signature it was built for (:class:`SignatureMismatch`), and on CUDA captures
and replays its own CUDA graph.

On CUDA the runner's first call replays the convolutions recorded when the
artifact was built (:data:`.aot_key.CONVOLUTIONS`) on empty tensors first:
AOTInductor's run holds the GIL throughout (pytorch issue #197516), eager
convolutions let it go, so cuDNN's first-call work moves out of the run that
stalls every other thread.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile import precision as _precision
from earth2studio_compile._torch import tree_flatten
from earth2studio_compile.artifacts.aot_build import compile_flags
from earth2studio_compile.artifacts.aot_key import (
    argument_texts,
    live_tensors,
    strip_core,
)
from earth2studio_compile.metrics import synchronize

#: Device types whose first run replays the artifact's recorded convolutions
#: first: cuDNN's plans and kernels are made at a convolution's first call.
WARM_DEVICES = frozenset({"cuda"})


class SignatureMismatch(ValueError):
    """A call's tensors, or its other arguments' values, differ from the ones the
    artifact was built for."""


class AotRunner:
    """A loaded artifact bound to the live module; call it like the module.

    On CUDA with ``cudagraphs``, the second call captures a CUDA graph around the
    compiled code (static input buffers, inputs copied in, one warm-up run on a
    side stream first) and later calls replay it; outputs are then overwritten by
    the next replay, so they are cloned unless ``clone=False`` (a caller that
    clones itself). The bound tensors are checked at every call: a parameter that
    was replaced (not updated in place) is rebound, and the graph recaptured.

    Parameters
    ----------
    loader : Any
        The artifact's AOTInductor model loader (``_torch.aoti_loader``)
    module : torch.nn.Module
        The live core whose parameters and buffers are bound (held weakly)
    names : Sequence[str]
        The constants' qualified names the artifact needs
    device : torch.device
        Where the artifact computes
    precision : str | None
        The precision it was built in (the flags it runs under)
    inputs : list[Any]
        The shape, dtype and device type of each tensor input it was built for
    cudagraphs : bool
        Capture and replay a CUDA graph from the second call (CUDA only)
    clone : bool
        Clone outputs of a replayed graph
    path : Path
        The artifact's directory
    key : str
        Its key
    phases : dict[str, float]
        Seconds of the load's phases so far
    made : Mapping[str, torch.Tensor] | None
        The artifact's own constants by name, on ``device``: tensors the core
        made while it was built (:data:`.aot_key.CONSTANTS`), by default none
    arguments : Sequence[str | None], optional
        The values of the other arguments it was built for
        (:func:`~.aot_key.argument_texts`), by default none
    unused : Sequence[str], optional
        The core's parameters whose values do not count, by default none
    convolutions : Sequence[Mapping[str, Any]], optional
        The convolutions the artifact made when it was built
        (:func:`~earth2studio_compile._torch.read_convolutions`), replayed before
        its first run on a device of :data:`WARM_DEVICES`, by default none
    layouts : Sequence[Sequence[int]], optional
        The strides its code reads each tensor input with
        (:func:`~.aot_key.input_layouts`); an input laid out otherwise is copied
        into that layout. By default none: inputs are passed as they come

    Attributes
    ----------
    phases : dict[str, float]
        Seconds of ``checksum``, ``aot_load``, ``bind``, then
        ``warm_convolutions`` (where the first run replayed them), ``first_run``
        and, with CUDA graphs, ``cudagraph_capture`` once they happened
    path : Path
        The artifact's directory
    key : str
        Its key
    verified_earlier : bool
        Its first call was not verified again: it had given eager's answer with
        the same weights in an earlier process (:mod:`.verified`)
    """

    def __init__(
        self,
        loader: Any,
        module: torch.nn.Module,
        names: Sequence[str],
        device: torch.device,
        precision: str | None,
        inputs: list[Any],
        cudagraphs: bool,
        clone: bool,
        path: Path,
        key: str,
        phases: dict[str, float],
        made: Mapping[str, torch.Tensor] | None = None,
        arguments: Sequence[str | None] = (),
        unused: Sequence[str] = (),
        convolutions: Sequence[Mapping[str, Any]] = (),
        layouts: Sequence[Sequence[int]] = (),
    ) -> None:
        self.loader = loader
        self._layouts = [tuple(x) for x in layouts]
        self._convolutions = list(convolutions)
        self._arguments = list(arguments)
        # Built for tensors only, a call that passed the shape checks has no other
        # value to compare: the hot path of most cores skips it.
        self._baked = any(a is not None for a in self._arguments)
        self._unused = tuple(unused)
        self._made = dict(made or {})
        # Weakly: a runner kept between sessions must not keep the model alive.
        self._module = weakref.ref(module)
        self.names = list(names)
        self.device = device
        self.precision = precision
        self.cudagraphs = cudagraphs and device.type == "cuda"
        self.clone = clone
        self.path = path
        self.key = key
        self.phases = phases
        self.verified_earlier = False
        self.calls = 0
        self._inputs = inputs
        in_spec, out_spec = loader.get_call_spec()
        self._in_spec = _torch.treespec_loads(in_spec)
        self._out_spec = _torch.treespec_loads(out_spec)
        self._bound: list[torch.Tensor] = []
        self._pointers: tuple[int, ...] = ()
        self._graph: Any = None
        self._static_in: list[torch.Tensor] = []
        self._static_out: list[torch.Tensor] = []
        self.bind()

    @property
    def module(self) -> torch.nn.Module:
        """The live module the runner is bound to."""
        module = self._module()
        if module is None:
            raise RuntimeError("the module this artifact is bound to was dropped")
        return module

    def _live(self) -> tuple[int, ...]:
        return tuple(
            t.data_ptr()
            for t in itertools.chain(self.module.parameters(), self.module.buffers())
        )

    def bind(self) -> None:
        """Bind the live module's parameters and buffers (no copy), and the
        artifact's own constants.

        Raises
        ------
        RuntimeError
            A tensor the artifact needs is missing or changed shape or dtype
        """
        live = live_tensors(self.module)
        want = self._wanted
        tensors: dict[str, torch.Tensor] = {}
        for name in self.names:
            short = strip_core(name)
            t = live.get(short, self._made.get(name))
            if t is None:
                raise RuntimeError(f"the model has no tensor {short!r}")
            expected = want.get(short)
            if expected is not None and expected != [list(t.shape), str(t.dtype)]:
                raise RuntimeError(
                    f"{short} is now {list(t.shape)} {t.dtype}, the artifact "
                    f"was built for {expected[0]} {expected[1]}"
                )
            tensors[name] = t.detach()
        # user_managed: the runner keeps the pointers, so the tensors are kept here.
        self.loader.load_constants(tensors, False, True, True)
        self._bound = list(tensors.values())
        self._pointers = self._live()
        self._graph = None

    @property
    def _wanted(self) -> dict[str, list[Any]]:
        if not hasattr(self, "_shapes"):
            self._shapes = {
                n: [list(t.shape), str(t.dtype)]
                for n, t in live_tensors(self.module).items()
            }
        return self._shapes

    def _flat(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        if kwargs:
            order = self._in_spec.children()[1].context
            if set(order) != set(kwargs):
                raise SignatureMismatch(
                    f"keyword arguments {sorted(kwargs)}, built for {sorted(order)}"
                )
            kwargs = {k: kwargs[k] for k in order}
        leaves, spec = tree_flatten((tuple(args), kwargs))
        if spec != self._in_spec:
            raise SignatureMismatch("arguments of another structure")
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        got = [[list(t.shape), str(t.dtype), t.device.type] for t in tensors]
        if got != self._inputs:
            raise SignatureMismatch(f"inputs {got}, built for {self._inputs}")
        if not self._baked:
            return tensors
        # Export baked the other arguments in: another value is another program.
        values = argument_texts(self.module, args, kwargs, self._unused)
        if values != self._arguments:
            raise SignatureMismatch(
                f"other arguments {_shown(values)}, built for {_shown(self._arguments)}"
            )
        return tensors

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors = self._flat(args, kwargs)
        if self._live() != self._pointers:
            self.bind()
        self.calls += 1
        with (
            torch.no_grad(),
            _precision.scope(compile_flags(self.precision), self.device),
            # The export's autocast is in the graph. The caller's would reach the
            # custom operators the artifact calls through the dispatcher: those
            # with an autocast kernel of their own (torch-harmonics' DISCO under
            # FCN3's bf16 wrapper) computed in bf16 where the graph reads fp32.
            torch.autocast(self.device.type, enabled=False),
        ):
            if self.calls == 1:
                self._warm()
                start = time.perf_counter()
                out = self.loader.boxed_run(self._laid_out(tensors))
                synchronize(self.device)
                self.phases["first_run"] = time.perf_counter() - start
            elif self.cudagraphs:
                # The graph's static inputs are laid out as built: copied into.
                out = self._replay(tensors)
                if self.clone:
                    out = [t.clone() for t in out]
            else:
                out = self.loader.boxed_run(self._laid_out(tensors))
        return _torch.tree_unflatten(list(out), self._out_spec)

    def free_graph(self) -> None:
        """Drop the CUDA graph its calls recorded, with its static inputs and
        outputs: its memory pool goes with them. For a runner kept unused (its
        region eager for being slower); a later call records the graph again."""
        self._graph = None
        self._static_in, self._static_out = [], []

    def _laid_out(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """``tensors`` in the layouts the code reads: AOTInductor does not check
        strides, so an expanded input passed as it comes was read as the
        contiguous clone the build saw (wrong values, no error)."""
        if not self._layouts:
            return tensors
        out = []
        for t, strides in zip(tensors, self._layouts, strict=True):
            if t.stride() != strides:
                t = torch.empty_strided(
                    t.shape, strides, dtype=t.dtype, device=t.device
                ).copy_(t)
            out.append(t)
        return out

    def _warm(self) -> None:
        """Replay the recorded convolutions, in the scope of the run to come."""
        if not self._convolutions or self.device.type not in WARM_DEVICES:
            return
        start = time.perf_counter()
        try:
            count = _torch.warm_convolutions(self._convolutions, self.device)
            synchronize(self.device)
        except Exception as err:  # only time is lost: the run goes on as before
            logger.debug(
                f"Artifact {self.key}: its convolutions were not warmed "
                f"({type(err).__name__}: {err})"
            )
            return
        self.phases["warm_convolutions"] = time.perf_counter() - start
        logger.debug(f"Artifact {self.key}: warmed {count} convolutions")

    def _replay(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if self._graph is None:
            start = time.perf_counter()
            self._static_in = [t.clone() for t in self._laid_out(tensors)]
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self.loader.boxed_run(list(self._static_in))
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            # thread_local, as Inductor's graph trees capture: the default ("global")
            # forbids every thread's CUDA syncs while it runs, and OverlappedIO's
            # writers (or a user's loader) wait on copy events meanwhile.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._static_out = list(self.loader.boxed_run(list(self._static_in)))
            self._graph = graph
            synchronize(self.device)
            self.phases.setdefault("cudagraph_capture", time.perf_counter() - start)
        else:
            for static, t in zip(self._static_in, tensors):
                static.copy_(t)
        self._graph.replay()
        return self._static_out


def _shown(values: Sequence[str | None]) -> str:
    return ", ".join(v for v in values if v is not None)
