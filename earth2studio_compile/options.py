"""Validated ``torch.compile`` options.

Everything a power user may pass to :func:`torch.compile` (``mode``, ``fullgraph``,
``dynamic``, ``backend``, ``options``) is checked here, before any model work, so a
typo is a clear error at the call site rather than a failure minutes into a rollout.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from earth2studio_compile import _torch

# Modes whose Inductor settings turn CUDA graphs on. Their outputs live in memory the
# next replay overwrites, which is why a session clones what leaves a compiled region.
CUDAGRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})


def inductor_modes() -> list[str]:
    """Mode strings the installed Inductor accepts.

    Returns
    -------
    list[str]
        For example ``["default", "reduce-overhead", "max-autotune", ...]``
    """
    return _torch.inductor_modes()


def _type_error(name: str, expected: str, value: Any, fix: str) -> TypeError:
    return TypeError(
        f"{name} must be {expected}, got {type(value).__name__} ({value!r}). {fix}"
    )


@dataclass(frozen=True)
class CompileOptions:
    """Arguments passed through to :func:`torch.compile` for every compiled region.

    Parameters
    ----------
    mode : str | None, optional
        Inductor mode. ``None`` (default) picks per device at the first call:
        ``"reduce-overhead"`` (CUDA graphs) on CUDA, Inductor's default elsewhere.
    fullgraph : bool, optional
        Fail instead of graph-breaking, by default False. With True a graph break
        inside a compiled core is a compile failure, so the region falls back to eager.
    dynamic : bool | None, optional
        Dynamic-shape policy, as in :func:`torch.compile`, by default None
    backend : str | Callable, optional
        Dynamo backend name or callable, by default ``"inductor"``
    options : Mapping[str, Any] | None, optional
        Inductor config overrides (``torch._inductor.list_options()``), by default None
    auto_cudagraphs : bool, optional
        Whether ``mode=None`` means CUDA graphs on CUDA, by default True. The model
        table turns it off per model (:attr:`ModelSpec.cudagraphs`)
    auto_options : Mapping | Callable[[torch.device], Mapping] | None, optional
        Inductor options the model table sets for a model
        (:attr:`ModelSpec.inductor_options`); used only when neither ``mode`` nor
        ``options`` is given, by default None

    Raises
    ------
    TypeError
        An argument has the wrong type
    ValueError
        An unknown mode, backend or Inductor option, or ``mode`` together with
        ``options``
    """

    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    backend: str | Callable[..., Any] = "inductor"
    options: Mapping[str, Any] | None = field(default=None, hash=False)
    auto_cudagraphs: bool = True
    auto_options: Mapping[str, Any] | Callable[[torch.device], Mapping[str, Any]] | None = (
        field(default=None, hash=False, compare=False)
    )

    def __post_init__(self) -> None:
        if self.mode is not None:
            if not isinstance(self.mode, str):
                raise _type_error(
                    "mode", "a str or None", self.mode, "For example mode='default'."
                )
            modes = inductor_modes()
            if self.mode not in modes:
                close = difflib.get_close_matches(self.mode, modes, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"Unknown compile mode {self.mode!r}.{hint} Use one of {modes}, "
                    "or mode=None to let earth2studio-compile choose "
                    "('reduce-overhead' on CUDA, 'default' elsewhere)."
                )
            if self.backend != "inductor":
                raise ValueError(
                    f"mode={self.mode!r} only applies to backend='inductor', not "
                    f"{self.backend!r}. Drop mode, or use backend='inductor'."
                )
        if not isinstance(self.fullgraph, bool):
            raise _type_error(
                "fullgraph", "a bool", self.fullgraph, "Use True or False."
            )
        if self.dynamic is not None and not isinstance(self.dynamic, bool):
            raise _type_error(
                "dynamic", "a bool or None", self.dynamic, "Use True, False or None."
            )
        if isinstance(self.backend, str):
            known = _torch.known_backends()
            if self.backend not in known:
                raise ValueError(
                    f"Unknown torch.compile backend {self.backend!r}. Use one of "
                    f"{sorted(known)} or pass a backend callable."
                )
        elif not callable(self.backend):
            raise _type_error(
                "backend",
                "a backend name or a callable",
                self.backend,
                "For example backend='inductor'.",
            )
        if self.options is not None:
            if not isinstance(self.options, Mapping):
                raise _type_error(
                    "options",
                    "a dict of Inductor settings or None",
                    self.options,
                    "For example options={'triton.cudagraphs': True}.",
                )
            if self.mode is not None:
                raise ValueError(
                    "Pass either mode or options, not both: torch.compile accepts only "
                    "one. Put what the mode would set into options, e.g. "
                    "options={'triton.cudagraphs': True} for CUDA graphs."
                )
            if self.backend == "inductor":
                known = _torch.inductor_options()
                for key in self.options:
                    if key not in known:
                        close = difflib.get_close_matches(str(key), known, n=1)
                        hint = f" Did you mean {close[0]!r}?" if close else ""
                        raise ValueError(
                            f"Unknown Inductor option {key!r}.{hint} See "
                            "torch._inductor.list_options()."
                        )
                # Value types too: Inductor checks them only at the first call,
                # where the error would end the forecast instead of naming the key.
                _torch.validate_inductor_options(self.options, self.dynamic)

    def resolve_mode(self, device: torch.device) -> str | None:
        """The mode a region on ``device`` compiles with.

        Parameters
        ----------
        device : torch.device
            Device of the region's first input

        Returns
        -------
        str | None
            The user's mode, else ``"reduce-overhead"`` on CUDA with the Inductor
            backend, no explicit ``options`` and ``auto_cudagraphs``, else None
            (Inductor's default)
        """
        if self.mode is not None:
            return self.mode
        if (
            device.type == "cuda"
            and self.backend == "inductor"
            and not self.options
            and self.auto_cudagraphs
        ):
            return "reduce-overhead"
        return None

    def uses_cudagraphs(self, device: torch.device) -> bool:
        """Whether compiled code on ``device`` replays CUDA graphs.

        Parameters
        ----------
        device : torch.device
            Device of the region's first input

        Returns
        -------
        bool
            True when outputs must be cloned before they escape the region
        """
        if device.type != "cuda":
            return False
        if self.resolve_mode(device) in CUDAGRAPH_MODES:
            return True
        chosen = {**self.table_options(device), **(self.options or {})}
        return bool(chosen.get("triton.cudagraphs", False))

    def table_options(self, device: torch.device) -> dict[str, Any]:
        """The model table's Inductor options for ``device``, when they apply.

        Parameters
        ----------
        device : torch.device
            Device of the region's first input

        Returns
        -------
        dict[str, Any]
            Empty when the user chose ``mode`` or ``options`` (theirs win), the
            backend is not Inductor, or the table sets none
        """
        if self.mode is not None or self.options or self.backend != "inductor":
            return {}
        chosen = self.auto_options
        if callable(chosen):
            chosen = chosen(device)
        return dict(chosen or {})

    def torch_kwargs(self, device: torch.device) -> dict[str, Any]:
        """Keyword arguments for :func:`torch.compile` on ``device``.

        Parameters
        ----------
        device : torch.device
            Device of the region's first input

        Returns
        -------
        dict[str, Any]
            ``backend``, ``fullgraph``, ``dynamic`` and ``mode`` or ``options``
        """
        kwargs: dict[str, Any] = {
            "backend": self.backend,
            "fullgraph": self.fullgraph,
            "dynamic": self.dynamic,
        }
        mode = self.resolve_mode(device)
        table = self.table_options(device)
        if table:
            # torch.compile takes a mode or options, not both; a mode is a preset
            # of options, so the table's options carry the mode's own settings.
            if mode is not None:
                table = {**_torch.mode_options(mode), **table}
            kwargs["options"] = table
        elif mode is not None:
            kwargs["mode"] = mode
        if self.options:
            kwargs["options"] = dict(self.options)
        return kwargs

    def describe(self, device: torch.device) -> str:
        """Short human-readable form, e.g. ``inductor/reduce-overhead``.

        The model table's options, if any, follow a ``+``:
        ``inductor/default+layout_optimization=False``.
        """
        name = self.backend if isinstance(self.backend, str) else getattr(
            self.backend, "__name__", type(self.backend).__name__
        )
        text = f"{name}/{self.resolve_mode(device) or 'default'}"
        table = self.table_options(device)
        if table:
            text += "+" + ",".join(f"{k}={v}" for k, v in sorted(table.items()))
        return text

    def cache_text(self, device: torch.device) -> str:
        """Stable text of everything that changes compiled code, for cache keys."""
        options = sorted((str(k), repr(v)) for k, v in (self.options or {}).items())
        return (
            f"{self.describe(device)}|fullgraph={self.fullgraph}|"
            f"dynamic={self.dynamic}|options={options}"
        )
