"""Earth2Studio's built-in workflows with a ``compile`` flag.

``deterministic``, ``diagnostic`` and ``ensemble`` take exactly the parameters of the
installed ``earth2studio.run`` functions, in the same order with the same defaults,
plus ``compile: bool = False`` last. With ``compile=False`` they call upstream's
function unchanged. With ``compile=True`` they call it inside a
:class:`~earth2studio_compile.CompileSession` over the workflow's models, so the
models' core networks run compiled for that call and are restored afterwards.

The signatures are derived from the installed upstream functions rather than
copied, so a new upstream parameter appears here without a code change.

For control over ``mode``, ``backend`` and the rest, wrap upstream's workflow in a
session yourself::

    with CompileSession(model, mode="max-autotune-no-cudagraphs"):
        earth2studio.run.deterministic(time, nsteps, model, data, io)
"""

from __future__ import annotations

import contextvars
import difflib
import functools
import inspect
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from loguru import logger

from earth2studio_compile._imports import quiet_imports
from earth2studio_compile.artifacts import background
from earth2studio_compile.io import drain, for_compiled_call
from earth2studio_compile.precision import env_precision, warn_bad_env
from earth2studio_compile.report import CompileReport
from earth2studio_compile.session import CompileSession

with quiet_imports():
    import earth2studio.run as _upstream

__all__ = [
    "check_compile_flag",
    "deterministic",
    "diagnostic",
    "ensemble",
    "last_report",
]

# Per context, so threads (and asyncio tasks) running workflows each see their own.
_last: contextvars.ContextVar[CompileReport | None] = contextvars.ContextVar(
    "earth2studio_compile_last_report", default=None
)


def last_report() -> CompileReport | None:
    """Report of the latest ``compile=True`` workflow call in this thread (or context).

    A ``compile=False`` call has nothing to report and leaves it unchanged, so the
    report of a compiled run stays available after eager calls that follow it.

    Returns
    -------
    CompileReport | None
        What was compiled, how long it took, fallbacks; None before the first
        ``compile=True`` call
    """
    return _last.get()


_COMPILE_DOC = """    compile : bool, optional
        Compile the models' core networks with torch.compile for this call
        (earth2studio-compile), by default False. Falls back to eager, with a
        WARNING, wherever compiling fails. An ``io`` wrapped in
        ``earth2studio_compile.io.OverlappedIO`` writes in the background and
        is flushed before the workflow returns; with compile=True a
        ``ZarrBackend`` is written so too, for the call (its writes were what
        bound a compiled call), and is returned written whole. The environment
        variable ``EARTH2STUDIO_COMPILE_PRECISION`` (``fp32``, ``tf32``,
        ``bf16``) sets the compiled cores' precision; its accuracy cost is in
        the summary. A bad value is an error with ``compile=True`` and one
        WARNING with ``compile=False``, which runs upstream's workflow whatever
        it says.
"""


def check_compile_flag(value: Any, workflow: str = "the workflow") -> bool:
    """Validate the ``compile`` argument.

    Parameters
    ----------
    value : Any
        What the caller passed as ``compile``
    workflow : str, optional
        Name used in the error message

    Returns
    -------
    bool
        The flag as a plain bool

    Raises
    ------
    TypeError
        ``value`` is not a bool
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(
        f"compile must be True or False, got {type(value).__name__} ({value!r}). "
        f"To choose a mode or backend, call earth2studio.run.{workflow} inside "
        "earth2studio_compile.CompileSession(model, mode=...) instead."
    )


class _Default:
    """Stands for a default in generated source: its repr names it in a mapping."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"_defaults[{self.name!r}]"


def _binder(name: str, signature: inspect.Signature) -> Callable[..., None]:
    """A function named ``name`` with exactly ``signature`` that does nothing.

    Calling it with wrong arguments raises the TypeError Python raises for the
    function itself (``deterministic() missing 1 required positional argument:
    'io'``), the text a caller of upstream's function would read.
    """
    plain = signature.replace(
        parameters=[
            p.replace(
                annotation=inspect.Parameter.empty,
                default=(
                    p.default
                    if p.default is inspect.Parameter.empty
                    else _Default(p.name)
                ),
            )
            for p in signature.parameters.values()
        ],
        return_annotation=inspect.Signature.empty,
    )
    defaults = {
        p.name: p.default
        for p in signature.parameters.values()
        if p.default is not inspect.Parameter.empty
    }
    namespace: dict[str, Any] = {"_defaults": defaults}
    exec(f"def {name}{plain}:\n    pass\n", namespace)  # noqa: S102
    return namespace[name]  # type: ignore[no-any-return]


_UNEXPECTED = re.compile(r"got an unexpected keyword argument '([^']+)'")


def _check_arguments(
    binder: Callable[..., None],
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Raise Python's own TypeError for a wrong call, with a hint for a misspelling."""
    try:
        binder(*args, **kwargs)
    except TypeError as err:
        message = str(err)
        found = _UNEXPECTED.search(message)
        if found is not None:
            close = difflib.get_close_matches(
                found.group(1), list(signature.parameters), n=1
            )
            if close:
                message += f". Did you mean {close[0]!r}?"
        raise TypeError(message) from None


def _model_steps(arguments: dict[str, Any]) -> int | None:
    """The prognostic's steps a workflow call runs: ``nsteps``, times the batches
    of an ensemble (``nensemble`` members, ``batch_size`` a batch); None where
    the arguments do not say."""
    nsteps = arguments.get("nsteps")
    if not isinstance(nsteps, int) or nsteps <= 0:
        return None
    members = arguments.get("nensemble")
    if members is None:
        return nsteps
    batch = arguments.get("batch_size") or members
    if not isinstance(members, int) or not isinstance(batch, int) or batch <= 0:
        return None
    return nsteps * math.ceil(members / batch)


def _with_compile(
    upstream: Callable[..., Any], models: tuple[str, ...]
) -> Callable[..., Any]:
    """Upstream's workflow plus a trailing ``compile: bool = False`` parameter."""
    base = inspect.signature(upstream)
    signature = base.replace(
        parameters=[
            *base.parameters.values(),
            inspect.Parameter(
                "compile",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=False,
                annotation="bool",
            ),
        ]
    )
    binder = _binder(upstream.__name__, signature)

    @functools.wraps(upstream)
    def workflow(*args: Any, **kwargs: Any) -> Any:
        _check_arguments(binder, signature, args, kwargs)
        bound = signature.bind(*args, **kwargs)
        enabled = check_compile_flag(
            bound.arguments.pop("compile", False), upstream.__name__
        )
        given = bound.arguments.get("io")
        chosen = overlapped = None
        if enabled:
            chosen = env_precision()  # a typo stops a compiled run before it starts
            overlapped = for_compiled_call(given)
            if overlapped is not None:
                bound.arguments["io"] = overlapped
                workers = overlapped.workers
                logger.info(
                    f"compile=True: {type(given).__name__}'s writes overlap the "
                    f"steps (OverlappedIO, {workers} worker{'s' * (workers != 1)}); "
                    "pass an OverlappedIO of your own to choose them."
                )
        else:
            # Upstream's workflow whatever the environment says: a bad value is
            # named once, never raised.
            warn_bad_env()
        ios = [bound.arguments["io"]] if "io" in bound.arguments else []
        # A build that a closing session launches waits for the writers to finish:
        # its copy and save of the weights would share the disk and the GIL with them.
        with background.deferred():
            try:
                if not enabled:
                    result = upstream(*bound.args, **bound.kwargs)
                else:
                    with CompileSession(
                        *(bound.arguments[name] for name in models), precision=chosen
                    ) as session:
                        _last.set(session.report)
                        steps = _model_steps(bound.arguments)
                        if steps is not None:
                            session.expect(steps)
                        # The cores' artifacts load while the workflow fetches data.
                        session.ahead()
                        result = upstream(*bound.args, **bound.kwargs)
            except BaseException:
                drain(ios, failed=True)
                raise
            # An OverlappedIO still writing in the background is finished first.
            drain(ios, failed=False)
        # Upstream returns the io it was given: the caller's, not the wrapper.
        return given if overlapped is not None and result is overlapped else result

    doc = upstream.__doc__ or ""
    marker = "\n    Returns\n"
    workflow.__doc__ = (
        doc.replace(marker, "\n" + _COMPILE_DOC + marker, 1)
        if marker in doc
        else doc + "\n" + _COMPILE_DOC
    )
    workflow.__annotations__ = {**upstream.__annotations__, "compile": "bool"}
    workflow.__signature__ = signature  # type: ignore[attr-defined]
    workflow.__module__ = __name__
    del workflow.__wrapped__  # inspect must see the new signature, not upstream's
    return workflow


deterministic = _with_compile(_upstream.deterministic, ("prognostic",))
diagnostic = _with_compile(_upstream.diagnostic, ("prognostic", "diagnostic"))
ensemble = _with_compile(_upstream.ensemble, ("prognostic",))
