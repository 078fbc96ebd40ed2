"""Validated ``torch.compile`` options.

Everything a power user may pass to :func:`torch.compile` (``mode``, ``fullgraph``,
``dynamic``, ``backend``, ``options``) is checked here, before any model work, so a
typo is a clear error at the call site rather than a failure minutes into a rollout.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from earth2studio_compile import _torch

# Modes whose Inductor settings turn CUDA graphs on, each with the same mode without
# them (None: Inductor's default mode). Their outputs live in memory the next replay
# overwrites, which is why a session clones what leaves a compiled region.
WITHOUT_CUDAGRAPHS = {
    "reduce-overhead": None,
    "max-autotune": "max-autotune-no-cudagraphs",
}
CUDAGRAPH_MODES = frozenset(WITHOUT_CUDAGRAPHS)


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
                settings = _torch.inductor_options()
                for key in self.options:
                    if key not in settings:
                        close = difflib.get_close_matches(str(key), list(settings), n=1)
                        hint = f" Did you mean {close[0]!r}?" if close else ""
                        raise ValueError(
                            f"Unknown Inductor option {key!r}.{hint} See "
                            "torch._inductor.list_options()."
                        )
                # Value types too: Inductor checks them only at the first call,
                # where the error would end the forecast instead of naming the key.
                _torch.validate_inductor_options(self.options, self.dynamic)


TableOptions = (
    Mapping[str, Any]
    | Callable[[torch.device], Mapping[str, Any]]
    | Callable[[torch.device, str | None], Mapping[str, Any]]
    | None
)


TableAttention = (
    tuple[str, ...] | Callable[[torch.device, str | None], tuple[str, ...]] | None
)

#: The attention choice that routes SDPA calls to FlexAttention in traced code
#: (:class:`~earth2studio_compile._torch.flex.FlexSDPA`); the backends beside it
#: serve the calls it passes on.
FLEX = "flex"

#: Devices where :data:`FLEX` applies; elsewhere the backends beside it serve every
#: call. Inductor's CPU FlexAttention template computed a mask the region builds
#: (Aurora's, repeated over the batch) into NaNs or answers 28% off on an AVX2 CPU
#: while AVX-512 gave SDPA's (torch 2.11, CI, 2026-12-01), and FlexAttention's gain
#: was measured on CUDA.
FLEX_DEVICES = frozenset({"cuda"})

#: Names :attr:`ModelSpec.attention_backends` takes: ``SDPBackend``'s, lower case,
#: and :data:`FLEX`.
ATTENTION_BACKENDS = (
    *(n.lower() for n in SDPBackend.__members__ if n not in ("ERROR", "OVERRIDEABLE")),
    FLEX,
)


def attention_backends(names: Any, parameter: str) -> tuple[str, ...]:
    """``names`` checked as SDPA backend names or :data:`FLEX`
    (:data:`ATTENTION_BACKENDS`).

    Parameters
    ----------
    names : Any
        What a table entry or its function gave
    parameter : str
        Where it came from, for the message

    Returns
    -------
    tuple[str, ...]
        The names, lower case

    Raises
    ------
    ValueError
        A name is not a backend
    """
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"{parameter} must be a tuple of SDPA backend names, got {names!r}. "
            f"Use names from {ATTENTION_BACKENDS}, e.g. ('math',)."
        )
    found = tuple(n.lower() for n in names)
    unknown = [n for n in found if n not in ATTENTION_BACKENDS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], ATTENTION_BACKENDS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"{parameter} names {unknown[0]!r}, which is neither an SDPA backend nor "
            f"{FLEX!r}.{hint} "
            f"Use names from {ATTENTION_BACKENDS}."
        )
    return found


def _table_choice(found: Any, device: torch.device, precision: str | None) -> Any:
    """The table's choice for a region on ``device`` in ``precision``: a function
    that takes the precision too is given it, one of the device alone (a user's
    ``register_model`` entry) only the device."""
    if not callable(found):
        return found
    try:
        inspect.signature(found).bind(device, precision)
    except (TypeError, ValueError):
        return found(device)  # type: ignore[call-arg]
    return found(device, precision)  # type: ignore[call-arg]


class TableChoices(Protocol):
    """What the model table decides about compiling a model (a ``ModelSpec``)."""

    @property
    def cudagraphs(self) -> bool:
        """Whether ``mode=None`` means CUDA graphs on CUDA for this model."""
        ...

    @property
    def inductor_options(self) -> TableOptions:
        """Inductor options for the model, or a function of the device (and of
        the region's precision, where it takes two arguments)."""
        ...

    @property
    def attention_backends(self) -> TableAttention:
        """SDPA backends the compiled code is traced with, or a function of the
        device and the region's precision giving them; empty: PyTorch's choice."""
        ...


def _autotune_extras(
    inductor: bool,
    mode: str | None,
    options: Mapping[str, Any] | None,
    device: torch.device,
) -> dict[str, Any]:
    """Options added when Inductor autotunes: quiet tables, and on CPU a fix.

    Only keys the user's ``options`` leave unset are added.
    """
    settings = {**(_torch.mode_options(mode) if mode else {}), **(options or {})}
    if not inductor or not (
        settings.get("max_autotune") or settings.get("max_autotune_gemm")
    ):
        return {}
    extra = dict(_torch.quiet_autotune_options())
    if device.type == "cpu":
        extra.update(_torch.cpu_autotune_fixes())
    return {k: v for k, v in extra.items() if k not in (options or {})}


@dataclass(frozen=True)
class CompilePolicy:
    """What one region compiles with on one device, resolved once.

    Three inputs decide it: the user's validated :class:`CompileOptions`, the model
    table's choices for the model (:attr:`ModelSpec.cudagraphs`,
    :attr:`ModelSpec.inductor_options`) and the device of the region's first input.
    The user's explicit ``mode`` or ``options`` always win over the table's.

    Attributes
    ----------
    backend : str | Callable
        Dynamo backend
    mode : str | None
        Inductor mode passed to :func:`torch.compile` (None: no mode argument)
    options : dict[str, Any] | None
        Inductor options passed to :func:`torch.compile`
    fullgraph, dynamic : bool, bool | None
        As in :func:`torch.compile`
    cudagraphs : bool
        Compiled code replays CUDA graphs, so outputs must be cloned before they
        escape the region
    label : str
        Short human-readable form, e.g. ``inductor/reduce-overhead``; the table's
        options follow a ``+``
    cache_text : str
        Stable text of everything that changes compiled code, for cache keys
    attention : tuple[str, ...]
        SDPA backends (``torch.nn.attention.SDPBackend`` names, lower case) the
        region's code is traced and lowered with (:meth:`tracing`), and
        :data:`FLEX` where SDPA calls become FlexAttention; empty: PyTorch's own
        choice at the time
    """

    backend: str | Callable[..., Any]
    mode: str | None
    options: dict[str, Any] | None = field(hash=False)
    fullgraph: bool
    dynamic: bool | None
    cudagraphs: bool
    label: str
    cache_text: str
    attention: tuple[str, ...] = ()

    @classmethod
    def resolve(
        cls,
        options: CompileOptions,
        device: torch.device,
        table: TableChoices | None = None,
        without_cudagraphs: bool = False,
        precision: str | None = None,
    ) -> CompilePolicy:
        """Resolve the policy for ``device``.

        Parameters
        ----------
        options : CompileOptions
            The user's options
        device : torch.device
            Device of the region's first input
        table : TableChoices | None, optional
            The model table's entry for the model (a ``ModelSpec``): whether
            ``mode=None`` means CUDA graphs on CUDA, and Inductor options (or a
            function of the device) used only when the user chose neither
            ``mode`` nor ``options``; by default CUDA graphs and no options
        without_cudagraphs : bool, optional
            No CUDA graphs whatever the user or the table chose: a CUDA-graph mode
            becomes the same mode without them (``"reduce-overhead"``: Inductor's
            default), ``triton.cudagraphs`` is turned off. For a region whose
            modules keep tensor state on themselves
            (:mod:`earth2studio_compile.module_state`); by default False
        precision : str | None, optional
            The region's precision, for a table function of the device and the
            precision: the options of a region in ``"tf32"`` are those of the
            TF32 flags its calls run under, not the flags of the moment; by
            default None (PyTorch's flags as they are). The table's attention
            backends are resolved the same way, whatever the user chose, and
            :data:`FLEX` only on :data:`FLEX_DEVICES`

        Returns
        -------
        CompilePolicy
            The resolved policy
        """
        inductor = options.backend == "inductor"
        table_cudagraphs = table.cudagraphs if table is not None else True
        table_options = table.inductor_options if table is not None else None
        mode = options.mode
        if (
            mode is None
            and device.type == "cuda"
            and inductor
            and not options.options
            and table_cudagraphs
        ):
            mode = "reduce-overhead"
        if without_cudagraphs and mode in WITHOUT_CUDAGRAPHS:
            mode = WITHOUT_CUDAGRAPHS[mode]
        chosen: dict[str, Any] = {}
        if options.mode is None and not options.options and inductor:
            chosen = dict(_table_choice(table_options, device, precision) or {})
        torch_options: dict[str, Any] | None = None
        torch_mode = mode
        if chosen:
            # torch.compile takes a mode or options, not both; a mode is a preset
            # of options, so the table's options carry the mode's own settings.
            torch_options = {**(_torch.mode_options(mode) if mode else {}), **chosen}
            torch_mode = None
        if options.options:
            torch_options = dict(options.options)
        if without_cudagraphs and (torch_options or {}).get("triton.cudagraphs"):
            torch_options = {**(torch_options or {}), "triton.cudagraphs": False}
        extra = _autotune_extras(inductor, torch_mode, torch_options, device)
        if extra:
            torch_options = {
                **(_torch.mode_options(torch_mode) if torch_mode else {}),
                **(torch_options or {}),
                **extra,
            }
            torch_mode = None
        if device.type != "cuda":
            cudagraphs = False
        elif mode in CUDAGRAPH_MODES:
            cudagraphs = True
        else:
            cudagraphs = bool((torch_options or {}).get("triton.cudagraphs", False))
        name = (
            options.backend
            if isinstance(options.backend, str)
            else getattr(options.backend, "__name__", type(options.backend).__name__)
        )
        label = f"{name}/{mode or 'default'}"
        shown = {
            **chosen,
            **{k: v for k, v in extra.items() if k not in _torch.QUIET_AUTOTUNE_KEYS},
        }
        attention: tuple[str, ...] = ()
        if table is not None and table.attention_backends is not None:
            attention = attention_backends(
                _table_choice(table.attention_backends, device, precision) or (),
                "ModelSpec.attention_backends",
            )
        if FLEX in attention and device.type not in FLEX_DEVICES:
            attention = tuple(n for n in attention if n != FLEX)
        if attention:
            shown["attention"] = "|".join(attention)
        if shown:
            label += "+" + ",".join(f"{k}={v}" for k, v in sorted(shown.items()))
        user = sorted((str(k), repr(v)) for k, v in (options.options or {}).items())
        cache_text = (
            f"{label}|fullgraph={options.fullgraph}|dynamic={options.dynamic}|"
            f"options={user}"
        )
        return cls(
            backend=options.backend,
            mode=torch_mode,
            options=torch_options,
            fullgraph=options.fullgraph,
            dynamic=options.dynamic,
            cudagraphs=cudagraphs,
            label=label,
            cache_text=cache_text,
            attention=attention,
        )

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """The block the region's code is traced and lowered in (a compiled call
        that may compile, an export and its AOTInductor compile): SDPA restricted
        to :attr:`attention`, which the graph then keeps; PyTorch's backends are
        put back afterwards, also on an exception. Process-wide while it lasts:
        only for a block on the thread that runs the model. With :data:`FLEX`,
        the SDPA calls FlexAttention serves become FlexAttention in the traced
        graph (:class:`~earth2studio_compile._torch.flex.FlexSDPA`, this thread
        only); the other backends named serve the rest.

        Yields
        ------
        None
            Inside ``torch.nn.attention.sdpa_kernel`` of the backends, with
            FlexAttention's routing where chosen; nothing changed where the table
            chose none
        """
        members = SDPBackend.__members__
        backends = [members[n.upper()] for n in self.attention if n != FLEX]
        with contextlib.ExitStack() as stack:
            if backends:
                stack.enter_context(sdpa_kernel(backends))
            if FLEX in self.attention:
                stack.enter_context(_torch.FlexSDPA())
            yield

    def torch_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`torch.compile`.

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
        if self.mode is not None:
            kwargs["mode"] = self.mode
        if self.options:
            kwargs["options"] = dict(self.options)
        return kwargs
