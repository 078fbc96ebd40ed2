"""Load a region's artifact, bind the live weights, run it, verify it against eager.

:func:`load_runner` finds the artifact of a call's key, checks it (:mod:`.store`:
trust, fields, checksum), loads it through AOTInductor's package loader and binds
the live module's parameters and buffers (no copy), and the tensors the core made
while it was built (kept in the artifact), into an :class:`AotRunner`,
which captures its own CUDA graph on CUDA. :func:`verify` compares a first output
with one eager call.

On CUDA the runner's first call replays the convolutions recorded when the
artifact was built (:data:`.aot_key.CONVOLUTIONS`) on empty tensors first:
AOTInductor's run holds the GIL throughout (pytorch issue #197516), eager
convolutions let it go, so cuDNN's first-call work moves out of the run that
stalls every other thread.
"""

from __future__ import annotations

import itertools
import math
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
from earth2studio_compile.artifacts import store
from earth2studio_compile.artifacts.aot_build import compile_flags
from earth2studio_compile.artifacts.aot_key import (
    CONSTANTS,
    CONVOLUTIONS,
    PACKAGE,
    aot_root,
    argument_texts,
    effective_precision,
    live_tensors,
    strip_core,
)
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.store import META
from earth2studio_compile.metrics import rel_l2, synchronize
from earth2studio_compile.precision import THRESHOLDS

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
    ) -> None:
        self.loader = loader
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
        ):
            if self.calls == 1:
                self._warm()
                start = time.perf_counter()
                out = self.loader.boxed_run(tensors)
                synchronize(self.device)
                self.phases["first_run"] = time.perf_counter() - start
            elif self.cudagraphs:
                out = self._replay(tensors)
                if self.clone:
                    out = [t.clone() for t in out]
            else:
                out = self.loader.boxed_run(tensors)
        return _torch.tree_unflatten(list(out), self._out_spec)

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
            self._static_in = [t.clone() for t in tensors]
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


def _differences(fields: Mapping[str, Any], directory: Path) -> str:
    """What the artifacts of the same region differ in, for the reason."""
    diffs: set[str] = set()
    for meta_path in directory.glob(f"*/{META}"):
        try:
            other = store.read_meta(meta_path.parent)["fields"]
        except Exception:  # an unreadable neighbour says nothing
            continue
        if (
            other.get("model") != fields["model"]
            or other.get("region") != fields["region"]
        ):
            continue
        diffs.update(k for k in fields if other.get(k) != fields[k])
    if not diffs:
        return ""
    return f"; the artifacts built for this region differ in {', '.join(sorted(diffs))}"


def load_runner(
    target: RegionTarget,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    cudagraphs: bool | None = None,
    clone: bool = True,
    root: Path | None = None,
) -> AotRunner | str:
    """The region's artifact, loaded and bound to its module, or why not.

    Parameters
    ----------
    target : RegionTarget
        The region's core and its settings (:meth:`RegionTarget.aot_key`)
    args : tuple[Any, ...]
        The call's positional arguments (tensors count by shape, dtype, device)
    kwargs : Mapping[str, Any] | None, optional
        Its keyword arguments, by default none
    cudagraphs : bool | None, optional
        Capture a CUDA graph around the artifact; None: when the policy's
        ``mode`` or ``options`` ask for CUDA graphs on a CUDA device, by default
        None
    clone : bool, optional
        Clone CUDA-graph outputs before returning them, by default True
    root : Path | None, optional
        Cache root, by default :func:`cache_root`

    Returns
    -------
    AotRunner | str
        The runner, or the reason it declined: no artifact for the key (naming
        what differs from the region's other artifacts), one not to be used
        (untrusted, made for other fields, checksum, load error), a model that
        cannot be bound, or a PyTorch without the loader
    """
    phases: dict[str, float] = {}
    start = time.perf_counter()
    reason = _torch.missing("aoti_loader")
    if reason is not None:
        return reason
    directory = aot_root(root)
    if directory is None:
        return "the compile cache is off"
    module, device = target.module, target.device
    kwargs = dict(kwargs or {})
    try:
        key, fields = target.aot_key(args, kwargs)
    except Exception as err:  # an odd argument: no artifact can match
        return f"no key for its arguments ({type(err).__name__}: {err})"
    path = directory / key
    found = (path / META).is_file()
    # Each phase starts where the last ended: together they are the whole load.
    phases["key"], start = _lap(start)
    if not found:
        return f"no artifact for its key {key}" + _differences(fields, directory)
    reason = store.distrust(directory.parent, directory.name, key, PACKAGE)
    members = [PACKAGE] + [m for m in (CONSTANTS, CONVOLUTIONS) if (path / m).exists()]
    reason = reason or store.check_dir(path, fields, members)
    if reason is not None:
        return f"artifact {path} not used: {reason}"
    phases["checksum"], start = _lap(start)
    try:
        loader = _torch.aoti_loader(str(path / PACKAGE), device)
        names = list(loader.get_constant_fqns())
        made = (
            torch.load(path / CONSTANTS, map_location=device, weights_only=True)
            if CONSTANTS in members
            else {}
        )
    except Exception as err:  # a damaged or foreign library
        return (
            f"damaged artifact {path}: could not load it ({type(err).__name__}: {err})"
        )
    convolutions = _convolutions(path) if CONVOLUTIONS in members else []
    phases["aot_load"], start = _lap(start)
    if cudagraphs is None:
        cudagraphs = wants_cudagraphs(target)
    leaves = tree_flatten((tuple(args), kwargs))[0]
    inputs = [
        [list(t.shape), str(t.dtype), t.device.type]
        for t in leaves
        if isinstance(t, torch.Tensor)
    ]
    try:
        runner = AotRunner(
            loader,
            module,
            names,
            device,
            target.precision,
            inputs,
            cudagraphs,
            clone,
            path,
            key,
            phases,
            made,
            fields["arguments"],
            target.unused_arguments,
            convolutions,
        )
    except Exception as err:  # binding failed: the model is not what was built
        return f"could not bind the model to {path} ({type(err).__name__}: {err})"
    # From the loaded library to a runner bound to the live weights.
    phases["bind"], _ = _lap(start)
    return runner


def _convolutions(path: Path) -> list[dict[str, Any]]:
    """The artifact's recorded convolutions; none where the record cannot be read
    (checksummed, but perhaps of another layout): it only saves time."""
    try:
        return _torch.read_convolutions((path / CONVOLUTIONS).read_bytes())
    except Exception as err:  # the artifact runs as one without a record
        logger.debug(
            f"Artifact {path}: its convolution record is not used "
            f"({type(err).__name__}: {err})"
        )
        return []


def wants_cudagraphs(target: RegionTarget) -> bool:
    """Whether the region's artifact runs under CUDA graphs: its policy's ``mode``
    or ``options`` ask for them, on a CUDA device (:func:`load_runner`'s default).

    Parameters
    ----------
    target : RegionTarget
        The region and its settings

    Returns
    -------
    bool
        True where a runner loaded for it captures a CUDA graph
    """
    policy = target.policy
    mode = policy.mode
    wants = {**(_torch.mode_options(mode) if mode else {}), **(policy.options or {})}
    return bool(wants.get("triton.cudagraphs")) and target.device.type == "cuda"


def _shown(values: Sequence[str | None]) -> str:
    return ", ".join(v for v in values if v is not None)


def _lap(start: float) -> tuple[float, float]:
    """Seconds since ``start``, and now: the next phase's start."""
    now = time.perf_counter()
    return now - start, now


# Relative L2 of an artifact's first output against one eager call in the same
# precision, above which the artifact is not used. fp32: the same network compiled
# two ways differs by reduction order only (AOTInductor vs eager: 4.9e-7 for FCN on
# an H100, 1.7e-6 max abs on CPU; Dynamo vs eager 2.5e-6 max abs), while a wrong
# graph is off by O(1); 1e-5 leaves a factor of 6-20 for other cores. Reduced
# precisions: both sides round differently, so the documented cost of the
# precision itself (precision.THRESHOLDS) bounds their difference.
TOLERANCES = {"fp32": 1e-5, "tf32": THRESHOLDS["tf32"], "bf16": THRESHOLDS["bf16"]}


def verify(runner_out: Any, eager_out: Any, precision: str | None) -> str | None:
    """Why an artifact's output is not the eager output, or None if it is.

    Parameters
    ----------
    runner_out : Any
        The artifact's output for one call
    eager_out : Any
        The eager output for the same input, in the same precision
    precision : str | None
        The region's precision; None means PyTorch's settings (TF32 tolerance on a
        GPU where TF32 is enabled)

    Returns
    -------
    str | None
        The reason, or None when every output is within :data:`TOLERANCES`
    """
    got, got_spec = tree_flatten(runner_out)
    want, want_spec = tree_flatten(eager_out)
    if got_spec != want_spec:
        return "its outputs have another structure than the eager outputs"
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(w, torch.Tensor):
            if g != w:
                return f"output {i} is {g!r}, eager gives {w!r}"
            continue
        if not isinstance(g, torch.Tensor):
            return f"output {i} is not a tensor"
        if g.shape != w.shape or g.dtype != w.dtype:
            return (
                f"output {i} is {list(g.shape)} {g.dtype}, eager gives "
                f"{list(w.shape)} {w.dtype}"
            )
        effective = effective_precision(precision, w.device)
        tolerance = TOLERANCES[effective]
        if not w.is_floating_point() and not w.is_complex():
            if not torch.equal(g, w.to(g.device)):
                return f"output {i} differs from eager"
            continue
        g, w = g.detach(), w.detach().to(g.device)
        nan = torch.isnan(w)
        if not torch.equal(torch.isnan(g), nan):
            return f"output {i} has NaNs where eager has none (or the reverse)"
        error = rel_l2(g[~nan], w[~nan]) if nan.any() else rel_l2(g, w)
        if not math.isfinite(error) or error > tolerance:
            return (
                f"output {i} is off by rel. L2 {error:.1e} against eager, above the "
                f"{tolerance:.0e} allowed for {effective}"
            )
        worst = max(worst, error)
    logger.debug(f"Artifact verified against eager: rel. L2 {worst:.1e}")
    return None
