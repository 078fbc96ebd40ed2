"""The ways a region's core can run: eagerly, compiled by Dynamo, or ahead of time.

:mod:`.base` holds the :class:`Executor` Protocol, the :class:`Target` an executor
is built for, :class:`Declined` and :class:`Measured` (what a call measured, which
the region records); :mod:`.eager`, :mod:`.dynamo`, :mod:`.aot` and
:mod:`.background` (eager steps while the artifact builds in a child process) the
executors; :data:`CANDIDATES` the order a region tries them in.
"""

from collections.abc import Callable, Iterator

from earth2studio_compile.executors.aot import AotExecutor
from earth2studio_compile.executors.background import BackgroundExecutor
from earth2studio_compile.executors.base import (
    RECOMPILE_LIMIT,
    Declined,
    Executor,
    Measured,
    Target,
    recompile_limit,
    root_of,
)
from earth2studio_compile.executors.dynamo import DynamoExecutor
from earth2studio_compile.executors.eager import EagerExecutor
from earth2studio_compile.report import describe

#: Executors a region tries at its first call, in order: each returns an executor
#: for the :class:`~earth2studio_compile.executors.Target`, or a reason to decline
#: (then the next is tried; the last reason is the fallback's).
#: With no artifact, a background build runs (eager steps meanwhile) where it
#: can; Dynamo, on the caller's first step, where it cannot.
CANDIDATES: list[Callable[[Target], Executor | str]] = [
    AotExecutor.build,
    BackgroundExecutor.build,
    DynamoExecutor.build,
]


def offers(target: Target) -> Iterator[Executor | str]:
    """Each of :data:`CANDIDATES` built for ``target``: an executor, or why not."""
    for candidate in CANDIDATES:
        try:
            yield candidate(target)
        except Exception as err:  # nothing on the compile path may end a forecast
            yield f"setting up torch.compile failed ({describe(err)})"


__all__ = [
    "CANDIDATES",
    "RECOMPILE_LIMIT",
    "AotExecutor",
    "BackgroundExecutor",
    "Declined",
    "DynamoExecutor",
    "EagerExecutor",
    "Executor",
    "Measured",
    "Target",
    "offers",
    "recompile_limit",
    "root_of",
]
