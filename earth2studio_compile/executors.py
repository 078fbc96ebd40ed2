"""The ways a region's core can run: eagerly, or compiled by Dynamo.

A :class:`~earth2studio_compile.region.CompiledRegion` picks one executor at its
first call, from its list of candidates, and keeps it until it falls back to eager.
An executor only runs the core: it is given the arguments the region staged
(copied, padded) inside the region's precision scope, and returns what the core
returned. Everything every compiled executor needs (staging and write-back,
CUDA-graph step marks and output clones, precision, fallback) is the region's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile.cache import RegionBundle, cache_state, local_cache_source
from earth2studio_compile.metrics import Laps
from earth2studio_compile.options import CompilePolicy
from earth2studio_compile.report import RegionReport

# Compiled variants a region may hold before it is declared a storm. Legitimate
# shape changes settle quickly: a smaller last ensemble batch needs 2 variants, many
# batch sizes 3 (static, dynamic, and batch 1, which Dynamo specializes), batch and
# grid changing together 4 (measured on CPU with torch 2.14, see docs/user-guide.md,
# "Recompile storms"). A storm is caught at its 4th recompile instead of Dynamo's 8th.
RECOMPILE_LIMIT = 4


def recompile_limit() -> int:
    """Compiled variants a Dynamo region may hold (a user's lower limit wins)."""
    return min(RECOMPILE_LIMIT, _torch.recompile_limit() or RECOMPILE_LIMIT)


class Executor(Protocol):
    """One way to run a region's module.

    Attributes
    ----------
    name : str
        ``"eager"``, ``"dynamo"`` (later ``"aot"``)
    cudagraphs : bool
        Outputs live in CUDA-graph memory that the next replay overwrites: the
        region marks each call as a new step and clones what it returns
    source : str | None
        Where the executor's code came from when not built in this process (e.g.
        ``"the compile cache bundle <path>"``), named when its first call fails
    not_compiled : str | None
        Set by :meth:`first_call` when that call ran no compiled code (its output
        is still right): why. The region then falls back to eager.
    keepable : bool
        Its compiled code can serve a later session over the same module
        (:mod:`earth2studio_compile.resident`): :meth:`detach` and :meth:`adopt`
        move it there
    """

    name: str
    cudagraphs: bool
    source: str | None
    not_compiled: str | None
    keepable: bool

    def detach(self) -> None:
        """Let go of the module and the session's state before being kept."""
        ...

    def adopt(self, report: RegionReport) -> None:
        """Record into ``report`` from now on (a later session's region)."""
        ...

    def first_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], laps: Laps
    ) -> Any:
        """Run the first call and return its output.

        Every second of it goes into ``laps``, one lap per phase (the report's
        :attr:`~earth2studio_compile.report.RegionReport.FIRST_CALL` names them).
        """
        ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run a later call."""
        ...


class Declined(Exception):
    """Raised by a candidate's first call to give way: the region tries the next.

    The candidate must not have changed anything the caller can see (no output
    returned, no input or buffer written), so the next candidate runs the same call.
    """


@dataclass(frozen=True)
class Target:
    """What a candidate executor is asked to run: one region, at its first call.

    Attributes
    ----------
    module : torch.nn.Module
        The region's module
    report : RegionReport
        The region's report (label, figures the executor records)
    policy : CompilePolicy
        What the region compiles with on ``device``
    device : torch.device
        Device of the first call's first tensor argument
    precision : str | None
        The region's precision (part of every compiled artifact's key)
    artifacts : Path | None
        Directory of portable bundles and artifacts, None when the cache is off
    owner : str
        Qualified class name of the model that owns the region
    opaque : bool
        The region calls opaque submodules inside its graph
    fp32_modules : tuple[str, ...]
        Class names of submodules kept in fp32 under ``"bf16"`` (the table's)
    """

    module: torch.nn.Module
    report: RegionReport
    policy: CompilePolicy
    device: torch.device
    precision: str | None
    artifacts: Path | None
    owner: str
    opaque: bool
    fp32_modules: tuple[str, ...] = ()


class EagerExecutor:
    """The module's own call: what a region runs after a fallback and to compare."""

    name = "eager"
    cudagraphs = False
    source = None
    not_compiled = None
    keepable = False

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def first_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], laps: Laps
    ) -> Any:
        """Nothing to build: the call, as its first run."""
        out = self(*args, **kwargs)
        laps.lap("first_run")
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _torch.call_module(self.module, args, kwargs)

    def detach(self) -> None:
        """Nothing is kept of an eager executor."""

    def adopt(self, report: RegionReport) -> None:
        """Nothing is recorded by an eager executor."""


class DynamoExecutor:
    """``torch.compile`` of the module, counted, with its portable cache bundle.

    Built by :meth:`build`, which declines with a reason where Dynamo cannot
    compile here (no C++ compiler, a PyTorch without what opaque submodules need).
    It records the figures that only Dynamo has in the region's report: graphs,
    graph breaks, recompiles, CUDA-graph skips, the local cache and the bundle.
    """

    name = "dynamo"

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
            RegionBundle(
                target.artifacts, target.owner, target.report.region, target.module
            )
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
        """Load the bundle, compile and run, save the bundle; a lap for each."""
        r = self.report
        if self.bundle is not None:
            # Autocast changes the compiled graph: bf16 and fp32 bundles differ.
            key = f"{self.target.policy.cache_text}|precision={self.target.precision}"
            r.artifact = self.bundle.load(args, kwargs, self.target.device, key)
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
        if self.bundle is not None:
            self.bundle.release()
        self.bundle = None
        self.target = None  # type: ignore[assignment]

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
