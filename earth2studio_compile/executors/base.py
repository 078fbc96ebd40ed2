"""What every executor is: the Protocol, the target it runs, how it declines.

A :class:`~earth2studio_compile.region.CompiledRegion` picks one executor at its
first call, from its list of candidates, and keeps it until it falls back to eager.
An executor only runs the core: it is given the arguments the region staged
(copied, padded) inside the region's precision scope, and returns what the core
returned. Everything every compiled executor needs (staging and write-back,
CUDA-graph step marks and output clones, precision, fallback) is the region's.

The region is also the only writer of its report: an executor keeps what its last
call measured in a :class:`Measured` record, and the region copies it into the
report after each call and logs what it tells.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from earth2studio_compile import _torch
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.measured import Measured
from earth2studio_compile.metrics import Laps
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
        ``"eager"``, ``"dynamo"``, ``"aot"`` or ``"background"``
    cudagraphs : bool
        Outputs live in CUDA-graph memory that the next replay overwrites: the
        region clones what it returns (an executor on CUDA graph trees marks each
        call as a new step itself)
    source : str | None
        Where the executor's code came from when not built in this process (e.g.
        ``"the compile cache bundle <path>"``), named when its first call fails
    not_compiled : str | None
        Set by :meth:`first_call` when that call ran no compiled code (its output
        is still right): why. The region then falls back to eager.
    keepable : bool
        Its compiled code can serve a later session over the same module
        (:mod:`earth2studio_compile.resident`): :meth:`detach` moves it there
    compiling : bool
        Its calls run eagerly while compiled code is being made elsewhere (a
        background build): the speed probe waits. When it turns False, the
        executor runs compiled code from then on, or, with :attr:`not_compiled`
        set, never will
    measured : Measured
        What its last call (first or later) measured; the region copies it into
        its report after each call, returned or raised
    """

    name: str
    source: str | None
    not_compiled: str | None
    keepable: bool
    measured: Measured

    @property
    def cudagraphs(self) -> bool: ...

    @property
    def compiling(self) -> bool: ...

    def detach(self) -> None:
        """Let go of the module and the session's state before being kept."""
        ...

    def release(self) -> None:
        """Give up what other processes may wait for (a claimed cache bundle)."""
        ...

    def free_graphs(self) -> None:
        """Drop the device memory its own CUDA graphs hold, where it has any:
        for an executor kept unused (its region eager for being slower). A later
        call records them again."""
        ...

    def first_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], laps: Laps
    ) -> Any:
        """Run the first call and return its output (what it measured:
        :attr:`measured`).

        Every second of it goes into ``laps``, one lap per phase (the report's
        :attr:`~earth2studio_compile.report.RegionReport.FIRST_CALL` names them).

        Parameters
        ----------
        args, kwargs : tuple[Any, ...], dict[str, Any]
            The region's first call's arguments
        laps : Laps
            Where each phase's seconds go

        Returns
        -------
        Any
            The call's output
        """
        ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run a later call (what it measured: :attr:`measured`); raise
        :class:`Declined` for one it cannot take."""
        ...


class Declined(Exception):
    """Raised by an executor to give way: the region tries the candidates again.

    At the first call the next candidate takes over; at a later call (inputs an
    ahead-of-time artifact was not built for) the candidates are tried again for
    that call, counted as a recompile. The executor must not have changed anything
    the caller can see (no output returned, no input or buffer written), so the
    next candidate runs the same call.
    """


def root_of(artifacts: Path | None) -> Path | None:
    """The cache root above a region's artifacts directory, None when the cache is
    off: where hints, ahead-of-time artifacts and background builds are kept.

    Parameters
    ----------
    artifacts : Path | None
        The region's directory of portable bundles and artifacts

    Returns
    -------
    Path | None
        Its parent
    """
    return artifacts.parent if artifacts is not None else None


@dataclass(frozen=True, kw_only=True)
class Target(RegionTarget):
    """What a candidate executor is asked to run: one region, at its first call.

    The region's settings (module, owner, region, policy, device, precision,
    opaque, fp32_modules) and the keys made of them are
    :class:`~earth2studio_compile.artifacts.key.RegionTarget`'s; build one with
    :meth:`~earth2studio_compile.artifacts.key.RegionTarget.resolve`.

    Attributes
    ----------
    report : RegionReport
        The region's report, read for its label; only the region writes it
    artifacts : Path | None
        Directory of portable bundles and artifacts, None when the cache is off
    """

    report: RegionReport
    artifacts: Path | None
    # Artifact keys by input signature; see aot_key.
    _aot_keys: dict[str, tuple[str, dict[str, Any]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def root(self) -> Path | None:
        """The cache root the artifacts lie under: :func:`root_of` them."""
        return root_of(self.artifacts)

    def aot_key(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """:meth:`~earth2studio_compile.artifacts.key.RegionTarget.aot_key`,
        computed once for the candidates.

        A target lives for one choice of executor, that is one call, in which the
        module cannot change; the artifact's loader and a background build both
        need the key of that call. A later call makes a new target, so a changed
        module never meets a key of its old self.
        """
        leaves, spec = _torch.tree_flatten((tuple(args), dict(kwargs)))
        seen = [
            (x.shape, x.dtype, x.device) if isinstance(x, torch.Tensor) else x
            for x in leaves
        ]
        signature = f"{spec}|{seen!r}"
        if signature not in self._aot_keys:
            self._aot_keys[signature] = super().aot_key(args, kwargs)
        return self._aot_keys[signature]
