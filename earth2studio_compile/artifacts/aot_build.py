"""Build one region ahead of time: export it, compile it with AOTInductor, store it.

:func:`build_region` exports the core for one input signature
(:func:`torch.export.export`) in the region's precision and compiles it with
``aoti_compile_and_package``, weights kept out of the package. The artifact is
an entry of :mod:`.store`: built in a temporary directory, with a ``meta.json``
of its key's fields and checksum, and renamed into place whole, so a reader never
sees half of one. It keeps the distinct convolutions one run of the package
made (:data:`.aot_key.CONVOLUTIONS`), which a first run on CUDA replays first.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile import precision as _precision
from earth2studio_compile._torch import tree_flatten, tree_map
from earth2studio_compile.artifacts import store
from earth2studio_compile.artifacts.aot_key import (
    CONSTANTS,
    CONVOLUTIONS,
    PACKAGE,
    aot_root,
    live_tensors,
    made_in_forward,
    strip_core,
)
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.refused import Refused, remember
from earth2studio_compile.opaque import find_opaque
from earth2studio_compile.precision import KeepFp32
from earth2studio_compile.staging import first_device


class _Scoped(torch.nn.Module):
    """The core as exported: autocast inside the graph for bf16, outputs cast back;
    the autocast its callers run it under (``autocast``) inside it too.

    ``torch.export`` does not capture an autocast entered around it; entered in
    ``forward`` it becomes part of the graph.
    """

    def __init__(
        self, core: torch.nn.Module, precision: str | None, autocast: str | None
    ) -> None:
        super().__init__()
        self.core = core
        self.precision = precision
        self.autocast = autocast

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        device = first_device(args, kwargs, self.core).type
        if self.autocast is not None:
            # As the callers run it: what it returns is what they get.
            with _precision.autocast_of(self.autocast, torch.device(device)):
                return _torch.call_module(self.core, args, kwargs)
        if self.precision != "bf16":
            return _torch.call_module(self.core, args, kwargs)
        with torch.autocast(device, dtype=torch.bfloat16):
            out = _torch.call_module(self.core, args, kwargs)
        return _precision.restore_dtype(out, "bf16", (args, kwargs))


def compile_flags(precision: str | None) -> str | None:
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


_LRU = type(functools.lru_cache(lambda: None))


@contextlib.contextmanager
def _caches_emptied() -> Iterator[None]:
    """Empty, after the block, the ``functools.lru_cache`` of model code that
    missed inside it (not PyTorch's own).

    Export traces the model's code with fake tensors: a tensor made once per
    shape and cached (Aurora's shifted-window masks) is cached fake, and every
    later eager call of the model in this process computes with it (a
    ``FakeTensor`` out, or ``DataDependentOutputException``), as after a
    ``build()`` before a forecast. Emptied, the cache makes real ones again.
    """
    before = {id(w): w.cache_info().misses for w in _lru_caches()}
    try:
        yield
    finally:
        for wrapper in _lru_caches():
            if wrapper.cache_info().misses != before.get(id(wrapper), 0):
                wrapper.cache_clear()


def _lru_caches() -> list[Any]:
    return [
        o
        for o in gc.get_objects()
        if type(o) is _LRU and not _in_torch(str(getattr(o, "__module__", "")))
    ]


def _in_torch(module: str) -> bool:
    # PyTorch's own package only: torch_harmonics' caches are model code's.
    return module == "torch" or module.startswith("torch.")


def _as_packaged(
    made: dict[str, torch.Tensor],
    names: Sequence[str],
    live: Mapping[str, torch.Tensor],
    label: str,
) -> dict[str, torch.Tensor]:
    """``made`` under the names the compiled package asks for them by.

    A tensor the core makes while it runs is traced by export when the model
    has not made it yet, and the package computes it. Made before (a mask an
    earlier call cached, as ``build()``'s own call of the model does), it is a
    constant, which AOTInductor names anew in the package
    (``_tensor_constant<n>``): kept under that name where the pairing is
    unambiguous (one such), refused otherwise. The first call of a loaded
    artifact is verified against eager all the same.
    """
    wanted = [n for n in names if strip_core(n) not in live and n not in made]
    if not wanted:
        return made
    spare = [n for n in made if n not in names]
    if len(wanted) == len(spare) == 1:
        kept = {n: t for n, t in made.items() if n != spare[0]}
        return kept | {wanted[0]: made[spare[0]]}
    raise RuntimeError(
        f"{label}'s compiled package needs tensors it cannot be given "
        f"({', '.join(wanted[:3])}): neither parameters, buffers nor one tensor "
        "its code made. It stays on the Dynamo path."
    )


def _recorded_convolutions(
    loader: Any,
    made: Mapping[str, torch.Tensor],
    live: Mapping[str, torch.Tensor],
    target: RegionTarget,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The distinct convolutions one run of the staged package (``loader``) makes,
    bound as :class:`~.aot_runner.AotRunner` binds it and in its scope; none where
    they cannot be recorded.

    Replayed before an artifact's first run on CUDA (:data:`.aot_key.CONVOLUTIONS`),
    a record only saves time: a failure here never fails the build.
    """
    try:
        device = target.device
        tensors = {}
        for name in loader.get_constant_fqns():
            short = strip_core(name)
            t = live[short] if short in live else made[name].to(device)
            tensors[name] = t.detach()
        loader.load_constants(tensors, False, True, True)
        # Export flattened (args, kwargs) in this order: the package's inputs.
        leaves = tree_flatten((tuple(args), dict(kwargs)))[0]
        inputs = [t for t in leaves if isinstance(t, torch.Tensor)]
        with (
            torch.no_grad(),
            _precision.scope(compile_flags(target.precision), device),
        ):
            record = _torch.record_convolutions(lambda: loader.boxed_run(inputs))
    except Exception as err:  # the artifact is whole without it
        logger.debug(
            f"{target.label}: its convolutions were not recorded "
            f"({type(err).__name__}: {err})"
        )
        return []
    logger.debug(f"{target.label}: recorded {len(record)} distinct convolutions")
    return record


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


def detached(value: Any) -> Any:
    # Export traces normal tensors; inference tensors (Earth2Studio's forward runs
    # in inference mode) cannot be traced.
    return tree_map(
        lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value
    )


def _refused(directory: Path, key: str, reason: str) -> Refused:
    """The refusal to raise, kept for later processes (the same key, the same
    refusal: :mod:`earth2studio_compile.artifacts.refused`)."""
    remember(directory, key, reason)
    return Refused(reason)


def build_region(
    target: RegionTarget,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    root: Path | None = None,
) -> Path:
    """Export and compile one region ahead of time; write its artifact.

    Parameters
    ----------
    target : RegionTarget
        The region's core (on the device it will run on) and its settings; the
        artifact goes under :meth:`RegionTarget.aot_key`
    args : tuple[Any, ...]
        Example positional arguments, with the shapes the forecast will use
    kwargs : Mapping[str, Any] | None, optional
        Example keyword arguments, by default none
    root : Path | None, optional
        Cache root, by default :func:`cache_root`

    Returns
    -------
    Path
        The artifact's directory, ``<root>/aot/<key>``

    Raises
    ------
    Refused
        The core cannot be built ahead of time for this key, in any process (it
        mutates its inputs or buffers, or holds tensors that are neither
        parameters nor buffers; tensors it makes while it runs are kept in the
        artifact): kept under the cache (:mod:`.refused`) for later processes;
        the Dynamo path still works for it
    RuntimeError
        The cache is off, this PyTorch cannot build, or the build failed
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
    module, precision, policy = target.module, target.precision, target.policy
    args, kwargs = detached(tuple(args)), detached(dict(kwargs or {}))
    key, fields = target.aot_key(args, kwargs)
    label = target.label
    timings: dict[str, float] = {}
    start = time.perf_counter()
    # Outside the precision scope: export reads cuDNN's legacy TF32 flag, which
    # raises while the scope holds conv and rnn apart; TF32 does not change the
    # exported graph (bf16's autocast is inside it), only the compile below.
    with (
        torch.no_grad(),
        _fp32_kept(module, precision, target.fp32_modules),
        _caches_emptied(),
        policy.tracing(),
    ):
        program = torch.export.export(
            _Scoped(module, precision, target.autocast),
            tuple(args),
            kwargs,
            strict=False,
        )
    timings["export"] = time.perf_counter() - start
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        raise _refused(
            directory,
            key,
            f"{label} updates its buffers or inputs in place; ahead-of-time "
            "artifacts bind buffers read-only.",
        )
    live = live_tensors(module)
    # Made by the core's code, the same in every process for these shapes: kept
    # with the artifact. A tensor held outside the parameters and buffers is the
    # model's own data, which an artifact must not keep: refused below.
    made = {
        n: t.detach().cpu()
        for n, t in program.constants.items()
        if made_in_forward(n) and isinstance(t, torch.Tensor)
    }
    constants = [*program.state_dict, *program.constants]
    strays = [n for n in constants if strip_core(n) not in live and n not in made]
    if strays:
        raise _refused(
            directory,
            key,
            f"{label} computes with tensors that are neither parameters nor "
            f"buffers ({', '.join(strays[:3])}); they could not be bound from the "
            "live model.",
        )
    with store.staged(directory) as tmp:
        start = time.perf_counter()
        # The exported graph keeps SDPA whole: its backend is chosen here.
        with (
            _precision.scope(compile_flags(precision), target.device),
            policy.tracing(),
        ):
            _torch.aoti_compile(
                program,
                str(tmp / PACKAGE),
                _inductor_configs(policy.mode, policy.options, target.device),
            )
        timings["compile"] = time.perf_counter() - start
        # One load serves the constants' names and the convolutions' record.
        loader = _torch.aoti_loader(str(tmp / PACKAGE), target.device)
        made = _as_packaged(made, list(loader.get_constant_fqns()), live, label)
        members = [PACKAGE]
        if made:
            torch.save(made, tmp / CONSTANTS)
            members.append(CONSTANTS)
        convolutions = _recorded_convolutions(loader, made, live, target, args, kwargs)
        if convolutions:
            (tmp / CONVOLUTIONS).write_text(json.dumps(convolutions))
            members.append(CONVOLUTIONS)
        store.write_meta(tmp, fields, members, build_seconds=timings)
        path = store.install(tmp, directory / key)
    logger.info(
        f"Built {label} ahead of time ({precision or 'global precision'}, "
        f"{policy.mode or 'default'}) in {sum(timings.values()):.1f} s: {path}"
    )
    return path
