"""``torch.compile`` of a region's core, counted, with its portable cache bundle."""

from __future__ import annotations

import time
from typing import Any

from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile.artifacts.bundles import RegionBundle
from earth2studio_compile.cache import cache_state, local_cache_source
from earth2studio_compile.executors.base import Target, recompile_limit
from earth2studio_compile.metrics import Laps
from earth2studio_compile.report import RegionReport


class DynamoExecutor:
    """``torch.compile`` of the module, counted, with its portable cache bundle.

    Built by :meth:`build`, which declines with a reason where Dynamo cannot
    compile here (no C++ compiler, a PyTorch without what opaque submodules need).
    It records the figures that only Dynamo has in the region's report: graphs,
    graph breaks, recompiles, CUDA-graph skips, the local cache and the bundle.
    """

    name = "dynamo"
    compiling = False

    def __init__(self, target: Target) -> None:
        self.target = target
        self.report = target.report
        self.cudagraphs = target.policy.cudagraphs
        self.source: str | None = None
        self.not_compiled: str | None = None
        self.keepable = False
        self.compiled, self.backend = _torch.compile_region(
            target.module, target.report.label, **target.policy.torch_kwargs()
        )
        self.bundle = (
            RegionBundle(target.artifacts, target)
            if target.artifacts is not None and target.policy.backend == "inductor"
            else None
        )

    @classmethod
    def build(cls, target: Target) -> DynamoExecutor | str:
        """The executor for ``target``, or why Dynamo cannot compile it here."""
        reason = _torch.preflight(target.policy.backend, target.device)
        if reason is None and target.opaque:
            reason = _torch.missing("reparametrize")
        return reason if reason is not None else cls(target)

    def first_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], laps: Laps
    ) -> Any:
        """Load the bundle, compile and run, save the bundle; a lap for each.

        See :meth:`~earth2studio_compile.executors.base.Executor.first_call`.
        """
        r = self.report
        if self.bundle is not None:
            r.artifact = self.bundle.load(args, kwargs)
            if r.artifact == "loaded":
                self.source = f"the compile cache bundle {self.bundle.path}"
            laps.lap("bundle_load")
        (hits, misses), skips = _torch.fx_cache_counts(), _torch.cudagraph_skips()
        with _torch.call_context(recompile_limit(), self.source is not None):
            out = self.compiled(*args, **kwargs)
        # The compiled call is Dynamo's frame: what the backend and the first run
        # of compiled code did not take is Dynamo's (tracing, guards, bytecode;
        # with graph breaks also the eager code between the graphs).
        laps.lap(
            "dynamo",
            backend=self.backend.backend_seconds,
            first_run=self.backend.first_run_seconds or 0.0,
        )
        if self.backend.runs == 0:
            # Dynamo ran the frame without compiled code (nothing to trace, a
            # skipped frame, a "force_eager" stance): not compiled, so say so.
            self.not_compiled = (
                "torch.compile ran no compiled code for it (Dynamo produced no "
                "graph or skipped the frame)"
            )
            return out
        hits, misses = (a - b for a, b in zip(_torch.fx_cache_counts(), (hits, misses)))
        r.cache = cache_state(hits, misses)
        if r.cache is not None:
            r.cache_source = local_cache_source(_torch.inductor_cache_dir())
        r.graphs = self.backend.graphs
        self._account(self.backend.graphs, _torch.cudagraph_skips() - skips)
        laps.lap("bookkeeping")
        if self.bundle is not None:
            r.artifact = self.bundle.finish(misses, r.artifact)
            laps.lap("bundle_save")
        self.keepable = True
        return out

    def detach(self) -> None:
        """Drop the target (it holds the module) and the finished bundle."""
        self.release()
        self.bundle = None
        self.target = None  # type: ignore[assignment]

    def release(self) -> None:
        """Release the bundle's claim: processes waiting for this compile go on."""
        if self.bundle is not None:
            self.bundle.release()

    def adopt(self, report: RegionReport) -> None:
        """Count recompiles, graph breaks and CUDA-graph skips in ``report``."""
        self.report = report

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        graphs, skips = self.backend.graphs, _torch.cudagraph_skips()
        start = time.perf_counter()
        with _torch.call_context(recompile_limit(), False):
            out = self.compiled(*args, **kwargs)
        new = self.backend.graphs - graphs
        if new:
            r = self.report
            r.recompiles += 1
            seconds = time.perf_counter() - start
            r.compile_seconds += seconds
            logger.info(
                f"{r.label} recompiled ({r.recompiles} so far, {seconds:.1f} s). "
                "Set TORCH_LOGS='recompiles' to see why."
            )
        self._account(new, _torch.cudagraph_skips() - skips)
        return out

    def _account(self, graphs: int, skips: int) -> None:
        """Graph breaks and CUDA-graph skips of one compile, each warned once."""
        r = self.report
        # Each graph beyond the first of one compile is a graph break.
        breaks = max(graphs - 1, 0)
        if breaks:
            new = r.graph_breaks == 0
            r.graph_breaks += breaks
            if new:
                logger.warning(
                    f"{r.label}: {breaks} graph break(s) inside the compiled core; "
                    "it runs as several graphs with eager code between them and may "
                    "gain little. Set TORCH_LOGS='graph_breaks' to see where."
                )
        if skips and self.cudagraphs:
            new = r.cudagraph_skips == 0
            r.cudagraph_skips += skips
            if new:
                logger.warning(
                    f"{r.label}: Inductor skipped CUDA graphs, so mode "
                    f"{r.mode} runs without them. Set TORCH_LOGS='perf_hints' to "
                    "see why."
                )
