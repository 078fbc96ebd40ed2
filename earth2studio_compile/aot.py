"""Ahead-of-time compiled regions: build once, load in a fraction of a second, verify.

A warm start through ``torch.compile`` still traces the core with Dynamo in every
process (2-3 s for FCN on an H100). An AOTInductor package of the core needs no
tracing at all: :func:`build_region` exports the core for one input signature
(:func:`torch.export.export`) in the region's precision and compiles it with
``aoti_compile_and_package``; :func:`load_runner` loads it through AOTInductor's
package loader and binds the live module's parameters and buffers to it.

Three rules keep an artifact from ever giving a wrong answer:

- **Weights are never in the artifact.** The package holds code only; the live
  module's tensors are bound at load as user-managed constants (no copy), so an
  in-place weight change is seen by the next call, and a replaced tensor is rebound.
- **An artifact is used only under its key** (:func:`key_for`): model and core
  class, parameter and buffer names, shapes and dtypes, a sha256 of the source of
  every module class in the core (vLLM hashes its traced source files the same
  way), torch/triton/CUDA/Python versions, the device (GPU name and capability, or
  CPU model), precision, mode and input signature. The artifact directory's
  ``meta.json`` repeats the key's fields and a sha256 of the package, checked
  before loading.
- **The first call is verified** against one eager call (:func:`verify`) within
  :data:`TOLERANCES`; the caller falls back to the Dynamo path on any reason.

Artifacts live in ``cache_root()/aot/<key>/`` (``model.pt2`` and ``meta.json``),
written to a temporary directory and renamed into place whole: copy ``aot/`` to a
new node of the same kind, as with the compile cache's ``artifacts/``.

:func:`build` is the explicit step: it finds a model's regions as
:class:`~earth2studio_compile.CompileSession` does, captures each core's inputs from
one forward on :func:`~earth2studio_compile.example_input`, and builds each region.
``python -m earth2studio_compile.tools.build`` is its command line.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import itertools
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile import precision as _precision
from earth2studio_compile._torch import MODULE_SLOT, tree_flatten, tree_map
from earth2studio_compile.cache import (
    artifact_key,
    cache_root,
    key_fields,
    use_local_cache,
)
from earth2studio_compile.executors import Declined, Target
from earth2studio_compile.metrics import Laps, rel_l2, synchronize
from earth2studio_compile.opaque import find_opaque
from earth2studio_compile.options import CompileOptions, CompilePolicy
from earth2studio_compile.precision import THRESHOLDS, KeepFp32
from earth2studio_compile.report import RegionReport

__all__ = [
    "AOT_FORMAT",
    "TOLERANCES",
    "AotExecutor",
    "AotRunner",
    "Built",
    "aot_root",
    "build",
    "build_region",
    "key_for",
    "load_runner",
    "verify",
]

# Version of the artifact layout and of what the key covers; bump it when either
# changes, and every older artifact stops matching.
AOT_FORMAT = 1
_PACKAGE = "model.pt2"
_META = "meta.json"
_TMP = ".e2sc-"
# The core is exported inside a wrapper (to scope autocast in the graph), so the
# package names constants ``core.<name>``.
_CORE = "core"

# Relative L2 of an artifact's first output against one eager call in the same
# precision, above which the artifact is not used. fp32: the same network compiled
# two ways differs by reduction order only (AOTInductor vs eager: 4.9e-7 for FCN on
# an H100, 1.7e-6 max abs on CPU; Dynamo vs eager 2.5e-6 max abs), while a wrong
# graph is off by O(1); 1e-5 leaves a factor of 6-20 for other cores. Reduced
# precisions: both sides round differently, so the documented cost of the
# precision itself (precision.THRESHOLDS) bounds their difference.
TOLERANCES = {"fp32": 1e-5, "tf32": THRESHOLDS["tf32"], "bf16": THRESHOLDS["bf16"]}


def aot_root(root: Path | None = None) -> Path | None:
    """Where artifacts live: ``root/aot``, by default under :func:`cache_root`."""
    root = root if root is not None else cache_root()
    return None if root is None else root / "aot"


# -- the key ---------------------------------------------------------------------------
def _ours(fn: Any) -> bool:
    # The package's own forward overrides (KeepFp32, opaque operators) are part of
    # the region's settings (precision, fp32_modules), not of the model's code.
    return str(getattr(fn, "__module__", "")).startswith("earth2studio_compile")


def _function_text(fn: Any) -> str:
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return repr(fn)
        # No source (a class built with type(), a REPL): the bytecode and constants
        # still change with the code, and the Python version is in the key.
        return f"{code.co_code.hex()}|{code.co_consts!r}|{code.co_names!r}"


def _class_text(cls: type) -> str:
    # Each function's own source rather than inspect.getsource(cls): that finds
    # the class by name in its file (so a method patched in at run time would not
    # show) and parses the whole file on Python < 3.13 (0.1-0.5 s per file).
    parts = []
    for name, value in sorted(vars(cls).items()):
        if isinstance(value, property):
            value = value.fget
        fn = inspect.unwrap(getattr(value, "__func__", value))
        if inspect.isfunction(fn):
            parts.append(f"{name}:{_function_text(fn)}")
        elif not name.startswith("__"):
            parts.append(f"{name}={type(value).__name__}")
    return "\n".join(parts)


def _module_classes(module: torch.nn.Module) -> list[type]:
    """Every class the core's modules are built from, torch's own excepted."""
    seen: dict[str, type] = {}
    for m in module.modules():
        for cls in type(m).__mro__:
            top = cls.__module__.split(".", 1)[0]
            if top in ("torch", "builtins"):
                continue  # covered by the torch version in the key
            seen.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    return [seen[name] for name in sorted(seen)]


def source_hash(module: torch.nn.Module) -> str:
    """sha256 of the source of every module class in ``module``, in a stable order.

    Instance-level ``forward`` overrides (other than this package's own) count too.

    Parameters
    ----------
    module : torch.nn.Module
        A region's core

    Returns
    -------
    str
        Hex digest
    """
    digest = hashlib.sha256()
    for cls in _module_classes(module):
        digest.update(f"{cls.__module__}.{cls.__qualname__}\n".encode())
        digest.update(_class_text(cls).encode())
    for name, m in module.named_modules():
        fn = m.__dict__.get("forward")
        if fn is not None and not _ours(fn):
            digest.update(f"instance {name}.forward\n{_function_text(fn)}".encode())
    return digest.hexdigest()


def _constants_text(module: torch.nn.Module) -> str:
    tensors = itertools.chain(
        module.named_parameters(remove_duplicate=False),
        module.named_buffers(remove_duplicate=False),
    )
    text = json.dumps([[n, list(t.shape), str(t.dtype)] for n, t in tensors])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _effective(precision: str | None, device: torch.device) -> str:
    """The precision a region computes in; None: what PyTorch's flags say."""
    if precision is not None:
        return precision
    # Read without the legacy getters, which raise when the two APIs were mixed.
    tf32 = device.type == "cuda" and any(_precision.tf32_enabled())
    return "tf32" if tf32 else "fp32"


def _mode_text(
    mode: str | None, options: Mapping[str, Any] | None, fp32: Sequence[str]
) -> str:
    shown = sorted((str(k), repr(v)) for k, v in (options or {}).items())
    return f"aot|mode={mode or 'default'}|options={shown}|fp32_modules={sorted(fp32)}"


def key_for(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    device: torch.device,
    precision: str | None,
    mode: str | None,
    owner: str,
    region: str = "",
    options: Mapping[str, Any] | None = None,
    fp32_modules: Sequence[str] = (),
) -> tuple[str, dict[str, Any]]:
    """The key of a region's artifact, and the fields it hashes.

    Parameters
    ----------
    module : torch.nn.Module
        The region's core
    args, kwargs : tuple, Mapping
        Its call's arguments (tensors count by shape, dtype and device)
    device : torch.device
        Device the core computes on
    precision : str | None
        The region's precision (:mod:`earth2studio_compile.precision`)
    mode : str | None
        Inductor mode (``None``: default; ``"reduce-overhead"`` adds CUDA graphs,
        which the runner captures itself)
    owner : str
        Qualified class name of the model that owns the region
    region : str, optional
        Dotted path of the region in the model, by default ""
    options : Mapping[str, Any] | None, optional
        Further Inductor options, by default None
    fp32_modules : Sequence[str], optional
        Class names kept in fp32 under ``"bf16"``, by default none

    Returns
    -------
    tuple[str, dict[str, Any]]
        A 32-character hex key and the JSON-serialisable fields
    """
    fields = key_fields(
        owner,
        region,
        module,
        args,
        kwargs,
        _mode_text(mode, options, fp32_modules),
        device,
    )
    leaves, _ = tree_flatten((tuple(args), dict(kwargs)))
    fields.update(
        {
            "aot_format": AOT_FORMAT,
            "constants": _constants_text(module),
            "source": source_hash(module),
            "precision": precision or f"global:{_effective(None, device)}",
            "training": any(m.training for m in module.modules()),
            "cuda": torch.version.cuda if device.type == "cuda" else None,
            "arguments": [
                None if isinstance(x, torch.Tensor) else repr(x) for x in leaves
            ],
        }
    )
    return artifact_key(fields), json.loads(json.dumps(fields, default=str))


# -- building --------------------------------------------------------------------------
class _Scoped(torch.nn.Module):
    """The core as exported: autocast inside the graph for bf16, outputs cast back.

    ``torch.export`` does not capture an autocast entered around it; entered in
    ``forward`` it becomes part of the graph.
    """

    def __init__(self, core: torch.nn.Module, precision: str | None) -> None:
        super().__init__()
        self.core = core
        self.precision = precision

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.precision != "bf16":
            return _torch.call_module(self.core, args, kwargs)
        device = _precision._device_type(args)
        with torch.autocast(device, dtype=torch.bfloat16):
            out = _torch.call_module(self.core, args, kwargs)
        return _precision.restore_dtype(out, "bf16", args)


def _flags(precision: str | None) -> str | None:
    # TF32 settings the compile reads (Triton matmul templates bake them in);
    # bf16's autocast is in the graph, and what it leaves in fp32 runs without TF32.
    return "fp32" if precision == "bf16" else precision


def _inductor_configs(
    mode: str | None, options: Mapping[str, Any] | None, device: torch.device
) -> dict[str, Any]:
    configs = {**(_torch.mode_options(mode) if mode else {}), **(options or {})}
    # CUDA graphs are the runner's own (AotRunner), not part of any artifact.
    configs.pop("triton.cudagraphs", None)
    if device.type == "cpu" and (
        configs.get("max_autotune") or configs.get("max_autotune_gemm")
    ):
        configs.update(_torch.cpu_autotune_fixes())
    # Weights stay out of the package: bound from the live module at load.
    configs["aot_inductor.package_constants_in_so"] = False
    return configs


def _device_of(args: Any, module: torch.nn.Module) -> torch.device:
    for leaf in tree_flatten(args)[0]:
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    for t in itertools.chain(module.parameters(), module.buffers()):
        return t.device
    return torch.device("cpu")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _fp32_kept(
    module: torch.nn.Module, precision: str | None, fp32_modules: Sequence[str]
) -> Iterator[None]:
    wrappers = (
        [KeepFp32(m) for _, m in find_opaque(module, tuple(fp32_modules))]
        if precision == "bf16"
        else []
    )
    try:
        for w in wrappers:
            w.install()
        yield
    finally:
        for w in reversed(wrappers):
            w.restore()


def _normal(value: Any) -> Any:
    # Export traces normal tensors; inference tensors (Earth2Studio's forward runs
    # in inference mode) cannot be traced.
    return tree_map(
        lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value
    )


def build_region(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    precision: str | None = None,
    mode: str | None = None,
    owner: str = "",
    region: str = "",
    options: Mapping[str, Any] | None = None,
    fp32_modules: Sequence[str] = (),
    root: Path | None = None,
) -> Path:
    """Export and compile one region ahead of time; write its artifact.

    Parameters
    ----------
    module : torch.nn.Module
        The region's core, on the device it will run on
    args : tuple[Any, ...]
        Example positional arguments, with the shapes the forecast will use
    kwargs : Mapping[str, Any] | None, optional
        Example keyword arguments, by default none
    precision, mode, owner, region, options, fp32_modules
        As in :func:`key_for`
    root : Path | None, optional
        Cache root, by default :func:`cache_root`

    Returns
    -------
    Path
        The artifact's directory, ``<root>/aot/<key>``

    Raises
    ------
    RuntimeError
        The cache is off, this PyTorch cannot build, or the core cannot be built
        ahead of time (it mutates its inputs or buffers, or holds tensors that are
        neither parameters nor buffers); the Dynamo path still works for it
    """
    reason = _torch.missing("aoti_compile")
    if reason is not None:
        raise RuntimeError(reason)
    directory = aot_root(root)
    if directory is None:
        raise RuntimeError(
            "The compile cache is off (EARTH2STUDIO_COMPILE_CACHE): artifacts have "
            "nowhere to go. Set it to a directory."
        )
    kwargs = dict(kwargs or {})
    args, kwargs = _normal(tuple(args)), _normal(kwargs)
    device = _device_of((args, kwargs), module)
    key, fields = key_for(
        module,
        args,
        kwargs,
        device,
        precision,
        mode,
        owner,
        region,
        options,
        fp32_modules,
    )
    label = f"{owner.rsplit('.', 1)[-1]}.{region}" if region else owner or "region"
    timings: dict[str, float] = {}
    start = time.perf_counter()
    # Outside the precision scope: export reads cuDNN's legacy TF32 flag, which
    # raises while the scope holds conv and rnn apart; TF32 does not change the
    # exported graph (bf16's autocast is inside it), only the compile below.
    with torch.no_grad(), _fp32_kept(module, precision, fp32_modules):
        program = torch.export.export(
            _Scoped(module, precision), tuple(args), kwargs, strict=False
        )
    timings["export"] = time.perf_counter() - start
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        raise RuntimeError(
            f"{label} updates its buffers or inputs in place; ahead-of-time "
            "artifacts bind buffers read-only. It stays on the Dynamo path."
        )
    live = _live_names(module)
    constants = [*program.state_dict, *program.constants]
    strays = [n for n in constants if _strip(n) not in live]
    if strays:
        raise RuntimeError(
            f"{label} computes with tensors that are neither parameters nor "
            f"buffers ({', '.join(strays[:3])}); they could not be bound from the "
            "live model. It stays on the Dynamo path."
        )
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=_TMP))
    try:
        start = time.perf_counter()
        with _precision.scope(_flags(precision), device):
            _torch.aoti_compile(
                program,
                str(tmp / _PACKAGE),
                _inductor_configs(mode, options, device),
            )
        timings["compile"] = time.perf_counter() - start
        meta = {
            "fields": fields,
            "sha256": {_PACKAGE: _sha256(tmp / _PACKAGE)},
            "build_seconds": timings,
        }
        (tmp / _META).write_text(json.dumps(meta, indent=1, default=str))
        target = _install(tmp, directory / key)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info(
        f"Built {label} ahead of time ({precision or 'global precision'}, "
        f"{mode or 'default'}) in {sum(timings.values()):.1f} s: {target}"
    )
    return target


def _install(tmp: Path, target: Path) -> Path:
    """Rename a finished artifact directory into place, replacing an old one whole."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(dir=target.parent, prefix=_TMP))
        os.replace(target, old / "old")
    try:
        os.replace(tmp, target)
    except OSError:
        if not target.exists():
            raise
        # Another process installed the same key meanwhile: both are whole.
        shutil.rmtree(tmp, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def _live_names(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        **dict(module.named_parameters(remove_duplicate=False)),
        **dict(module.named_buffers(remove_duplicate=False)),
    }


def _strip(name: str) -> str:
    return name.removeprefix(f"{_CORE}.")


# -- loading ---------------------------------------------------------------------------
class SignatureMismatch(ValueError):
    """A call's tensors differ from the ones the artifact was built for."""


class AotRunner:
    """A loaded artifact bound to the live module; call it like the module.

    On CUDA with ``cudagraphs``, the second call captures a CUDA graph around the
    compiled code (static input buffers, inputs copied in, one warm-up run on a
    side stream first) and later calls replay it; outputs are then overwritten by
    the next replay, so they are cloned unless ``clone=False`` (a caller that
    clones itself). The bound tensors are checked at every call: a parameter that
    was replaced (not updated in place) is rebound, and the graph recaptured.

    Attributes
    ----------
    phases : dict[str, float]
        Seconds of ``checksum``, ``aot_load``, ``bind``, then ``first_run`` and,
        with CUDA graphs, ``cudagraph_capture`` once they happened
    path : Path
        The artifact's directory
    key : str
        Its key
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
    ) -> None:
        self.loader = loader
        self.module = module
        self.names = list(names)
        self.device = device
        self.precision = precision
        self.cudagraphs = cudagraphs and device.type == "cuda"
        self.clone = clone
        self.path = path
        self.key = key
        self.phases = phases
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

    def _live(self) -> tuple[int, ...]:
        return tuple(
            t.data_ptr()
            for t in itertools.chain(self.module.parameters(), self.module.buffers())
        )

    def bind(self) -> None:
        """Bind the live module's parameters and buffers (no copy).

        Raises
        ------
        RuntimeError
            A tensor the artifact needs is missing or changed shape or dtype
        """
        live = _live_names(self.module)
        want = self._wanted
        tensors: dict[str, torch.Tensor] = {}
        for name in self.names:
            t = live.get(_strip(name))
            if t is None:
                raise RuntimeError(f"the model has no tensor {_strip(name)!r}")
            expected = want.get(_strip(name))
            if expected is not None and expected != [list(t.shape), str(t.dtype)]:
                raise RuntimeError(
                    f"{_strip(name)} is now {list(t.shape)} {t.dtype}, the artifact "
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
                for n, t in _live_names(self.module).items()
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
        return tensors

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors = self._flat(args, kwargs)
        if self._live() != self._pointers:
            self.bind()
        self.calls += 1
        with torch.no_grad(), _precision.scope(_flags(self.precision), self.device):
            if self.calls == 1:
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
            with torch.cuda.graph(graph):
                self._static_out = list(self.loader.boxed_run(list(self._static_in)))
            self._graph = graph
            synchronize(self.device)
            self.phases.setdefault("cudagraph_capture", time.perf_counter() - start)
        else:
            for static, t in zip(self._static_in, tensors):
                static.copy_(t)
        self._graph.replay()
        return self._static_out


def _read_meta(path: Path) -> dict[str, Any]:
    meta = json.loads((path / _META).read_text())
    if not isinstance(meta, dict) or not isinstance(meta.get("fields"), dict):
        raise ValueError(f"{_META} has no fields")
    return meta


def _differences(fields: Mapping[str, Any], directory: Path) -> str:
    """What the artifacts of the same region differ in, for the reason."""
    diffs: set[str] = set()
    for meta_path in directory.glob(f"*/{_META}"):
        try:
            other = _read_meta(meta_path.parent)["fields"]
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
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    device: torch.device,
    precision: str | None,
    mode: str | None,
    owner: str,
    region: str = "",
    options: Mapping[str, Any] | None = None,
    fp32_modules: Sequence[str] = (),
    cudagraphs: bool | None = None,
    clone: bool = True,
    root: Path | None = None,
) -> AotRunner | str:
    """The region's artifact, loaded and bound to ``module``, or why not.

    Parameters
    ----------
    module, args, kwargs, device, precision, mode, owner, region, options, fp32_modules
        As in :func:`key_for`
    cudagraphs : bool | None, optional
        Capture a CUDA graph around the artifact; None: when ``mode`` or
        ``options`` ask for CUDA graphs on a CUDA device, by default None
    clone : bool, optional
        Clone CUDA-graph outputs before returning them, by default True
    root : Path | None, optional
        Cache root, by default :func:`cache_root`

    Returns
    -------
    AotRunner | str
        The runner, or the reason it declined: no artifact for the key (naming
        what differs from the region's other artifacts), a damaged artifact
        (checksum or load error), a model that cannot be bound, or a PyTorch
        without the loader
    """
    phases: dict[str, float] = {}
    start = time.perf_counter()
    reason = _torch.missing("aoti_loader")
    if reason is not None:
        return reason
    directory = aot_root(root)
    if directory is None:
        return "the compile cache is off"
    kwargs = dict(kwargs or {})
    try:
        key, fields = key_for(
            module,
            args,
            kwargs,
            device,
            precision,
            mode,
            owner,
            region,
            options,
            fp32_modules,
        )
    except Exception as err:  # an odd argument: no artifact can match
        return f"no key for its arguments ({type(err).__name__}: {err})"
    path = directory / key
    found = (path / _META).is_file()
    # Each phase starts where the last ended: together they are the whole load.
    phases["key"], start = _lap(start)
    if not found:
        return f"no artifact for its key {key}" + _differences(fields, directory)
    try:
        meta = _read_meta(path)
        if meta["fields"] != fields:
            diff = sorted(k for k in fields if meta["fields"].get(k) != fields[k])
            return f"artifact {path} was made for a different {', '.join(diff)}"
        if _sha256(path / _PACKAGE) != meta.get("sha256", {}).get(_PACKAGE):
            return f"damaged artifact {path}: checksum mismatch"
    except Exception as err:  # unreadable: damaged
        return f"damaged artifact {path} ({type(err).__name__}: {err})"
    phases["checksum"], start = _lap(start)
    try:
        index = device.index if device.type == "cuda" and device.index else -1
        loader = _torch.aoti_loader(str(path / _PACKAGE), index)
        names = list(loader.get_constant_fqns())
    except Exception as err:  # a damaged or foreign library
        return (
            f"damaged artifact {path}: could not load it ({type(err).__name__}: {err})"
        )
    phases["aot_load"], start = _lap(start)
    if cudagraphs is None:
        wants = {**(_torch.mode_options(mode) if mode else {}), **(options or {})}
        cudagraphs = bool(wants.get("triton.cudagraphs"))
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
            precision,
            inputs,
            cudagraphs,
            clone,
            path,
            key,
            phases,
        )
    except Exception as err:  # binding failed: the model is not what was built
        return f"could not bind the model to {path} ({type(err).__name__}: {err})"
    # From the loaded library to a runner bound to the live weights.
    phases["bind"], _ = _lap(start)
    return runner


def _lap(start: float) -> tuple[float, float]:
    """Seconds since ``start``, and now: the next phase's start."""
    now = time.perf_counter()
    return now - start, now


# -- verification ----------------------------------------------------------------------
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
        tolerance = TOLERANCES[_effective(precision, w.device)]
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
                f"{tolerance:.0e} allowed for {_effective(precision, w.device)}"
            )
        worst = max(worst, error)
    logger.debug(f"Artifact verified against eager: rel. L2 {worst:.1e}")
    return None


# -- the region's executor -------------------------------------------------------------
def _loader_safe(device: torch.device) -> None:
    """Import what the package loader needs in this process before it runs.

    On an H100 with torch 2.11 the AOTInductor package loader crashed the process
    (SIGSEGV, for any package, a one-layer one included) unless
    ``earth2studio.models.px`` had been imported first; with it, it loaded FCN's
    package in 0.15 s (docs/bench/2026-11-24-h100/aot-probe/). The cause is not
    known; a crash cannot be caught, so the import is made first. Every process
    with an Earth2Studio model has made it already, so it costs nothing there.
    """
    if device.type == "cuda":
        import importlib

        from earth2studio_compile._imports import quiet_imports

        with quiet_imports():
            importlib.import_module("earth2studio.models.px")


class AotExecutor:
    """A region's ahead-of-time artifact, verified at its first call.

    :meth:`build` offers it whenever artifacts can exist (the cache is on, no
    opaque submodules, the loader is there); :meth:`first_call` then looks for the
    artifact of the call's key, runs it, and compares its output with one eager
    call on the same input (:func:`verify`). No artifact, a damaged one or a wrong
    answer raises :class:`~earth2studio_compile.executors.Declined` before anything
    is handed back, and the region goes on to the next candidate (Dynamo); a wrong
    answer also logs one WARNING.
    """

    name = "aot"
    source: str | None = None
    not_compiled: str | None = None
    # The runner binds the module's live weights: kept in a session only.
    keepable = False

    def __init__(self, target: Target) -> None:
        self.target = target
        self.cudagraphs = target.policy.cudagraphs and target.device.type == "cuda"
        self.runner: AotRunner | None = None

    @classmethod
    def build(cls, target: Target) -> AotExecutor | str:
        """The executor for ``target``, or why no artifact can serve it."""
        if target.artifacts is None:
            return "the compile cache is off"
        if target.opaque:
            return "opaque submodules (Python operators) need the Dynamo path"
        return _torch.missing("aoti_loader") or cls(target)

    def first_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], laps: Laps
    ) -> Any:
        """Load, run and verify the artifact; a lap for each phase."""
        t = self.target
        _loader_safe(t.device)
        runner = load_runner(
            t.module,
            args,
            kwargs,
            t.device,
            t.precision,
            t.policy.mode,
            t.owner,
            t.report.region,
            t.policy.options,
            t.fp32_modules,
            cudagraphs=self.cudagraphs,
            clone=False,  # the region clones what escapes a CUDA graph
            root=t.artifacts.parent if t.artifacts is not None else None,
        )
        if isinstance(runner, str):
            raise Declined(runner)
        # The loader's import above is part of finding the artifact: "key".
        loaded = ("checksum", "aot_load", "bind")
        laps.lap("key", **{k: runner.phases[k] for k in loaded})
        out = runner(*args, **kwargs)
        laps.lap("first_run")
        reason = verify(out, _torch.call_module(t.module, args, kwargs), t.precision)
        laps.lap("verify")
        if reason is not None:
            logger.warning(
                f"The ahead-of-time artifact {runner.path} of {t.report.label} gives "
                f"another answer than eager ({reason}): not used; "
                f"{t.report.label} compiles with torch.compile instead. Rebuild it "
                "with earth2studio_compile.build(..., force=True)."
            )
            raise Declined(f"its artifact failed verification ({reason})")
        self.runner = runner
        self.source = f"the ahead-of-time artifact {runner.path}"
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        assert self.runner is not None
        return self.runner(*args, **kwargs)

    def detach(self) -> None:
        """Never kept (:attr:`keepable` is False)."""

    def adopt(self, report: RegionReport) -> None:
        """Never kept (:attr:`keepable` is False)."""


# -- the explicit build step -----------------------------------------------------------
@dataclass
class Built:
    """What :func:`build` did for one region.

    Attributes
    ----------
    label : str
        ``Model.region``
    path : Path | None
        The artifact's directory; None if not built
    status : str
        ``"built"``, ``"present"`` (a loadable artifact for the key existed),
        ``"skipped"`` (the region cannot be built ahead of time) or ``"failed"``
    seconds : float
        Wall time of the build (0 unless built)
    reason : str | None
        Why it was skipped or failed
    """

    label: str
    path: Path | None
    status: str
    seconds: float = 0.0
    reason: str | None = None


def _capture(
    model: Any, modules: Sequence[torch.nn.Module], x: torch.Tensor, coords: Any
) -> dict[int, tuple[tuple[Any, ...], dict[str, Any]]]:
    """Each core's first call's arguments, from one forward of ``model``."""
    seen: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def hook(m: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if id(m) not in seen:
            seen[id(m)] = tree_map(
                lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t,
                (tuple(args), dict(kwargs)),
            )

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        with torch.no_grad():
            model(x, coords)
    finally:
        for h in handles:
            h.remove()
    return {k: _normal(v) for k, v in seen.items()}


def build(
    model: Any,
    device: torch.device | str | None = None,
    precision: str | None = None,
    batch_size: int = 1,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
    regions: Sequence[str] | None = None,
    force: bool = False,
) -> list[Built]:
    """Build ahead-of-time artifacts for every compiled region of ``model``.

    The regions are the ones :class:`~earth2studio_compile.CompileSession` compiles
    (the model table, or the generic path); each core's input is captured from one
    forward of ``model`` on :func:`~earth2studio_compile.example_input`. Artifacts
    go under :func:`~earth2studio_compile.cache_root`. Defaults are what
    ``compile=True`` uses, so a later ``compile=True`` run finds them.

    Parameters
    ----------
    model : Any
        A prognostic or diagnostic model
    device : torch.device | str | None, optional
        Device to build for (the model is moved there, as the workflows do), by
        default the model's
    precision : str | None, optional
        Region precision; None: ``EARTH2STUDIO_COMPILE_PRECISION``, as
        ``compile=True`` reads it, by default None
    batch_size : int, optional
        Samples per call (an ensemble's ``batch_size``), by default 1
    mode : str | None, optional
        Inductor mode, as :class:`~earth2studio_compile.CompileSession` takes it;
        None: ``"reduce-overhead"`` on CUDA (the runner's CUDA graphs), by default
        None
    options : Mapping[str, Any] | None, optional
        Inductor options, by default None
    regions : Sequence[str] | None, optional
        Dotted paths overriding the table's regions, by default None
    force : bool, optional
        Rebuild even when a valid artifact exists, by default False

    Returns
    -------
    list[Built]
        One entry per region
    """
    from earth2studio_compile.models import check_paths, plan
    from earth2studio_compile.session import example_input

    root = cache_root()
    if root is None:
        raise RuntimeError(
            "The compile cache is off (EARTH2STUDIO_COMPILE_CACHE): artifacts have "
            "nowhere to go. Set it to a directory."
        )
    use_local_cache(root)
    chosen = (
        _precision.check_precision(precision)
        if precision is not None
        else _precision.env_precision()
    )
    if device is not None and isinstance(model, torch.nn.Module):
        model = model.to(device)
    p = plan(model, check_paths(regions, "regions") if regions is not None else None)
    name = p.name
    if not p.targets:
        return [Built(name, None, "skipped", reason=p.reason)]
    refused = p.spec.precisions_refused.get(chosen or "")
    if refused is not None:
        logger.warning(f"{name} does not run in {chosen}: {refused}.")
        chosen = None
    out: list[Built] = []
    todo: list[tuple[str, torch.nn.Module]] = []
    for path, module in p.targets:
        label = f"{name}.{path}"
        if p.spec.opaque:
            why = "opaque submodules (Python operators) need the Dynamo path"
            out.append(Built(label, None, "skipped", reason=why))
        elif module.__dict__.get(MODULE_SLOT) is not None:
            out.append(Built(label, None, "skipped", reason="compiled in a session"))
        else:
            todo.append((path, module))
    x, coords = example_input(model, batch_size, device=device)
    calls = _capture(model, [m for _, m in todo], x, coords)
    owner = f"{type(model).__module__}.{type(model).__qualname__}"
    for path, module in todo:
        label = f"{name}.{path}"
        if id(module) not in calls:
            out.append(Built(label, None, "skipped", reason="not called by forward"))
            continue
        args, kwargs = calls[id(module)]
        dev = _device_of((args, kwargs), module)
        policy = CompilePolicy.resolve(
            CompileOptions(mode=mode, options=options),
            dev,
            p.spec,
        )
        common: dict[str, Any] = dict(
            precision=chosen,
            mode=policy.mode,
            owner=owner,
            region=path,
            options=policy.options,
            fp32_modules=p.spec.fp32_modules,
        )
        if not force:
            runner = load_runner(module, args, kwargs, dev, **common)
            if isinstance(runner, AotRunner):
                out.append(Built(label, runner.path, "present"))
                continue
        start = time.perf_counter()
        try:
            target = build_region(module, args, kwargs, **common)
        except Exception as err:  # one region's failure must not stop the others
            logger.warning(f"Could not build {label} ahead of time: {err}")
            out.append(Built(label, None, "failed", reason=str(err)))
            continue
        out.append(Built(label, target, "built", time.perf_counter() - start))
    return out
