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
import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from earth2studio_compile._imports import quiet_imports
from earth2studio_compile.io import drain
from earth2studio_compile.precision import env_precision
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
    """Report of the latest workflow call in this thread (or context).

    Returns
    -------
    CompileReport | None
        What was compiled, how long it took, fallbacks; None before any workflow
        call and after a ``compile=False`` one
    """
    return _last.get()


_COMPILE_DOC = """    compile : bool, optional
        Compile the models' core networks with torch.compile for this call
        (earth2studio-compile), by default False. Falls back to eager, with a
        WARNING, wherever compiling fails. An ``io`` wrapped in
        ``earth2studio_compile.io.OverlappedIO`` writes in the background and
        is flushed before the workflow returns. The environment variable
        ``EARTH2STUDIO_COMPILE_PRECISION`` (``fp32``, ``tf32``, ``bf16``) sets the
        compiled cores' precision; its accuracy cost is in the summary.
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

    @functools.wraps(upstream)
    def workflow(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        enabled = check_compile_flag(
            bound.arguments.pop("compile", False), upstream.__name__
        )
        ios = [bound.arguments["io"]] if "io" in bound.arguments else []
        chosen = env_precision()  # also with compile=False: a typo is never ignored
        try:
            if not enabled:
                _last.set(None)
                result = upstream(*bound.args, **bound.kwargs)
            else:
                with CompileSession(
                    *(bound.arguments[name] for name in models), precision=chosen
                ) as session:
                    _last.set(session.report)
                    result = upstream(*bound.args, **bound.kwargs)
        except BaseException:
            drain(ios, failed=True)
            raise
        # An OverlappedIO still writing in the background is finished before return.
        drain(ios, failed=False)
        return result

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
