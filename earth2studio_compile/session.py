"""The compile session: compile models' tensor cores in place, restore them on exit."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from loguru import logger

from earth2studio_compile.models import plan
from earth2studio_compile.options import CompileOptions
from earth2studio_compile.region import _SLOT, CompiledRegion
from earth2studio_compile.report import CompileReport, RegionReport


class CompileSession:
    """Compile the tensor-only cores of Earth2Studio models for a ``with`` block.

    On entry, each model's core network (chosen by the model table, or the generic
    path for models the table does not list) is compiled in place, the way
    ``nn.Module.compile()`` does it: parameters, buffers and ``state_dict`` keys are
    unchanged. Compilation happens lazily at the first call. A region whose compile
    or compiled call fails re-runs that call eagerly, logs one WARNING and stays
    eager. On exit every model is restored exactly and one INFO line summarises
    :attr:`report`.

    Parameters
    ----------
    *models : Any
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

    def __init__(
        self,
        *models: Any,
        mode: str | None = None,
        fullgraph: bool = False,
        dynamic: bool | None = None,
        backend: str | Callable[..., Any] = "inductor",
        options: Mapping[str, Any] | None = None,
        regions: Sequence[str] | None = None,
    ) -> None:
        self.options = CompileOptions(
            mode=mode, fullgraph=fullgraph, dynamic=dynamic, backend=backend, options=options
        )
        if not models:
            raise TypeError("CompileSession needs at least one model.")
        if regions is not None:
            if isinstance(regions, str):
                regions = (regions,)
            if len(models) != 1:
                raise TypeError(
                    "regions names submodules of one model; pass a single model, or "
                    "register each class with earth2studio_compile.register_model()."
                )
        self.models = models
        self.regions = tuple(regions) if regions is not None else None
        self.report = CompileReport()
        self._open: list[CompiledRegion] = []

    def __enter__(self) -> CompileSession:
        if self._open:
            raise RuntimeError("This CompileSession is already open.")
        self.report = CompileReport()
        seen: set[int] = set()
        for model in self.models:
            p = plan(model, self.regions)
            if not p.targets:
                self._skip(p.name, "", p.reason or "nothing to compile")
                continue
            for path, module in p.targets:
                if id(module) in seen:
                    continue
                seen.add(id(module))
                if module.__dict__.get(_SLOT) is not None:
                    self._skip(p.name, path, "already compiled outside this session")
                    continue
                region = CompiledRegion(
                    module,
                    self._add(RegionReport(model=p.name, region=path)),
                    self.options,
                    pad_batch=p.spec.pad_batch,
                )
                region.install()
                self._open.append(region)
        if self._open:
            logger.info(
                "torch.compile enabled for "
                + ", ".join(r.report.label for r in self._open)
                + " (compiles at the first step)"
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Restore every model and log the summary (called by ``__exit__``)."""
        for region in reversed(self._open):
            region.restore()
        self._open = []
        if self.report.fell_back:
            # A failed compile can leave Dynamo's caches in a state where the next
            # compile in this process trips an internal assert; start it clean.
            import torch._dynamo

            torch._dynamo.reset()
        logger.info(f"torch.compile: {self.report.summary()}")

    def _add(self, region: RegionReport) -> RegionReport:
        self.report.regions.append(region)
        return region

    def _skip(self, model: str, path: str, reason: str) -> None:
        self._add(RegionReport(model=model, region=path, status="skipped", reason=reason))
        where = f"{model}.{path}" if path else model
        logger.info(f"{where} runs eagerly: {reason}")

