"""Which submodules of one model instance compile: the table's answer, resolved.

:func:`plan` looks the model's class up in the model table
(:mod:`earth2studio_compile.models`), or takes the generic path
(:func:`generic_spec`) for a class it does not list, and resolves the spec's dotted
paths to the model's submodules (:class:`Plan`), with the reason when nothing
compiles.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parameter import is_lazy

from earth2studio_compile import _torch
from earth2studio_compile.models import lookup
from earth2studio_compile.patches import MethodPatch, on_submodules
from earth2studio_compile.spec import ModelSpec

# Type hints only: importing Earth2Studio takes a minute on a small machine, and
# the package is imported before it (the demo's banner comes first).
if TYPE_CHECKING:
    from earth2studio.models.dx.base import DiagnosticModel
    from earth2studio.models.px.base import PrognosticModel

__all__ = ["Plan", "generic_spec", "plan", "resolve", "table_patches"]


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _lazy(module: torch.nn.Module) -> list[str]:
    return [n for n, p in module.named_parameters() if is_lazy(p)]


def _outside(model: Any, spec: ModelSpec) -> list[str]:
    """Parameters of ``model`` that none of the spec's paths accounts for."""
    if not isinstance(model, torch.nn.Module):
        return []
    prefixes = [
        p.split("*", 1)[0].rstrip(".")
        for p in (*spec.regions, *spec.wrapped, *spec.covers)
    ]
    return [
        name
        for name, _ in model.named_parameters()
        if not any(
            not pre or name == pre or name.startswith(pre + ".") for pre in prefixes
        )
    ]


def generic_spec(model: PrognosticModel | DiagnosticModel) -> ModelSpec:
    """Spec for a model the table does not list (a user's own model).

    The model's ``_forward``/``__call__`` handles coordinates, so the model itself is
    never traced. Its direct child modules hold the tensor work: if one of them
    holds most of the parameters it is the core and is compiled alone; otherwise
    every child with parameters is compiled. A model with no parameters has
    nothing to compile.

    Parameters
    ----------
    model : PrognosticModel | DiagnosticModel
        A model instance

    Returns
    -------
    ModelSpec
        Spec with the chosen regions, or a reason to stay eager
    """
    if not isinstance(model, torch.nn.Module):
        return ModelSpec(reason=f"{type(model).__name__} is not a torch.nn.Module")
    lazy = _lazy(model)
    if lazy:
        return ModelSpec(
            reason=f"uninitialized lazy parameters ({', '.join(lazy[:3])}): they get "
            "their shapes at the first eager call; run one step eagerly, then compile"
        )
    children: list[tuple[str, torch.nn.Module]] = []
    for n, m in model.named_children():
        # Containers are never called themselves: their elements are.
        if isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            children.extend((f"{n}.{k}", c) for k, c in m.named_children())
        else:
            children.append((n, m))
    children = [(n, m) for n, m in children if _n_params(m) > 0]
    total = _n_params(model)
    if not children:
        return ModelSpec(reason="no submodule with parameters: nothing to compile")
    name, biggest = max(children, key=lambda c: _n_params(c[1]))
    if 2 * _n_params(biggest) > total:
        return ModelSpec(regions=(name,), note="generic: largest submodule")
    return ModelSpec(
        regions=tuple(n for n, _ in children),
        note="generic: submodules with parameters",
    )


@dataclass(frozen=True)
class Plan:
    """The resolved decision for one model instance.

    Attributes
    ----------
    name : str
        Model class name
    targets : tuple[tuple[str, torch.nn.Module], ...]
        ``(dotted path, submodule)`` pairs to compile
    spec : ModelSpec
        The spec the targets came from
    source : str
        ``"table"``, ``"generic"`` or ``"user"``
    """

    name: str
    targets: tuple[tuple[str, torch.nn.Module], ...]
    spec: ModelSpec
    source: str

    @property
    def reason(self) -> str | None:
        """Why nothing is compiled, or None."""
        if self.targets:
            return None
        return self.spec.reason or "no compilable submodule found"


def resolve(model: Any, path: str) -> list[tuple[str, Any]]:
    """Objects at a dotted path; a ``*`` segment stands for every child.

    Plain ``getattr`` rather than ``get_submodule``: some cores are reachable only
    through properties or non-module holders (ACE's stepper).

    Parameters
    ----------
    model : Any
        Root object
    path : str
        For example ``"model"``, ``"stepper.modules.0"`` or ``"stage_models.*"``

    Returns
    -------
    list[tuple[str, Any]]
        ``(concrete path, object)`` pairs; empty when the path does not exist
    """
    found: list[tuple[str, Any]] = [("", model)]
    for part in path.split("."):
        step: list[tuple[str, Any]] = []
        for prefix, obj in found:
            if part == "*":
                if isinstance(obj, torch.nn.Module):
                    items = list(obj.named_children())
                elif isinstance(obj, (list, tuple)):
                    items = [(str(i), o) for i, o in enumerate(obj)]
                else:
                    items = []
            else:
                try:
                    items = [(part, getattr(obj, part))]
                except Exception:  # a property may raise anything; treat as absent
                    items = []
            step.extend((f"{prefix}.{n}" if prefix else n, o) for n, o in items)
        found = step
    return [(p, o) for p, o in found if o is not None]


def _expand(
    path: str, module: torch.nn.Module, exclude: tuple[str, ...]
) -> list[tuple[str, torch.nn.Module]]:
    """Largest subtrees of ``module`` that contain no excluded class."""
    if type(module).__name__ in exclude:
        return []
    if not any(type(m).__name__ in exclude for m in module.modules()):
        return [(path, module)]
    out = []
    for name, child in module.named_children():
        # Leaves without state (activations, reshapes) are not worth a graph each.
        if not list(child.children()) and not list(child.parameters()):
            continue
        out.extend(_expand(f"{path}.{name}", child, exclude))
    return out


def plan(
    model: PrognosticModel | DiagnosticModel, regions: tuple[str, ...] | None = None
) -> Plan:
    """Decide what to compile in ``model``.

    Parameters
    ----------
    model : PrognosticModel | DiagnosticModel
        A prognostic or diagnostic model instance
    regions : tuple[str, ...] | None, optional
        Override: compile exactly these dotted paths, by default the table's (or
        the generic path's) choice

    Returns
    -------
    Plan
        Targets to compile, or the reason there are none

    Raises
    ------
    ValueError
        A path in ``regions`` does not name an ``nn.Module`` of the model
    """
    name = type(model).__name__
    if regions is not None:
        spec, source = ModelSpec(regions=tuple(regions)), "user"
    else:
        found = lookup(model)
        spec, source = (
            (found[1], "table") if found else (generic_spec(model), "generic")
        )
        exact = f"{type(model).__module__}.{type(model).__qualname__}"
        if found and found[0] != exact:
            # Matched through a base class: the entry must still describe the model.
            extra = _outside(model, spec)
            if extra:
                base = found[0].rsplit(".", 1)[-1]
                generic = generic_spec(model)
                spec = dataclasses.replace(
                    generic,
                    note=f"subclass of {base} with parameters its entry does not "
                    f"describe ({', '.join(extra[:3])}); {generic.note}".rstrip("; "),
                )
                source = "generic"
    targets: list[tuple[str, torch.nn.Module]] = []
    missing: list[str] = []
    precompiled: list[str] = []
    for pattern in spec.regions:
        hits = [
            (p, m) for p, m in resolve(model, pattern) if isinstance(m, torch.nn.Module)
        ]
        if not hits:
            if source == "user":
                children = [n for n, _ in getattr(model, "named_children", list)()]
                raise ValueError(
                    f"{name} has no nn.Module at {pattern!r}. Name a submodule, e.g. "
                    f"one of {children}."
                )
            missing.append(pattern)
        for path, module in hits:
            if _torch.is_optimized_module(module):  # compiled by someone else
                precompiled.append(path)
            else:
                targets.extend(_expand(path, module, spec.exclude))
    for pattern in spec.wrapped:
        for prefix, inner in resolve(model, pattern):
            sub = plan(inner)
            targets.extend((f"{prefix}.{p}", m) for p, m in sub.targets)
    if not targets and spec.regions and not spec.reason:
        if precompiled:
            why = f"already compiled by the model itself: {', '.join(precompiled)}"
        else:
            why = (
                f"no nn.Module found at {', '.join(missing)} (a different version "
                "of the model's package?)"
            )
        spec = ModelSpec(reason=why)
    return Plan(name=name, targets=tuple(targets), spec=spec, source=source)


def table_patches(model: Any) -> list[tuple[Any, MethodPatch]]:
    """The method patches the table lists for ``model`` and the models it wraps.

    They follow the class's entry whatever compiles (``regions=`` included): each
    replacement is bitwise identical, and applies only to the code it was written
    for (:class:`~earth2studio_compile.patches.Patches` checks).

    Parameters
    ----------
    model : Any
        A model instance

    Returns
    -------
    list[tuple[Any, MethodPatch]]
        ``(instance, patch)`` pairs: the model's own, and for a patch naming
        :attr:`~earth2studio_compile.patches.MethodPatch.submodules`, each such
        submodule
    """
    found = lookup(model)
    if found is None:
        return []
    spec = found[1]
    out = [(model, patch) for patch in spec.patches if not patch.submodules]
    out += on_submodules(spec.patches, model)
    for pattern in spec.wrapped:
        for _, inner in resolve(model, pattern):
            out.extend(table_patches(inner))
    return out
