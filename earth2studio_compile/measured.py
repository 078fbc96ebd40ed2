"""What an executor's call measured, and how its region records it.

Executors only measure: each call fills a :class:`Measured` record. The region
(:class:`~earth2studio_compile.region.CompiledRegion`) is the only writer of its
:class:`~earth2studio_compile.report.RegionReport`, through :func:`record`, which
also says in the log what a reader must know (recompiles, graph breaks, skipped
CUDA graphs, a background build's switch).
"""

from __future__ import annotations

from dataclasses import dataclass

from loguru import logger

from earth2studio_compile.report import RegionReport, verified_text

__all__ = ["Measured", "record", "warn_fallback"]

_TORCH_LOGS_HINT = (
    "Set TORCH_LOGS='+dynamo,graph_breaks,recompiles' (and TORCHDYNAMO_VERBOSE=1) "
    "to see more."
)


@dataclass(slots=True)
class Measured:
    """What an executor's last call measured, for the region to copy into its report.

    An executor makes a new record at each call (an executor that measures
    nothing keeps an empty one) and fills it as the call goes, so a call that
    raises leaves what it measured before. A field left None was not measured.

    Attributes
    ----------
    artifact : str | None
        The portable cache bundle's state after a first call (``"loaded"``,
        ``"saved"``, ...; :attr:`~earth2studio_compile.report.RegionReport.artifact`)
    cache, cache_source : str | None
        Inductor's local cache at a first call, and which cache that was
    graphs : int | None
        FX graphs the call compiled: all of a first call's, or a later call's new
        ones (any means it recompiled); None where nothing is compiled here
    seconds : float | None
        Wall time of a later call that compiled again
    cudagraph_skips : int
        Times Inductor skipped CUDA graphs in the call (counted only where the
        executor asked for CUDA graphs)
    background : str | None
        The background build in words, as the call left it
    switch_seconds : float | None
        The call loaded, ran and verified a background build's artifact in this
        many seconds, and runs it from now on (:attr:`background` is then the
        build's own description)
    verified_earlier : bool
        That switch did not verify the artifact again: it had given eager's
        answer with the same weights in an earlier process
    """

    artifact: str | None = None
    cache: str | None = None
    cache_source: str | None = None
    graphs: int | None = None
    seconds: float | None = None
    cudagraph_skips: int = 0
    background: str | None = None
    switch_seconds: float | None = None
    verified_earlier: bool = False


def record(report: RegionReport, m: Measured, first: bool) -> None:
    """Take in what an executor's call measured, and log it.

    Called by the region only: executors measure (:class:`Measured`), the
    region records.

    Parameters
    ----------
    report : RegionReport
        The region's report
    m : Measured
        The call's record
    first : bool
        The region's first call (its graphs are the compile's, not a
        recompile's)
    """
    r = report
    if m.artifact is not None:
        r.artifact = m.artifact
    if m.cache is not None:
        r.cache, r.cache_source = m.cache, m.cache_source
    graphs = m.graphs or 0
    if first and m.graphs is not None:
        r.graphs = m.graphs
    elif graphs:
        r.recompiles += 1
        seconds = m.seconds or 0.0
        r.compile_seconds += seconds
        logger.info(
            f"{r.label} recompiled ({r.recompiles} so far, {seconds:.1f} s). "
            "Set TORCH_LOGS='recompiles' to see why."
        )
    # Each graph beyond the first of one compile is a graph break; graph
    # breaks and CUDA-graph skips are each warned once.
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
    if m.cudagraph_skips:
        new = r.cudagraph_skips == 0
        r.cudagraph_skips += m.cudagraph_skips
        if new:
            logger.warning(
                f"{r.label}: Inductor skipped CUDA graphs, so mode "
                f"{r.mode} runs without them. Set TORCH_LOGS='perf_hints' to "
                "see why."
            )
    if m.switch_seconds is not None:
        r.phases["switch"] = m.switch_seconds
        r.background = (
            f"{m.background}; compiled from step {r.calls} on (switched in "
            f"{m.switch_seconds:.2f} s, {verified_text(m.verified_earlier)})"
        )
        logger.info(f"{r.label}: {r.background}")
    elif m.background is not None:
        r.background = m.background


def warn_fallback(report: RegionReport, stage: str, rerun: bool) -> None:
    """The one WARNING of a region that fell back to eager (``report.reason``).

    Parameters
    ----------
    report : RegionReport
        The region's report, its reason set
    stage : str
        When, e.g. ``"at its first call after 3.2 s"`` or ``"at step 7"``
    rerun : bool
        The failing call was re-run eagerly (else it ran eagerly at once)
    """
    what = "was re-run eagerly" if rerun else "ran eagerly"
    logger.warning(
        f"torch.compile failed for {report.label} {stage}: {report.reason}. That call "
        f"{what} and {report.label} stays eager for the rest of the session; no "
        f"output is lost. {_TORCH_LOGS_HINT}"
    )
