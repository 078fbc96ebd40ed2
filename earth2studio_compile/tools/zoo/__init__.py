"""Real Earth2Studio models with random weights, built without downloads.

Used by the demo, the benchmark and the tests. ``size="full"`` builds the
operational configuration (FCN: AFNO on 720x1440, DLWP: cubed sphere 6x64x64 from
721x1440); ``size="small"`` shrinks grids and networks so a CPU compiles them in
seconds. Weights are random (seeded): timings and eager-vs-compiled agreement do not
depend on trained values, forecasts do.

The Earth2Studio wrappers (:class:`earth2studio.models.px.FCN`, ``DLWP``,
``Persistence``) are used as shipped; small variants only override their fixed grid
sizes. ``sfno`` is a user-style prognostic around torch-harmonics' SFNO, since
Earth2Studio's own SFNO wrapper needs makani, which is not on PyPI. ``aurora`` needs
the ``microsoft-aurora`` package (its builder imports it, the zoo does not);
``stormcast`` needs only physicsnemo; ``ace2`` needs Ai2's ``fme`` with
torch-harmonics 0.8.0 (:mod:`.ace2` says how CI installs them); ``dlesym`` and
``dlesym-latlon`` (DLESyMLatLon: the same networks behind lat/lon regridding) need
``earth2grid``, built from the source in ``third_party/`` (:mod:`.dlesym`);
``aifs2ens`` needs anemoi-models 0.11.2 with torch-geometric and a ``flash_attn``
stand-in (:mod:`.aifs` says how CI installs them); ``fcn3`` needs makani, built
from the source in ``third_party/``, with stand-ins for its training packages
(:mod:`.fcn3`).

Modules: :mod:`.grid` (grids, and the module path every zoo class is published
under), :mod:`.shipped` (FCN, DLWP, Persistence), :mod:`.aurora`, :mod:`.stormcast`,
:mod:`.ace2`, :mod:`.dlesym`, :mod:`.aifs` and :mod:`.fcn3` (the models of
issue 33), :mod:`.user` (the user-style prognostics: toy, SFNO-class), :mod:`.data`
(the seeded random data source). Every name is imported from here,
``earth2studio_compile.tools.zoo``.

Examples
--------
>>> from earth2studio_compile.tools import zoo
>>> model = zoo.build("fcn", size="small")  # doctest: +SKIP
>>> data = zoo.random_source(model)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from earth2studio_compile._imports import quiet_imports
from earth2studio_compile.tools.zoo.ace2 import ace2
from earth2studio_compile.tools.zoo.aifs import aifs2ens
from earth2studio_compile.tools.zoo.aurora import aurora
from earth2studio_compile.tools.zoo.data import Prefetched, SeededRandom, random_source
from earth2studio_compile.tools.zoo.dlesym import dlesym, dlesym_latlon
from earth2studio_compile.tools.zoo.fcn3 import fcn3
from earth2studio_compile.tools.zoo.grid import Grid
from earth2studio_compile.tools.zoo.shipped import dlwp, fcn, persistence
from earth2studio_compile.tools.zoo.stormcast import stormcast
from earth2studio_compile.tools.zoo.user import (
    GridPrognostic,
    SFNOCore,
    SFNOPrognostic,
    ToyCore,
    sfno,
    toy,
)

__all__ = [
    "MEDIUM",
    "MODELS",
    "SIZES",
    "Grid",
    "GridPrognostic",
    "SFNOCore",
    "SFNOPrognostic",
    "Prefetched",
    "SeededRandom",
    "ToyCore",
    "ace2",
    "aifs2ens",
    "aurora",
    "build",
    "dlesym",
    "dlesym_latlon",
    "dlwp",
    "fcn",
    "fcn3",
    "persistence",
    "random_source",
    "sfno",
    "stormcast",
    "toy",
]

MODELS = (
    "fcn",
    "dlwp",
    "sfno",
    "persistence",
    "toy",
    "aurora",
    "stormcast",
    "ace2",
    "dlesym",
    "dlesym-latlon",
    "aifs2ens",
    "fcn3",
)
SIZES = ("small", "medium", "full")
#: The models with a ``"medium"`` size.
MEDIUM = ("fcn", "aurora")


_BUILDERS: dict[str, Callable[..., torch.nn.Module]] = {
    "fcn": fcn,
    "dlwp": dlwp,
    "sfno": sfno,
    "persistence": persistence,
    "toy": toy,
    "aurora": aurora,
    "stormcast": stormcast,
    "ace2": ace2,
    "dlesym": dlesym,
    "dlesym-latlon": dlesym_latlon,
    "aifs2ens": aifs2ens,
    "fcn3": fcn3,
}


def build(name: str, size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Build a named model with random weights.

    Parameters
    ----------
    name : str
        One of :data:`MODELS`, or ``"module:callable"`` for a user factory that
        returns a prognostic (called with no arguments)
    size : str, optional
        ``"small"``, ``"full"``, or ``"medium"`` (the models of :data:`MEDIUM`
        only), by default "small"
    seed : int, optional
        Weight seed, by default 0

    Returns
    -------
    torch.nn.Module
        The prognostic model, on CPU

    Raises
    ------
    ValueError
        Unknown name or size
    """
    if size not in SIZES:
        raise ValueError(f"Unknown size {size!r}; use one of {SIZES}.")
    if size == "medium" and name not in MEDIUM:
        raise ValueError(
            f"size='medium' exists for {' and '.join(repr(n) for n in MEDIUM)} "
            f"only; use 'small' or 'full' for {name!r}."
        )
    if ":" in name:
        import importlib

        module, _, attr = name.partition(":")
        return getattr(importlib.import_module(module), attr)()
    if name not in _BUILDERS:
        raise ValueError(
            f"Unknown model {name!r}; use one of {MODELS} or 'module:callable'."
        )
    # The builders import Earth2Studio's models and physicsnemo (Warp's CUDA probe).
    with quiet_imports():
        return _BUILDERS[name](size=size, seed=seed)
