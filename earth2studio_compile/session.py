"""The compile session: compile models' tensor cores in place, restore them on exit."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from loguru import logger

from earth2studio_compile._torch import MODULE_SLOT
from earth2studio_compile.cache import cache_root, usable_root, use_local_cache
from earth2studio_compile.options import CompileOptions
from earth2studio_compile.patches import Patches
from earth2studio_compile.planning import Plan, plan, table_patches
from earth2studio_compile.precision import check_precision
from earth2studio_compile.region import CompiledRegion
from earth2studio_compile.report import (
    CompileReport,
    RegionReport,
    describe,
    interruption,
)
from earth2studio_compile.spec import check_paths

# Type hints only: importing Earth2Studio takes a minute on a small machine, and
# the package is imported before it (the demo's banner comes first).
if TYPE_CHECKING:
    from earth2studio.models.dx.base import DiagnosticModel
    from earth2studio.models.px.base import PrognosticModel


class CompileSession:
    """Compile the tensor-only cores of Earth2Studio models for a ``with`` block.

    On entry, each model's core network (chosen by the model table, or the generic
    path for models the table does not list) is compiled in place, the way
    ``nn.Module.compile()`` does it: parameters, buffers and ``state_dict`` keys are
    unchanged. Compilation happens lazily at the first call. A region whose compile
    or compiled call fails re-runs that call eagerly, logs one WARNING and stays
    eager. On exit every model is restored exactly and one INFO line summarises
    :attr:`report`; when an exception (Ctrl-C included) ends the block, it says at
    which step each region was interrupted.

    Parameters
    ----------
    *models : PrognosticModel | DiagnosticModel
        Prognostic and/or diagnostic models
    mode : str | None, optional
        Inductor mode; None picks ``"reduce-overhead"`` on CUDA (CUDA graphs, with
        each call marked as a new step and outputs cloned) and Inductor's default
        on CPU, by default None
    fullgraph : bool, optional
        Passed to :func:`torch.compile`, by default False
    dynamic : bool | None, optional
        Passed to :func:`torch.compile`, by default None
    backend : str | Callable, optional
        Passed to :func:`torch.compile`, by default ``"inductor"``
    options : Mapping[str, Any] | None, optional
        Inductor options passed to :func:`torch.compile`, by default None
    regions : Sequence[str] | None, optional
        Compile exactly these dotted submodule paths of the single model given,
        overriding the table, by default None
    cache : bool, optional
        Use the persistent compile cache (:mod:`earth2studio_compile.cache`):
        Inductor's local cache under the package cache root unless you set
        ``TORCHINDUCTOR_CACHE_DIR`` yourself, and portable per-region bundles. The
        environment variable ``EARTH2STUDIO_COMPILE_CACHE=off`` disables it too, by
        default True

    precision : str | None, optional
        ``"fp32"`` (TF32 off), ``"tf32"``, ``"bf16"`` (autocast) inside the
        compiled regions' calls only, with the accuracy cost measured once per region
        and reported (:mod:`earth2studio_compile.precision`); None leaves PyTorch's
        global settings alone, by default None
    probe : bool, optional
        Time three steady compiled calls and three eager ones in turn, from call 3
        on, once per region (:class:`~earth2studio_compile.probe.SpeedProbe`), to
        report the speedup and the calls compiling needs to pay for itself, and to
        warn when compiled is slower. False runs every call compiled, by default True

    Raises
    ------
    TypeError, ValueError
        Invalid options (see :class:`~earth2studio_compile.CompileOptions`) or
        ``regions`` with more than one model

    Examples
    --------
    >>> from earth2studio.run import deterministic
    >>> with CompileSession(model) as session:  # doctest: +SKIP
    ...     deterministic(["2024-01-01"], 8, model, data, io)
    >>> session.report.summary()  # doctest: +SKIP
    'FCN.model: compiled (inductor/reduce-overhead) in 19.3 s, 8 calls, ...'
    """

    #: Labels (``Model.region``) of the only regions to compile, the others eager;
    #: None: all. Set by ``build()``'s judge, which times the regions no artifact
    #: serves without loading the others' artifacts and CUDA graphs beside them.
    _only: frozenset[str] | None = None

    def __init__(
        self,
        *models: PrognosticModel | DiagnosticModel,
        mode: str | None = None,
        fullgraph: bool = False,
        dynamic: bool | None = None,
        backend: str | Callable[..., Any] = "inductor",
        options: Mapping[str, Any] | None = None,
        regions: Sequence[str] | None = None,
        cache: bool = True,
        precision: str | None = None,
        probe: bool = True,
    ) -> None:
        self.options = CompileOptions(
            mode=mode,
            fullgraph=fullgraph,
            dynamic=dynamic,
            backend=backend,
            options=options,
        )
        if not isinstance(cache, (bool, np.bool_)):
            raise TypeError(
                f"cache must be True or False, got {type(cache).__name__} ({cache!r}). "
                "To move the cache, set EARTH2STUDIO_COMPILE_CACHE=/path."
            )
        self.cache = bool(cache)
        if not isinstance(probe, (bool, np.bool_)):
            raise TypeError(
                f"probe must be True or False, got {type(probe).__name__} ({probe!r})."
            )
        self.probe = bool(probe)
        self.precision = check_precision(precision)
        if not models:
            raise TypeError("CompileSession needs at least one model.")
        if regions is not None:
            regions = check_paths(regions, "regions")
            if len(models) != 1:
                raise TypeError(
                    "regions names submodules of one model; pass a single model, or "
                    "register each class with earth2studio_compile.register_model()."
                )
        self.models = models
        self.regions = tuple(regions) if regions is not None else None
        self.report = CompileReport()
        self._open: list[CompiledRegion] = []
        self._warned: set[str] = set()
        self._patches = Patches(())
        self._active = False

    def __enter__(self) -> CompileSession:
        if self._active:
            raise RuntimeError("This CompileSession is already open.")
        self.report = CompileReport()
        root = cache_root() if self.cache else None
        if root is not None:
            root = usable_root(root)
        artifacts = None
        if root is not None:
            use_local_cache(root)
            artifacts = root / "artifacts"
        regions = self._plan_regions(artifacts)
        # The table's bitwise-identical method patches (DLWP's zenith fields).
        self._patches = Patches(p for m in self.models for p in table_patches(m))
        # All or nothing: a failure while installing leaves no model compiled.
        try:
            for region in regions:
                self._open.append(region)
                region.install()
            self._patches.install()
        except BaseException:
            self._restore()
            raise
        self._active = True
        if self._open:
            logger.info(
                "torch.compile enabled for "
                + ", ".join(r.report.label for r in self._open)
                + " (compiles at the first step)"
            )
        return self

    def _plan_regions(self, artifacts: Path | None) -> list[CompiledRegion]:
        """Decide every model's regions before any of them is touched."""
        out: list[CompiledRegion] = []
        seen: set[int] = set()
        plans: list[tuple[Any, Plan | BaseException]] = []
        for model in self.models:
            try:
                plans.append((model, plan(model, self.regions)))
            except Exception as err:
                if self.regions is not None and isinstance(
                    err, (TypeError, ValueError)
                ):
                    raise  # the user's own regions are wrong: tell them
                plans.append((model, err))
        outer = _enclosing([p for _, p in plans if isinstance(p, Plan)])
        for model, p in plans:
            if not isinstance(p, Plan):
                # An odd model must not end the forecast: it runs eagerly.
                why = f"could not plan what to compile ({describe(p)})"
                self._skip(type(model).__name__, "", why, warn=True)
                continue
            if not p.targets:
                self._skip(p.name, "", p.reason or "nothing to compile")
                continue
            # Once per model: a refused precision is reported once, not per region.
            chosen = self._precision_for(p)
            for path, module in p.targets:
                if id(module) in seen:
                    continue
                seen.add(id(module))
                if id(module) in outer:
                    # Dynamo traces through it as part of the outer region: a region
                    # here would only see the outer one's eager calls, and count
                    # them as steps.
                    why = f"inside {outer[id(module)]}, which compiles it"
                    self._skip(p.name, path, why)
                    continue
                if module.__dict__.get(MODULE_SLOT) is not None:
                    self._skip(p.name, path, "already compiled outside this session")
                    continue
                if self._only is not None and f"{p.name}.{path}" not in self._only:
                    self._skip(p.name, path, "not one of the regions compiled here")
                    continue
                report = RegionReport(model=p.name, region=path)
                try:
                    region = CompiledRegion(
                        module,
                        report,
                        self.options,
                        p.spec,
                        precision=chosen,
                        artifacts=artifacts,
                        owner=f"{type(model).__module__}.{type(model).__qualname__}",
                        probe=self.probe,
                        warned=self._warned,
                        siblings=self._open,
                    )
                except Exception as err:  # same: run this region eagerly
                    why = f"could not prepare it ({describe(err)})"
                    self._skip(p.name, path, why, warn=True)
                    continue
                self._add(report)
                out.append(region)
        return out

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self._interrupted(exc)
        self.close()

    def _interrupted(self, exc: BaseException) -> None:
        """Say in each open region's report that ``exc`` ended the run, and when:
        a region whose own call it ended says so already."""
        for region in self._open:
            r = region.report
            if r.interrupted is None:
                r.interrupted = (
                    f"after step {r.calls} ({interruption(exc)})"
                    if r.calls
                    else f"before its first call ({interruption(exc)})"
                )

    def ahead(self, wait: bool = False) -> None:
        """Start each region's first call in the background, before the caller's
        first step reaches it, where an ahead-of-time artifact on disk fits the
        inputs of the region's last first call (:meth:`CompiledRegion.ahead`):
        a fresh process then loads and verifies it while the workflow fetches its
        data. The workflows of :mod:`earth2studio_compile.run` call it. A region's
        calls while it runs are eager; closing the session waits for it.

        Parameters
        ----------
        wait : bool, optional
            Return once every first call ahead has ended: the next call of each
            region finds it compiled (or pending, where its first call ahead
            declined), by default False
        """
        if not self._active or not self._open:
            return
        pool = ThreadPoolExecutor(1, thread_name_prefix="first call ahead")
        for region in self._open:
            region.ahead(pool)
        # Its thread ends with its last first call, not with the session: a thread
        # that ran CPU kernels keeps an OpenMP team, and more OpenMP threads than
        # cores turn libgomp's waiting from spinning to sleeping for every team.
        # The caller's CPU steps then each wait to wake theirs (DLESyM small on 2
        # cores: the first compiled call 1.45 s against eager's 0.84, 0.76 after).
        pool.shutdown(wait=False)
        if wait:  # for those an earlier call started too
            for region in self._open:
                region.wait_ahead()

    def expect(self, steps: int) -> None:
        """Say how many workflow steps this session runs (the workflows of
        :mod:`earth2studio_compile.run` do): a region on the Dynamo path whose
        compile an earlier process found cannot pay for itself within them runs
        eagerly from its first call (:mod:`~earth2studio_compile.artifacts.payoff`,
        with the speed probe on), and its figures are kept per step.

        Parameters
        ----------
        steps : int
            The workflow's model steps (an ensemble's: steps x batches)

        Raises
        ------
        TypeError, ValueError
            ``steps`` not a whole number, or not positive
        """
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)):
            raise TypeError(
                f"steps must be a whole number of workflow steps, got "
                f"{type(steps).__name__} ({steps!r})."
            )
        if steps <= 0:
            raise ValueError(f"steps must be positive, got {steps}.")
        for region in self._open:
            region.steps = int(steps)

    def close(self) -> None:
        """Restore every model and log the summary (called by ``__exit__``)."""
        self._restore()
        logger.info(f"torch.compile: {self.report.summary()}")

    def _restore(self) -> None:
        # No torch._dynamo.reset(): each region's compiled code dies with it, and a
        # reset would discard the user's own compiled functions and other sessions'.
        self._patches.restore()
        for region in reversed(self._open):
            region.restore()  # after its first call ahead, if any
        self._open = []
        self._active = False

    def warmup(
        self,
        model: PrognosticModel | DiagnosticModel | None = None,
        coords: Mapping[str, np.ndarray] | None = None,
        batch_size: int = 1,
        device: torch.device | str | None = None,
    ) -> CompileReport:
        """Compile ahead of time: run ``model`` once on zeros.

        Call it at service start, inside the session that will run the forecasts,
        so their first step already runs compiled. Compiling also fills the
        persistent cache, so a later process starts warm. The dummy input must have
        the shapes the forecast will use, or the forecast recompiles.

        Parameters
        ----------
        model : PrognosticModel | DiagnosticModel | None, optional
            One of the session's models, by default the first
        coords : Mapping[str, np.ndarray] | None, optional
            Coordinates of the dummy input, as the workflow will call the model; by
            default the model's ``input_coords()`` at 2024-01-01 (see
            :func:`example_input`)
        batch_size : int, optional
            Samples per call, as the workflow will batch them (an ensemble's
            ``batch_size``); only used without ``coords``, by default 1
        device : torch.device | str | None, optional
            Device of the dummy input, by default the model's parameters' device

        Returns
        -------
        CompileReport
            The session's report so far

        Raises
        ------
        RuntimeError
            The session is not open
        ValueError
            ``model`` is not one of the session's, or a bad ``batch_size``

        Examples
        --------
        >>> with CompileSession(model) as session:  # doctest: +SKIP
        ...     session.warmup()  # compiles now, not at the first forecast step
        ...     for request in requests:
        ...         earth2studio.run.deterministic(request.times, 40, model, data, io)
        """
        if not self._active:
            raise RuntimeError(
                "warmup() compiles inside an open session: call it within "
                "`with CompileSession(model) as session:`."
            )
        model = self.models[0] if model is None else model
        if not any(model is m for m in self.models):
            raise ValueError(
                "warmup() takes one of the models the session was opened with."
            )
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, (int, np.integer))
            or batch_size < 1
        ):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
        if coords is None:
            x, coords = example_input(model, int(batch_size), device=device)
        else:
            coords = OrderedDict(coords)
            x = torch.zeros(
                [len(v) for v in coords.values()], device=device or _model_device(model)
            )
        model(x, coords)
        return self.report

    def _precision_for(self, p: Plan) -> str | None:
        refused = p.spec.precisions_refused.get(self.precision or "")
        if refused is None:
            return self.precision
        logger.warning(
            f"{p.name} does not run in {self.precision}: {refused}. It runs with "
            "PyTorch's global precision settings."
        )
        return None

    def _add(self, region: RegionReport) -> RegionReport:
        self.report.regions.append(region)
        return region

    def _skip(self, model: str, path: str, reason: str, warn: bool = False) -> None:
        self._add(
            RegionReport(model=model, region=path, status="skipped", reason=reason)
        )
        where = f"{model}.{path}" if path else model
        (logger.warning if warn else logger.info)(f"{where} runs eagerly: {reason}")


def example_input(
    model: PrognosticModel | DiagnosticModel,
    batch_size: int = 1,
    time: np.datetime64 | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, OrderedDict]:
    """Zeros on ``model.input_coords()``, batched as Earth2Studio's workflows batch.

    Parameters
    ----------
    model : PrognosticModel | DiagnosticModel
        Prognostic or diagnostic model
    batch_size : int, optional
        Leading ``ensemble`` size when > 1, by default 1
    time : np.datetime64 | None, optional
        Value of a ``time`` coordinate, by default 2024-01-01
    device : torch.device | str | None, optional
        By default the device of the model's first parameter or buffer (CPU if none)

    Returns
    -------
    tuple[torch.Tensor, OrderedDict]
        Input tensor and coordinate system
    """
    device = device or _model_device(model)
    coords: OrderedDict = OrderedDict()
    if batch_size > 1:
        coords["ensemble"] = np.arange(batch_size)
    for dim, value in model.input_coords().items():
        if dim == "batch":
            continue
        if dim == "time":
            value = np.array([np.datetime64("2024-01-01") if time is None else time])
        coords[dim] = value
    shape = [len(v) for v in coords.values()]
    return torch.zeros(shape, device=device), coords


def _model_device(model: Any) -> torch.device:
    if isinstance(model, torch.nn.Module):
        for tensor in [*model.parameters(), *model.buffers()]:
            return tensor.device
    return torch.device("cpu")


def _enclosing(plans: Sequence[Plan]) -> dict[int, str]:
    """``id(module) -> label`` of another planned region that contains it."""
    out: dict[int, str] = {}
    for p in plans:
        for path, module in p.targets:
            if module.__dict__.get(MODULE_SLOT) is not None:
                continue  # compiled outside the session: left alone, with its inside
            label = f"{p.name}.{path}" if path else p.name
            for inner in module.modules():
                if inner is not module:
                    out.setdefault(id(inner), label)
    return out
