"""Inductor's modes and options, checked before a compile; its preflight and logs.

What the installed Inductor accepts (modes, option names, option value types), the
options that let max-autotune compile on CPU and keep its tables off the terminal,
whether Inductor can build on a device at all, and the torch log line a CPU compile
need not show.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from loguru import logger

from earth2studio_compile._torch.probes import missing


# -- logging ---------------------------------------------------------------------------
class _NoCudaRuntimeNote(logging.Filter):
    """Drops ``torch.utils.cpp_extension``'s "No CUDA runtime is found" warning.

    Torch logs it when it finds a CUDA toolkit directory but no usable GPU, on the
    first import of ``cpp_extension``, which Inductor makes while compiling for the
    CPU. It concerns building CUDA extensions, which a CPU compile never does; it is
    passed on at TRACE.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("No CUDA runtime is found"):
            logger.trace(f"torch: {record.getMessage()}")
            return False
        return True


def quiet_cpp_extension_log() -> None:
    """Install :class:`_NoCudaRuntimeNote` once on torch's ``cpp_extension`` logger."""
    log = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _NoCudaRuntimeNote) for f in log.filters):
        log.addFilter(_NoCudaRuntimeNote())


# -- options ---------------------------------------------------------------------------
def inductor_modes() -> list[str]:
    """Mode strings the installed Inductor accepts (``"default"``, ...)."""
    import torch._inductor

    return list(torch._inductor.list_mode_options().keys())


def mode_options(mode: str, dynamic: bool | None = None) -> dict[str, Any]:
    """The Inductor settings a mode stands for.

    Parameters
    ----------
    mode : str
        A :func:`torch.compile` mode (``"max-autotune"``, ...)
    dynamic : bool | None, optional
        :func:`torch.compile`'s ``dynamic``, which some modes read

    Returns
    -------
    dict[str, Any]
        Inductor option names and values
    """
    import torch._inductor

    return dict(torch._inductor.list_mode_options(mode, dynamic))


def cpu_autotune_fixes() -> dict[str, Any]:
    """Inductor options that let a max-autotune mode compile on CPU.

    With ``max_autotune`` on CPU, Inductor may pick its C++ GEMM/BMM template and
    fuse the following pointwise ops into it. On torch 2.14.1 that fusion fails
    for FCN's AFNO core (``InductorError: AssertionError: buf15`` in
    ``cpp_template_kernel.store_pointwise_nodes``, a masked load the template's
    epilogue does not know); pytorch/pytorch#185405 and #180980 are the same family.
    Without epilogue fusion the template is still autotuned and chosen.
    """
    return {"epilogue_fusion": False}


# Autotuning prints its tables ("AUTOTUNE bmm(...)", "Autotune Choices Stats") with
# sys.stderr.write, not through logging; these options turn the printing off, and the
# matching environment variables, when the user set them, win.
_QUIET_AUTOTUNE = {
    "autotune_num_choices_displayed": (
        0,
        "TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED",
    ),
    "max_autotune_report_choices_stats": (
        False,
        "TORCHINDUCTOR_MAX_AUTOTUNE_REPORT_CHOICES_STATS",
    ),
}
QUIET_AUTOTUNE_KEYS = frozenset(_QUIET_AUTOTUNE)


def quiet_autotune_options() -> dict[str, Any]:
    """Inductor options that keep autotuning's tables off the terminal.

    Returns
    -------
    dict[str, Any]
        Only options the installed Inductor knows and whose environment variable
        the user left unset
    """
    known = inductor_options()
    return {
        key: value
        for key, (value, env) in _QUIET_AUTOTUNE.items()
        if key in known and env not in os.environ
    }


def inductor_options() -> set[str]:
    """Names of every Inductor option (``torch._inductor.list_options()``)."""
    import torch._inductor

    return set(torch._inductor.list_options())


def validate_inductor_options(
    options: Mapping[str, Any], dynamic: bool | None = None
) -> None:
    """Raise the error Inductor would raise at the first call, now.

    Inductor checks option value types only when its backend is built, which a lazy
    ``torch.compile`` does at the first call. Building it here, per option, names
    the offending key.

    Parameters
    ----------
    options : Mapping[str, Any]
        The user's Inductor options
    dynamic : bool | None, optional
        :func:`torch.compile`'s ``dynamic``, which the backend is built with

    Raises
    ------
    TypeError
        ``options[key]`` has a type Inductor does not accept
    """
    if missing("inductor_wrapper"):
        return
    for key, value in options.items():
        try:
            torch._TorchCompileInductorWrapper(None, {key: value}, dynamic)  # type: ignore[attr-defined]
        except Exception as err:  # Inductor raises RuntimeError for a bad type
            raise TypeError(
                f"options[{key!r}] = {value!r} is not accepted by Inductor ({err}). "
                f"Pass a value of the option's type, e.g. "
                f"torch._inductor.config.{key} = {_current(key)!r}."
            ) from None


def _current(key: str) -> Any:
    import torch._inductor.config as config

    try:
        return config.get_config_copy()[key]
    except Exception:  # only for the message
        return "..."


# -- preflight -------------------------------------------------------------------------
def preflight(backend: Any, device: torch.device) -> str | None:
    """Why Inductor cannot compile on ``device`` here, or None if it can.

    Checked before tracing, so a machine without a C++ compiler (CPU) or Triton
    (CUDA) runs eagerly at once instead of tracing for minutes and then failing.

    Parameters
    ----------
    backend : Any
        The region's backend; only ``"inductor"`` is checked
    device : torch.device
        Where the region computes

    Returns
    -------
    str | None
        The reason, or None
    """
    if backend != "inductor":
        return None
    reason = missing("inductor_wrapper")
    if reason:
        return reason
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return (
                "Triton is not installed or cannot use this GPU; Inductor needs it "
                "on CUDA (pip install triton)"
            )
    elif device.type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except Exception as err:  # any failure here means Inductor cannot build
            return (
                "no working C++ compiler for Inductor on CPU "
                f"({type(err).__name__}: {err}); install g++ or set CXX"
            )
    return None
