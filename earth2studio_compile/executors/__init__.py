"""The ways a region's core can run: eagerly, compiled by Dynamo, or ahead of time.

:mod:`.base` holds the :class:`Executor` Protocol, the :class:`Target` an executor
is built for, :class:`Declined` and :class:`Measured` (what a call measured, which
the region records); :mod:`.eager`, :mod:`.dynamo`, :mod:`.aot` and
:mod:`.background` (eager steps while the artifact builds in a child process) the
executors.
"""

from earth2studio_compile.executors.aot import AotExecutor
from earth2studio_compile.executors.background import BackgroundExecutor
from earth2studio_compile.executors.base import (
    RECOMPILE_LIMIT,
    Declined,
    Executor,
    Measured,
    Target,
    recompile_limit,
)
from earth2studio_compile.executors.dynamo import DynamoExecutor
from earth2studio_compile.executors.eager import EagerExecutor

__all__ = [
    "RECOMPILE_LIMIT",
    "AotExecutor",
    "BackgroundExecutor",
    "Declined",
    "DynamoExecutor",
    "EagerExecutor",
    "Executor",
    "Measured",
    "Target",
    "recompile_limit",
]
