"""``torch.compile`` of a region's core, counted, with its portable cache bundle."""

from __future__ import annotations

import time
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile.accuracy import Reference
from earth2studio_compile.artifacts.aot_load import verify
from earth2studio_compile.artifacts.bundles import RegionBundle
from earth2studio_compile.cache import cache_state, local_cache_source
from earth2studio_compile.executors.base import Measured, Target, recompile_limit
from earth2studio_compile.metrics import Laps


class DynamoExecutor:
    """``torch.compile`` of the module, counted, with its portable cache bundle.

    Built by :meth:`build`, which declines with a reason where Dynamo cannot
    compile here (no C++ compiler, a PyTorch without what opaque submodules need).
    It measures the figures that only Dynamo has (:attr:`measured`): graphs
    compiled, CUDA-graph skips, the local cache and the bundle at the first call,
    new graphs (a recompile) and their seconds at a later one; the region records
    them in its report.
    """

    name = "dynamo"
    compiling = False

    def __init__(self, target: Target) -> None:
        self.target = target
        self.cudagraphs = target.policy.cudagraphs
        self.source: str | None = None
        self.not_compiled: str | None = None
        self.keepable = False
        self.measured = Measured()
        # Kept past detach(): a later session's calls may compile again.
        self.tracing = target.policy.tracing
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
        if reason is None and target.policy.cudagraphs:
            reason = _torch.missing("cudagraph_step")
        if reason is None and target.opaque:
            reason = _torch.missing("reparametrize")
        return reason if reason is not None else cls(target)

    def first_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], laps: Laps
    ) -> Any:
        """Load the bundle, compile and run, save the bundle; a lap for each.

        See :meth:`~earth2studio_compile.executors.base.Executor.first_call`.
        """
        m = self.measured = Measured()
        if self.bundle is not None:
            m.artifact = self.bundle.load(args, kwargs)
            if m.artifact == "loaded":
                self.source = f"the compile cache bundle {self.bundle.path}"
            laps.lap("bundle_load")
        # Copies for one eager call beside the compiled one, taken before the call,
        # which may update its inputs, buffers and attributes.
        reference = Reference.before(self.target.module, args, kwargs)
        generators = self._generators()
        laps.lap("reference_copy")
        (hits, misses), skips = _torch.fx_cache_counts(), _torch.cudagraph_skips()
        self._mark_step()
        with (
            _torch.call_context(recompile_limit(), self.source is not None),
            self.tracing(),
        ):
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
        draws = not all(map(torch.equal, generators, self._generators()))
        eager = self._against_eager(reference, out, draws, (args, kwargs))
        laps.lap("verify")
        if self.not_compiled is not None:
            return eager
        m.cache = cache_state(hits, misses)
        if m.cache is not None:
            m.cache_source = local_cache_source(_torch.inductor_cache_dir())
        m.graphs = self.backend.graphs
        m.cudagraph_skips = self._skips(skips)
        laps.lap("bookkeeping")
        if self.bundle is not None:
            m.artifact = self.bundle.finish(misses, m.artifact)
            laps.lap("bundle_save")
        self.keepable = True
        return out

    def _against_eager(
        self,
        reference: Reference,
        out: Any,
        draws: bool,
        live: tuple[tuple[Any, ...], dict[str, Any]],
    ) -> Any:
        """Eager's answer where the first compiled call gave another (the call's
        in-place updates and attributes eager's too, :attr:`not_compiled` saying
        how far), else None: a compiler can be wrong at one shape (Triton 3.6
        miscompiled Aurora's window partition at its published size, 2026-11-30),
        and an artifact is verified so before it is kept. A core that draws random
        numbers (``draws``) is not checked: compiled code draws its own. The eager
        call leaves the random number generators as it found them."""
        t = self.target
        if draws:
            logger.debug(f"{t.report.label}: draws random numbers, not checked")
            return None
        devices = [t.device] if t.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                eager = reference.run()
        except Exception as err:  # a check must not end a forecast
            logger.debug(f"{t.report.label}: no eager call to check against ({err!r})")
            return None
        why = verify(out, eager, t.precision, quiet=True)
        if why is None:
            return None
        reference.restore(*live)
        self.not_compiled = f"its compiled code gives another answer than eager ({why})"
        return eager

    def _generators(self) -> list[torch.Tensor]:
        """The states of the generators a call on the target's device draws from."""
        states = [torch.get_rng_state()]
        if self.target.device.type == "cuda":
            states.append(torch.cuda.get_rng_state(self.target.device))
        return states

    def detach(self) -> None:
        """Drop the target (it holds the module) and the finished bundle."""
        self.release()
        self.bundle = None
        self.target = None  # type: ignore[assignment]

    def free_graphs(self) -> None:
        """Nothing: Inductor's CUDA graph trees keep one pool per device for every
        compiled function, none of it this executor's alone."""

    def release(self) -> None:
        """Release the bundle's claim: processes waiting for this compile go on."""
        if self.bundle is not None:
            self.bundle.release()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.measured = Measured()
        graphs, skips = self.backend.graphs, _torch.cudagraph_skips()
        start = time.perf_counter()
        self._mark_step()
        with _torch.call_context(recompile_limit(), False), self.tracing():
            out = self.compiled(*args, **kwargs)
        new = self.backend.graphs - graphs
        seconds = time.perf_counter() - start if new else None
        self.measured = Measured(
            graphs=new, seconds=seconds, cudagraph_skips=self._skips(skips)
        )
        return out

    def _mark_step(self) -> None:
        # CUDA graph trees are Dynamo's alone (an ahead-of-time runner records its
        # own graph): a new step lets them reuse the previous step's outputs,
        # which the region has cloned. Its first use imports Inductor's graph
        # trees (27-35 ms of a fresh process's first step on an H100 host).
        if self.cudagraphs:
            _torch.mark_cudagraph_step()

    def _skips(self, before: int) -> int:
        """CUDA-graph skips since ``before``, where this region asked for CUDA
        graphs (Inductor counts them process-wide)."""
        return _torch.cudagraph_skips() - before if self.cudagraphs else 0
