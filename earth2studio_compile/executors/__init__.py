"""The ways a region's core can run: eagerly, compiled by Dynamo, or ahead of time.

:mod:`.base` holds the :class:`Executor` Protocol, the :class:`Target` an executor
is built for and :class:`Declined`; :mod:`.eager`, :mod:`.dynamo`, :mod:`.aot` and
:mod:`.background` (eager steps while the artifact builds in a child process) the
executors.
"""

from earth2studio_compile.executors.aot import AotExecutor
from earth2studio_compile.executors.background import BackgroundExecutor
from earth2studio_compile.executors.base import (
    RECOMPILE_LIMIT,
    Declined,
    Executor,
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
    "Target",
    "recompile_limit",
]
