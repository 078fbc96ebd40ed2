"""Build ahead-of-time artifacts for a model's regions: the explicit ``build()`` step.

A warm start through ``torch.compile`` still traces the core with Dynamo in every
process (2-3 s for FCN on an H100); an AOTInductor artifact needs no tracing
(:mod:`earth2studio_compile.artifacts`). :func:`build` finds a model's regions as
:class:`~earth2studio_compile.CompileSession` does, captures each core's inputs
from one forward on :func:`~earth2studio_compile.example_input`, and builds each
region. ``python -m earth2studio_compile.tools.build`` is its command line; a
``compile=True`` run then finds the artifacts (the region's AOT executor,
:mod:`earth2studio_compile.executors.aot`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock
import torch
from loguru import logger

from earth2studio_compile import precision as _precision
from earth2studio_compile._torch import MODULE_SLOT, tree_map
from earth2studio_compile.aot_checks import Built, Captured, seal, time_speed
from earth2studio_compile.artifacts import background, hints, payoff
from earth2studio_compile.artifacts.aot_build import build_region, detached
from earth2studio_compile.artifacts.aot_load import load_runner
from earth2studio_compile.artifacts.aot_runner import AotRunner
from earth2studio_compile.artifacts.build_process import build_turn
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.refused import Refused
from earth2studio_compile.cache import (
    cache_root,
    lock_timeout,
    use_local_cache,
)
from earth2studio_compile.opaque import find_opaque
from earth2studio_compile.options import CompileOptions
from earth2studio_compile.patches import Patches
from earth2studio_compile.planning import plan, table_patches
from earth2studio_compile.session import CompileSession, example_input
from earth2studio_compile.spec import check_paths, region_patches, unused_arguments
from earth2studio_compile.staging import first_device

# Type hints only: importing Earth2Studio takes a minute on a small machine, and
# the package is imported before it (the demo's banner comes first).
if TYPE_CHECKING:
    from earth2studio.models.dx.base import DiagnosticModel
    from earth2studio.models.px.base import PrognosticModel
    from earth2studio.utils.type import CoordSystem


def capture_calls(
    model: PrognosticModel | DiagnosticModel,
    modules: Sequence[torch.nn.Module],
    x: torch.Tensor,
    coords: CoordSystem,
) -> dict[int, Captured]:
    """Each core's first call, from one forward of ``model``.

    Parameters
    ----------
    model : PrognosticModel | DiagnosticModel
        The Earth2Studio model (its ``__call__(x, coords)`` runs once, without grad)
    modules : Sequence[torch.nn.Module]
        The cores whose first calls are wanted
    x : torch.Tensor
        The model's input
    coords : CoordSystem
        Its coordinate system

    Returns
    -------
    dict[int, Captured]
        ``id`` of each core that was called -> its first call
    """
    seen: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    inference: dict[int, bool] = {}
    autocast: dict[int, str | None] = {}

    def hook(m: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if id(m) not in seen:
            seen[id(m)] = tree_map(
                lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t,
                (tuple(args), dict(kwargs)),
            )
            inference[id(m)] = torch.is_inference_mode_enabled()
            device = first_device(tuple(args), dict(kwargs), m)
            autocast[id(m)] = _precision.ambient_autocast(device.type)

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        with torch.no_grad():
            model(x, coords)
    finally:
        for h in handles:
            h.remove()
    calls = {k: detached(v) for k, v in seen.items()}
    return {
        k: Captured(a, kw, inference[k], autocast[k]) for k, (a, kw) in calls.items()
    }


def build(
    model: PrognosticModel | DiagnosticModel,
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
    go under :func:`~earth2studio_compile.cache_root`, each with a hint of the
    inputs it was built for (:mod:`earth2studio_compile.artifacts.hints`), as a
    first call leaves: the next process's first call then runs ahead of its
    workflow's, while the workflow fetches its data. Defaults are what
    ``compile=True`` uses, so a later ``compile=True`` run finds them.

    Parameters
    ----------
    model : PrognosticModel | DiagnosticModel
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
    where = first_device((), {}, model if isinstance(model, torch.nn.Module) else None)
    refused = p.spec.refused_on(where)
    if refused is not None:
        logger.warning(f"{name} is {refused}")
        return [
            Built(f"{name}.{path}", None, "skipped", reason=refused)
            for path, _ in p.targets
        ]
    refused = p.spec.precisions_refused.get(chosen or "")
    flags: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if refused is not None:
        # Its regions run under the global flags, which key their artifacts and
        # figures: a forecast that asked this precision sets them so (AIFS2ENS on an
        # H200: a tf32 build under PyTorch's defaults was judged again by the call).
        how = (
            f"set for {chosen} while it builds"
            if chosen in ("fp32", "tf32")
            else "as they are"
        )
        logger.warning(
            f"{name} does not run in {chosen}: {refused}. It is built under "
            f"PyTorch's global precision flags, {how}."
        )
        flags = _precision.global_flags(chosen)
        chosen = None
    out: list[Built] = []
    todo: list[tuple[str, torch.nn.Module]] = []
    # Regions no artifact can serve, judged on the Dynamo path below, and why.
    dynamo: dict[str, str] = {}
    for path, module in p.targets:
        label = f"{name}.{path}"
        if module.__dict__.get(MODULE_SLOT) is not None:
            out.append(Built(label, None, "skipped", reason="compiled in a session"))
        else:
            todo.append((path, module))
    # The table's method patches, as compile=True sets them: the artifact is built
    # from the code a session's calls run, and keyed by it.
    with flags, Patches(table_patches(model)):
        x, coords = example_input(model, batch_size, device=device)
        calls = capture_calls(model, [m for _, m in todo], x, coords)
        owner = f"{type(model).__module__}.{type(model).__qualname__}"
        for path, module in todo:
            label = f"{name}.{path}"
            if id(module) not in calls:
                why = "not called by forward"
                out.append(Built(label, None, "skipped", reason=why))
                continue
            args, kwargs, _, autocast = calls[id(module)]
            target = RegionTarget.resolve(
                module,
                owner=owner,
                region=path,
                device=first_device(args, kwargs, module),
                precision=chosen,
                options=CompileOptions(mode=mode, options=options),
                table=p.spec,
                fp32_modules=p.spec.fp32_modules,
                unused_arguments=unused_arguments(p.spec, module),
                patches=region_patches(p.spec, module),
                autocast=autocast,
                # Per region, as a forecast's first call decides (hooks.Hooks):
                # FCN3's resampling sits in its two decoders only, and its other
                # regions once took the Dynamo path here, then built in the
                # background during the user's call.
                opaque=bool(find_opaque(module, p.spec.opaque)),
            )
            # Opaque submodules or FlexAttention: the executors' own test.
            if target.no_artifact is not None:
                dynamo[label] = target.no_artifact
                continue
            key, _ = target.aot_key(args, kwargs)
            try:
                # One build of a key at a time, as background builds take it: two
                # compiles of one graph share Inductor's cache files half-written.
                with build_turn(root, key, label):
                    done = _found_or_built(label, target, calls, force, root, dynamo)
            except filelock.Timeout:
                why = f"another process held its build lock for {lock_timeout():g} s"
                done = Built(label, None, "failed", reason=why)
            if done is not None:
                out.append(done)
        if dynamo:
            calls.clear()  # the regions' captured inputs: device memory the judge needs
            out += _judge(model, x, coords, dynamo, regions, chosen, mode, options)
        return out


def _found_or_built(
    label: str,
    target: RegionTarget,
    calls: dict[int, Captured],
    force: bool,
    root: Path,
    dynamo: dict[str, str],
) -> Built | None:
    """The region's artifact, found on disk or built, sealed against eager and
    timed; None where no artifact can serve it (``dynamo`` says why)."""
    args, kwargs, inference, _ = calls[id(target.module)]
    if not force:
        # Without CUDA graphs: the seal below runs it once as it is.
        found = load_runner(target, args, kwargs, cudagraphs=False)
        if isinstance(found, AotRunner):
            done = Built(label, found.path, "present")
            sealed = seal(done, target, calls, found)
            if done.status != "failed":
                hints.remember(target, root, args, kwargs, inference)
                time_speed(done, target, calls, sealed, root)
            return done
    start = time.perf_counter()
    try:
        built = build_region(target, args, kwargs)
    except Refused as err:
        # As in a forecast: the region compiles on the Dynamo path, and a later
        # process's first call asks its figures whether that pays.
        logger.info(f"No artifact for {label}: {err}")
        dynamo[label] = err.reason
        return None
    except Exception as err:  # one region's failure must not stop the others
        logger.warning(f"Could not build {label} ahead of time: {err}")
        return Built(label, None, "failed", reason=str(err))
    done = Built(label, built, "built", time.perf_counter() - start)
    sealed = seal(done, target, calls)
    if done.status != "failed":
        # As a first call leaves one: the next process's first call then runs
        # ahead of its workflow's, while the data is fetched (CompiledRegion.ahead).
        hints.remember(target, root, args, kwargs, inference)
        time_speed(done, target, calls, sealed, root)
    return done


def _judge(
    model: PrognosticModel | DiagnosticModel,
    x: torch.Tensor,
    coords: CoordSystem,
    labels: Mapping[str, str],
    regions: Sequence[str] | None,
    precision: str | None,
    mode: str | None,
    options: Mapping[str, Any] | None,
) -> list[Built]:
    """Compile the regions no artifact can serve (``labels``: why not; opaque
    submodules, or an artifact refused) in a session of ``JUDGE_CALLS`` calls of
    ``model``, as ``compile=True`` would. The session keeps their payoff figures
    (:mod:`~earth2studio_compile.artifacts.payoff`): a later process's first call
    then knows whether the compile pays within its call, and runs the region
    eagerly where it cannot, instead of compiling to find out; Inductor's cache is
    warm for the ones that compile. One :class:`Built` per region of ``labels``:
    ``"judged"`` with what the figures say, else ``"skipped"`` and why."""
    session = CompileSession(
        model, regions=regions, precision=precision, mode=mode, options=options
    )
    # The others run eagerly: their artifacts' CUDA graphs beside the build's
    # captured inputs left FCN3's decoders no memory to compile in (H200).
    session._only = frozenset(labels)
    try:
        # Judged here, not by a child while the region runs eagerly.
        with background.in_process(), session, torch.no_grad():
            session.expect(payoff.JUDGE_CALLS)
            for _ in range(payoff.JUDGE_CALLS):
                model(x, coords)
    except Exception as err:  # one model's failure must not stop the build's report
        why = f"not judged on the Dynamo path ({type(err).__name__}: {err})"
        return [Built(label, None, "failed", reason=why) for label in labels]
    out = []
    for r in session.report.regions:
        if r.label not in labels:
            continue
        figures = payoff.figures_of(r, payoff.JUDGE_CALLS)
        if r.executor != "dynamo" or figures is None:
            why = r.reason or f"its speed was not judged ({r.status})"
            out.append(Built(r.label, None, "skipped", reason=f"not judged: {why}"))
            continue
        why = (
            f"no artifact ({labels[r.label]}); compiled and timed there: "
            f"{figures.saved_ms:.2f} ms saved a call, "
            f"{figures.calls_per_step:g} calls a step, {figures.cost_s:.1f} s of "
            f"compiling at each process's first call; {figures.verdict()}"
        )
        seconds = r.first_call_seconds or 0.0
        out.append(Built(r.label, None, "judged", seconds, reason=why))
    return out
