"""What a compile session did, for the caller to read and for one log line."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RegionReport:
    """Outcome of one compiled region (a submodule compiled in place).

    Attributes
    ----------
    model : str
        Class name of the model that owns the region, e.g. ``"FCN"``
    region : str
        Dotted path of the submodule inside the model, e.g. ``"model"``
    status : str
        ``"pending"`` (never called), ``"compiled"``, ``"eager"`` (fell back) or
        ``"skipped"`` (not compiled, see ``reason``)
    mode : str | None
        Backend and mode used, e.g. ``"inductor/reduce-overhead"``
    calls : int
        Calls through the region while the session was open: the caller's steps
        (the region's own calls, such as the fp32 reference of a reduced
        precision, are not counted); a failure or an interruption "at step N" is
        at the Nth
    eager_calls : int
        Of those, calls that ran eagerly (fallback re-runs included)
    compile_seconds : float
        Wall time of the calls that compiled (first call and recompiles), compile
        and run together
    graphs : int
        FX graphs compiled at the first call (more than one means graph breaks)
    graph_breaks : int
        Graph breaks Dynamo recorded while compiling this region
    recompiles : int
        Later calls that compiled again (guard failures, e.g. a new shape)
    padded_calls : int
        Calls whose smaller batch was padded to the compiled batch size to avoid a
        recompile
    cudagraph_skips : int
        Times Inductor skipped CUDA graphs for this region
    opaque : int
        Submodules run eagerly as opaque operators inside the compiled graph
    cache : str | None
        Inductor's local cache at the first compile: ``"cold"`` (kernels built),
        ``"warm"`` (all reused), ``"partial"``, or None (no Inductor compile)
    cache_source : str | None
        Which local cache that was, e.g. ``"this package's cache
        (~/.cache/earth2studio/compile/inductor)"`` or ``"PyTorch's default cache
        (/tmp/torchinductor_me), not this package's"``
    artifact : str | None
        Portable cache bundle: ``"loaded"``, ``"loaded after waiting N s"`` (another
        process sharing the cache root compiled it meanwhile), ``"saved"`` (this
        process compiled it), ``"ignored: <why>"`` or None (cache disabled or no
        bundle yet)
    compiled_ms, eager_ms : float | None
        Median of a few synchronized compiled and eager calls of the same shapes,
        interleaved from call 3 on, timed once to tell whether compiling pays off;
        calls that compiled (and, under CUDA graphs, the call after them) are not
        timed; None in shorter sessions
    compiled_range, eager_range : tuple[float, float] | None
        Fastest and slowest of those calls, in ms
    slower : bool | None
        The fastest compiled call and the median were slower than eager's (by
        1%, :func:`earth2studio_compile.probe.is_slower`): compiling does not pay
        off here
    speed_earlier : bool
        Those figures were timed in an earlier process with the same ahead-of-time
        artifact on the same kind of device (kept beside it), not in this one
    precision : str | None
        ``"fp32"``, ``"tf32"`` or ``"bf16"`` inside the region's calls (compiled or
        eager after a fallback), or None for PyTorch's global settings
    device : str | None
        Device type of the region's first call (``"cuda"``, ``"cpu"``), once known;
        the summary says that TF32 has no effect off CUDA
    precision_error : float | None
        Relative L2 of the region's first reduced-precision call against the same
        call in fp32 eager (TF32 off); None in fp32 or without a floating output
    phases : dict[str, float]
        Seconds of what compiling cost, by phase. The first call's phases
        (:attr:`FIRST_CALL`) are consecutive laps of one clock that add up to its
        wall time: ``setup`` (building the candidate executors: policy, compile
        wrapper), ``declined`` (candidates that gave way, e.g. an ahead-of-time
        artifact that failed verification), ``stage`` (staging the arguments,
        entering the precision scope), ``bundle_load`` (reading and planting a
        portable bundle), ``dynamo`` (the compiled call outside the backend and the
        first run: tracing, guards, bytecode, and with graph breaks the eager code
        between graphs), ``backend`` (AOTAutograd and Inductor, cache lookups and
        kernel loading included), ``first_run`` (the first run of compiled code:
        CUDA-graph warm-up, autotuning), ``reference_copy`` and ``verify``
        (copies of the inputs, buffers and attributes before the compiled call,
        one eager call on them checked against it), ``bookkeeping`` (reading the
        compile's
        counters for this report), ``bundle_save``; for an ahead-of-time artifact
        ``key`` (finding it), ``checksum``, ``aot_load``, ``bind``,
        ``warm_convolutions`` (on CUDA, the convolutions recorded when it was
        built, replayed on empty tensors so that cuDNN's first-call work is done
        by eager calls, which let other threads run, rather than inside the
        artifact's run, which holds the GIL), ``first_run`` and ``verify``;
        ``finish`` (leaving the precision scope, casting back, writing back to
        the caller's tensors, cloning). After the first call:
        ``cudagraph_record`` (the second call, which records the CUDA graph; with
        a first call ahead, its second call on the made-up inputs);
        ``precision_reference`` (copying the first call's inputs and running the
        fp32 eager call that measures a reduced precision's error);
        ``before_fallback`` (time spent before compiling failed); ``switch``
        (the call that loaded, ran and verified a background build's artifact);
        ``ahead_eager`` (a first call run ahead of the workflow's, on its own
        thread, by :meth:`~earth2studio_compile.CompileSession.ahead`: the
        workflow's calls made while it ran, eager; the first call's own phases
        are off the caller's path), ``ahead_wait`` (joining it once it ended; the
        session's close waits for one still running).
        With a background build the first call's phases are ``background_start``
        (copying the core for the build process) and its eager ``first_run``
    reason : str | None
        Why the region is not compiled (fallback cause or table reason)
    executor : str | None
        What ran the region's compiled calls: ``"aot"`` (an ahead-of-time artifact
        built by :func:`~earth2studio_compile.build`) or ``"dynamo"``
        (``torch.compile``); None before the first call or after a fallback there
    declined : list[str]
        Candidates passed over at the first call, each with its reason, e.g.
        ``"aot: no artifact for this key"``
    interrupted : str | None
        How the run ended, when an exception (Ctrl-C included) ended it: ``"at
        step 5 (KeyboardInterrupt)"`` (inside the region's call), ``"while
        compiling (step 1, after 3.2 s, KeyboardInterrupt)"``, ``"after step 9
        (...)"`` (between calls) or ``"before its first call (...)"``; None for a
        run that ended normally
    reused : str | None
        Set when the region ran code compiled by an earlier session in this
        process (:mod:`earth2studio_compile.resident`), e.g. ``"compiled earlier
        in this process (first call 31.2 s), session 3"``: nothing was compiled,
        recorded, probed or checked again, and the speed and accuracy figures are
        those measured then
    no_cudagraphs : str | None
        Why the region compiled without the CUDA graphs its mode asked for: its
        modules reassign tensor state in their forward, which the next replay
        would overwrite (:mod:`earth2studio_compile.module_state`); None otherwise
    probe_stopped : str | None
        Why the speed probe stopped without a verdict, e.g. ``"not timed against
        eager: its eager call ran out of device memory beside compiled code at
        step 5"``: the region stays compiled; None otherwise
    background : str | None
        The region's background build
        (:mod:`earth2studio_compile.executors.background`), in words: still
        building (the calls ran eagerly), built and switched to at step N, or
        why its artifact is not used; None when there was none
    """

    model: str
    region: str
    status: str = "pending"
    mode: str | None = None
    calls: int = 0
    eager_calls: int = 0
    compile_seconds: float = 0.0
    graphs: int = 0
    graph_breaks: int = 0
    recompiles: int = 0
    padded_calls: int = 0
    cudagraph_skips: int = 0
    opaque: int = 0
    cache: str | None = None
    cache_source: str | None = None
    artifact: str | None = None
    compiled_ms: float | None = None
    eager_ms: float | None = None
    compiled_range: tuple[float, float] | None = None
    eager_range: tuple[float, float] | None = None
    slower: bool | None = None
    speed_earlier: bool = False
    precision: str | None = None
    device: str | None = None
    precision_error: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    reason: str | None = None
    executor: str | None = None
    declined: list[str] = field(default_factory=list)
    interrupted: str | None = None
    reused: str | None = None
    no_cudagraphs: str | None = None
    probe_stopped: str | None = None
    background: str | None = None

    #: Phases that are a first call's cost of compiling.
    FIRST_CALL = (
        "setup",
        "declined",
        "stage",
        "background_start",
        "bundle_load",
        "key",
        "checksum",
        "aot_load",
        "bind",
        "warm_convolutions",
        "reference_copy",
        "dynamo",
        "backend",
        "first_run",
        "verify",
        "bookkeeping",
        "bundle_save",
        "finish",
    )

    @property
    def first_call_seconds(self) -> float | None:
        """Wall seconds of the first (compiling) call: the sum of its phases, which
        are consecutive laps of one clock (nothing is left over)."""
        if not any(k in self.phases for k in self.FIRST_CALL):
            return None
        return sum(self.phases.get(k, 0.0) for k in self.FIRST_CALL)

    @property
    def break_even_calls(self) -> int | None:
        """Calls after which compiling has paid for itself against eager.

        Eager here is the speed probe's: the same precision, the same process.
        The cost is the first call, the CUDA-graph recording call and the
        precision reference; each later call saves ``eager_ms - compiled_ms``.
        None without both timings or when compiled is not faster.
        """
        ready = self._ready()
        if ready is None or self.compiled_ms is None:
            return None
        assert self.eager_ms is not None
        saved = (self.eager_ms - self.compiled_ms) / 1e3
        if saved <= 0:
            return None
        calls, extra = ready
        return calls + max(0, math.ceil(extra / saved))

    @property
    def ready_seconds(self) -> float | None:
        """Seconds the first call, the CUDA-graph recording call and the precision
        reference took beyond as many eager calls (none below zero): what
        compiling costs a call before its steady calls save; None without the
        first call's phases or eager's timing."""
        ready = self._ready()
        return None if ready is None else max(0.0, ready[1])

    def _ready(self) -> tuple[int, float] | None:
        """The slow calls (the first, the recording one) and what they and the
        precision reference took beyond as many eager calls."""
        first = self.first_call_seconds
        if first is None or not self.eager_ms:
            return None
        slow = [first, self.phases.get("cudagraph_record")]
        calls = sum(1 for s in slow if s is not None)
        cost = sum(s for s in slow if s is not None)
        cost += self.phases.get("precision_reference", 0.0)
        # Calls 1..k cost `cost` instead of k eager calls; each later one saves.
        return calls, cost - calls * self.eager_ms / 1e3

    @property
    def precision_text(self) -> str:
        """``", bf16 (rel. L2 4.3e-03 vs fp32 eager)"``; empty without a precision.

        ``", tf32 (no effect on cpu)"`` for TF32 off CUDA.
        """
        if self.precision is None:
            return ""
        if self.precision == "tf32" and self.device not in (None, "cuda"):
            # TF32 is a CUDA tensor-core format: elsewhere the flags change nothing,
            # and a rel. L2 beside it would only measure compiled vs eager fp32.
            return f", tf32 (no effect on {self.device})"
        if self.precision_error is None:
            return f", {self.precision}"
        return f", {self.precision} (rel. L2 {self.precision_error:.1e} vs fp32 eager)"

    @property
    def speed_text(self) -> str:
        """``", 5.10 ms (5.02-5.30) vs 9.80 ms (9.61-9.95) eager per call (1.92x)"``.

        Medians with their ranges; ``"no measurable difference"`` when the
        ranges overlap and the probe did not find compiled slower.
        """
        if self.compiled_ms is None or not self.eager_ms:
            return ""

        def spread(span: tuple[float, float] | None) -> str:
            return f" ({span[0]:.2f}-{span[1]:.2f})" if span else ""

        text = (
            f", {self.compiled_ms:.2f} ms{spread(self.compiled_range)} vs "
            f"{self.eager_ms:.2f} ms{spread(self.eager_range)} eager per call"
        )
        c, e = self.compiled_range, self.eager_range
        if c and e and c[0] <= e[1] and e[0] <= c[1] and not self.slower:
            return text + " (no measurable difference)"
        return text + f" ({self.eager_ms / self.compiled_ms:.2f}x)"

    @property
    def break_even_text(self) -> str:
        """E.g. ``", pays for its compile after N calls (this run: M)"``, or empty."""
        if self.compiled_ms is None or not self.eager_ms:
            return ""
        n = self.break_even_calls
        if n is None:
            return ", does not pay for its compile at this speed"
        done = "reached in this run" if self.calls >= n else f"this run: {self.calls}"
        return f", pays for its compile after {n} calls ({done})"

    @property
    def label(self) -> str:
        """``Model.region`` (just ``Model`` for a model with no region)."""
        return f"{self.model}.{self.region}" if self.region else self.model


_CACHE_STATES = {
    "cold": "cold: nothing cached yet in {}",
    "warm": "warm: compiled code reused from {}",
    "partial": "partly warm: some compiled code reused from {}",
}


def _cache_text(state: str, source: str | None) -> str:
    """The local cache at a first compile in plain words, e.g. ``"cold: nothing
    cached yet in this package's cache (~/.cache/earth2studio/compile/inductor)"``."""
    return _CACHE_STATES.get(state, state + " {}").format(
        source or "Inductor's local cache"
    )


@dataclass
class CompileReport:
    """Everything a :class:`~earth2studio_compile.CompileSession` did.

    Attributes
    ----------
    regions : list[RegionReport]
        One entry per compiled region, and one per model that was left eager
    """

    regions: list[RegionReport] = field(default_factory=list)

    @property
    def compiled(self) -> bool:
        """True when at least one region ran compiled and none fell back."""
        used = [r for r in self.regions if r.status in ("compiled", "eager")]
        return bool(used) and all(r.status == "compiled" for r in used)

    @property
    def fell_back(self) -> bool:
        """True when any region fell back to eager during the session."""
        return any(r.status == "eager" for r in self.regions)

    @property
    def interrupted(self) -> bool:
        """True when an exception (Ctrl-C included) ended the session's run."""
        return any(r.interrupted is not None for r in self.regions)

    @property
    def compile_seconds(self) -> float:
        """Total wall time of the calls that compiled."""
        return sum(r.compile_seconds for r in self.regions)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for JSON)."""
        return {
            "compiled": self.compiled,
            "fell_back": self.fell_back,
            "interrupted": self.interrupted,
            "compile_seconds": self.compile_seconds,
            "regions": [asdict(r) for r in self.regions],
        }

    def summary(self) -> str:
        """One line, e.g. ``FCN.model: compiled (inductor/default) in 14.2 s, ...``."""
        parts = []
        for r in self.regions:
            if r.status == "building":
                text = (
                    f"{r.label}: ran eagerly, {r.calls} calls, while its "
                    f"ahead-of-time artifact ({r.mode}) is {r.background}"
                )
                text += r.precision_text
            elif r.status == "compiled" and r.executor == "background":
                text = f"{r.label}: eager at first, {r.background}, {r.calls} calls"
                if r.padded_calls:
                    text += f", {r.padded_calls} padded batch(es)"
                text += r.precision_text
                if r.compiled_ms is not None and r.eager_ms:
                    text += r.speed_text
            elif r.status == "compiled" and r.executor == "aot":
                checked = verified_text("verified_earlier" in r.phases)
                text = (
                    f"{r.label}: ran its ahead-of-time artifact ({r.mode}), ready in "
                    f"{r.compile_seconds:.2f} s ({checked}), {r.calls} calls"
                )
                if "ahead_eager" in r.phases:
                    text += f", the first {r.eager_calls} eager while it loaded"
                if r.padded_calls:
                    text += f", {r.padded_calls} padded batch(es)"
                text += r.precision_text
                if r.compiled_ms is not None and r.eager_ms:
                    text += r.speed_text
                    text += " (timed in an earlier process)" if r.speed_earlier else ""
            elif r.status == "compiled":
                cache = f", {_cache_text(r.cache, r.cache_source)}" if r.cache else ""
                made = f"in {r.compile_seconds:.1f} s{cache}"
                if r.reused is not None:
                    made = f"ready: {r.reused}"
                text = (
                    f"{r.label}: compiled ({r.mode}) {made}, {r.calls} calls, "
                    f"{r.graphs} graph(s), "
                    f"{r.graph_breaks} break(s), "
                    f"{r.recompiles} recompile(s)"
                )
                if r.opaque:
                    text += f", {r.opaque} opaque submodule(s) run eagerly in the graph"
                if r.padded_calls:
                    text += f", {r.padded_calls} padded batch(es)"
                if r.cudagraph_skips:
                    text += ", CUDA graphs skipped"
                if r.no_cudagraphs:
                    text += f", no CUDA graphs ({r.no_cudagraphs})"
                text += r.precision_text
                text += "".join(
                    f", {d.replace(': ', ' not used: ', 1)}"
                    for d in r.declined
                    if "no artifact" not in d
                )
                if r.compiled_ms is not None and r.eager_ms:
                    text += r.speed_text
                    # Break-even is a first session's figure: nothing compiled now.
                    text += r.break_even_text if r.reused is None else ""
            elif r.status == "eager":
                text = f"{r.label}: fell back to eager ({r.reason})" + (
                    f"; kept {r.precision_text[2:]}" if r.precision else ""
                )
            elif r.status == "skipped":
                text = f"{r.label}: eager ({r.reason})"
            elif r.interrupted is None:
                text = f"{r.label}: not called"
            else:
                text = r.label
            if r.probe_stopped and r.status == "compiled":
                text += f", {r.probe_stopped}"
            if r.interrupted is not None:
                # First: an interrupted run must not read as a finished one.
                rest = text[len(r.label) + 2 :]
                text = f"{r.label}: interrupted {r.interrupted}" + (
                    f", {rest}" if rest else ""
                )
            parts.append(text)
        return "; ".join(parts) if parts else "nothing to compile"


def verified_text(earlier: bool) -> str:
    """How an ahead-of-time artifact was checked before use, in the summary's words.

    Parameters
    ----------
    earlier : bool
        It had given eager's answer with the same weights in an earlier process,
        and was not verified again (:mod:`.artifacts.verified`)

    Returns
    -------
    str
        ``"verified against eager"``, with the earlier process named
    """
    if earlier:
        return "verified against eager in an earlier process, same weights"
    return "verified against eager"


def _first_line(err: BaseException) -> str:
    line = next((x.strip() for x in str(err).splitlines() if x.strip()), "")
    return line if len(line) <= 300 else line[:300] + "..."


def describe(err: BaseException) -> str:
    """``Outer caused by Root: message``: Dynamo wraps the real cause, often twice."""
    root, seen = err, {id(err)}
    while True:
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if inner is None or id(inner) in seen:
            break
        seen.add(id(inner))
        root = inner
    text = f"{type(root).__name__}: {_first_line(root)}".rstrip(": ")
    return text if root is err else f"{type(err).__name__} caused by {text}"


def interruption(err: BaseException) -> str:
    """What ended a run, for the summary: ``KeyboardInterrupt``, or an error's
    ``Type: message``."""
    return describe(err) if isinstance(err, Exception) else type(err).__name__
