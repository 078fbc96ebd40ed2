"""The speed probe: a few of a region's calls timed compiled and eagerly, once.

It tells whether compiling pays off here (the report's ``compiled_ms``, ``eager_ms``
and break-even; a region judged slower runs eagerly from then on, with the "runs
slower compiled" WARNING), so it must time what the rest of the run does: the
core's steady calls. A call that compiled (a recompile at a new shape, say) is no
steady call, nor is the call after it under CUDA graphs (it records the new graph):
their timings are dropped and the probe goes on at the next call. Nor is the first
eager call of a shape: eager has first-call work of its own (CUDA's lazy loading of
each kernel, cuDNN's choice of algorithms), which made one eager call of DLESyM's
atmosphere encoder twenty times its steady time on an H200 and hid a compiled call
a third slower behind "no measurable difference"; it is not counted. A change of
input shapes starts the probe over, so compiled and eager timings always come from
calls of the same shapes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from earth2studio_compile._torch import tree_flatten
from earth2studio_compile.metrics import timed
from earth2studio_compile.report import RegionReport

__all__ = ["SLOWER", "SpeedProbe", "is_slower", "signature", "slower_text"]

#: Compiled slower than eager by more than this, in its fastest call and in its
#: median: the region runs eagerly from then on. 5% kept FCN3's ten blocks
#: compiled at 0.96x (89.7 ms a call against 86.1, ranges 0.1 ms wide, H200,
#: 2026-12-01).
SLOWER = 1.01


def is_slower(
    compiled_ms: float,
    eager_ms: float,
    compiled_range: tuple[float, float],
    eager_range: tuple[float, float],
) -> bool:
    """Whether compiling does not pay off: the fastest compiled call slower than
    the fastest eager one, and the median too, each by :data:`SLOWER`.

    A slow outlier moves neither a minimum nor a median of three, where it moves
    the ranges' ends: one eager call at 4.5 ms among 1.2 ms ones kept a region
    compiled at 2.5 ms a call (FCN3's layer scale, H200), while the verdict
    asked for every compiled call slower than every eager one.

    Parameters
    ----------
    compiled_ms, eager_ms : float
        Median timed call of each kind
    compiled_range, eager_range : tuple[float, float]
        Fastest and slowest timed call of each kind

    Returns
    -------
    bool
        True where the region should run eagerly
    """
    return (
        compiled_range[0] > SLOWER * eager_range[0] and compiled_ms > SLOWER * eager_ms
    )


def signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What must match for two calls' timings to be compared: shapes, dtypes,
    devices of the tensors, and the types of the other arguments.

    Parameters
    ----------
    args, kwargs : tuple[Any, ...], dict[str, Any]
        The call's positional and keyword arguments, nested containers walked

    Returns
    -------
    tuple[Any, ...]
        The call's signature (the tree's structure first), comparable with ``==``
    """
    leaves, spec = tree_flatten((args, kwargs))
    return (str(spec),) + tuple(
        (tuple(leaf.shape), leaf.dtype, leaf.device)
        if isinstance(leaf, torch.Tensor)
        else type(leaf).__name__
        for leaf in leaves
    )


class SpeedProbe:
    """Times a few calls once per region to tell whether compiling pays off.

    From the third call on (the first compiles, the second records CUDA graphs),
    steady compiled calls and eager calls of the same shapes alternate until
    :attr:`PAIRS` pairs are timed (eager's first call of those shapes is not
    counted, its time being eager's own first-call work: the next call is eager
    again), so a machine that slows down meanwhile slows both alike. Where those
    pairs find compiled slower but are noisy (a kind's slowest call more than
    :attr:`NOISY` times its fastest) and their ranges overlap, it times more
    pairs, up to :attr:`MAX_PAIRS`: on a GPU other processes share, three pairs
    can catch every compiled call in a busy moment and one eager call in a quiet
    one, and a verdict is kept for later sessions (StormCast's denoiser, 1.8x faster
    compiled, was judged slower beside three other test processes on an H200,
    2026-12-02). Eager calls give the same answer within float tolerance, so
    probing costs nothing but the eager speed of a few steps. The verdict rests
    on medians and minima (:func:`is_slower`), which one slow call does not move.
    Rollouts shorter than this are not judged. The probe only measures:
    :attr:`judged` is told once the figures are in the report (the region acts on
    ``slower``).

    Parameters
    ----------
    report : RegionReport
        Where the verdict goes
    cudagraphs : bool, optional
        The region runs CUDA graphs: the call after any compile records one, by
        default False
    enabled : bool, optional
        Probe at all, by default True
    """

    PAIRS = 3
    MAX_PAIRS = 9
    NOISY = 1.25
    # The probe's clock (tests replace it).
    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(
        self, report: RegionReport, cudagraphs: bool = False, enabled: bool = True
    ) -> None:
        self.report = report
        self.cudagraphs = cudagraphs
        self.enabled = enabled
        self.timings: dict[str, list[float]] = {"compiled": [], "eager": []}
        self._next = "compiled"
        # Calls up to this one are not timed: the first compiles, the second
        # records CUDA graphs (not timed in any case).
        self._quiet_until = 2
        self._signature: tuple[Any, ...] | None = None
        # Whether eager has run once at these shapes (its first call is untimed).
        self._eager_warm = False
        #: Called once the probe has judged (its figures are in the report).
        self.judged: Callable[[], None] | None = None

    @property
    def done(self) -> bool:
        """Whether the probe has nothing left to time."""
        return not self.enabled or self.report.compiled_ms is not None

    def kind(self, call: int, sig: Any) -> str | None:
        """``"compiled"`` or ``"eager"``: how to time call number ``call`` (of
        signature ``sig``, see :func:`signature`); None: do not time it.

        Parameters
        ----------
        call : int
            The call's number in the region
        sig : Any
            The call's signature

        Returns
        -------
        str | None
            How to time it, or None
        """
        if self.done or call <= self._quiet_until:
            return None
        if sig != self._signature:
            # Other shapes: the timings so far do not compare with this call's.
            self._restart(sig)
        return self._next

    def stop(self, why: str) -> None:
        """Time no more calls and give no verdict: the region stays as it is.

        Parameters
        ----------
        why : str
            What stopped it, for the report's summary
        """
        self.enabled = False
        self.report.probe_stopped = f"not timed against eager: {why}"

    def compiled_again(self, call: int) -> None:
        """Call number ``call`` compiled: it is no steady call, nor (under CUDA
        graphs) is the next one, which records the new graph."""
        self._quiet_until = max(self._quiet_until, call + int(self.cudagraphs))

    def time(
        self, kind: str, call: int, device: torch.device, run: Callable[[], Any]
    ) -> Any:
        """``run()``, timed on ``device`` as call number ``call`` of ``kind``.

        A compiled call that compiled meanwhile (:meth:`compiled_again`) is not
        counted; the next call is timed compiled instead.

        Parameters
        ----------
        kind : str
            ``"compiled"`` or ``"eager"``
        call : int
            The call's number in the region
        device : torch.device
            Synchronised around the call, so the time is the device's
        run : Callable[[], Any]
            The call

        Returns
        -------
        Any
            ``run()``'s output
        """
        out, seconds = timed(device, run, self.clock)
        if call > self._quiet_until:
            self.record(kind, seconds)
        return out

    def record(self, kind: str, seconds: float) -> None:
        """Add one steady call's timing; judge after the last pair.

        Parameters
        ----------
        kind : str
            ``"compiled"`` or ``"eager"``
        seconds : float
            The call's time
        """
        if kind == "eager" and not self._eager_warm:
            self._eager_warm = True  # eager's own first call: the next is timed
            return
        self.timings[kind].append(seconds)
        self._next = "eager" if kind == "compiled" else "compiled"
        pairs = len(self.timings["eager"])
        if kind == "eager" and pairs >= self.PAIRS:
            if pairs >= self.MAX_PAIRS or self._settled():
                self._judge()

    def _settled(self) -> bool:
        """Whether the pairs so far can be judged: they do not find compiled
        slower, or they do and noise cannot explain it (every compiled call slower
        than every eager one, or each kind's calls within :attr:`NOISY` of each
        other). Only a verdict of slower waits for more pairs: it turns the region
        eager and is kept for later sessions."""
        figures = self._figures()
        if not is_slower(*figures):
            return True
        (c0, c1), (e0, e1) = figures[2:]
        steady = c1 <= self.NOISY * c0 and e1 <= self.NOISY * e0
        return c0 > e1 or steady

    def _figures(
        self,
    ) -> tuple[float, float, tuple[float, float], tuple[float, float]]:
        """The timings so far in ms: each kind's median, then each one's fastest
        and slowest call (:func:`is_slower`'s arguments)."""
        compiled = [t * 1e3 for t in self.timings["compiled"]]
        eager = [t * 1e3 for t in self.timings["eager"]]
        return (
            statistics.median(compiled),
            statistics.median(eager),
            (min(compiled), max(compiled)),
            (min(eager), max(eager)),
        )

    def _restart(self, sig: Any) -> None:
        self.timings = {"compiled": [], "eager": []}
        self._next = "compiled"
        self._signature = sig
        self._eager_warm = False

    def _judge(self) -> None:
        r = self.report
        figures = self._figures()
        r.compiled_ms, r.eager_ms, r.compiled_range, r.eager_range = figures
        r.slower = is_slower(*figures)
        if self.judged is not None:
            self.judged()


def slower_text(r: RegionReport) -> str:
    """What a judged probe found where compiling does not pay off (``r.slower``),
    e.g. ``"runs slower compiled (5.09 ms per call, 5.08-5.10 ms) than eager (3.76
    ms, 3.68-3.80 ms) with inductor/reduce-overhead"``.

    Parameters
    ----------
    r : RegionReport
        The region's report, its probe's figures in it (this process's or an
        earlier one's), ``slower`` set

    Returns
    -------
    str
        The verdict in words, without the region's name
    """
    assert r.compiled_ms is not None and r.eager_ms is not None
    assert r.compiled_range is not None and r.eager_range is not None
    earlier = ", timed in an earlier process" if r.speed_earlier else ""
    return (
        f"runs slower compiled ({r.compiled_ms:.2f} ms per call, "
        f"{_range(r.compiled_range)}{earlier}) than eager "
        f"({r.eager_ms:.2f} ms, {_range(r.eager_range)}) with {r.mode}"
    )


def _range(span: tuple[float, float]) -> str:
    return f"{span[0]:.2f}-{span[1]:.2f} ms"
