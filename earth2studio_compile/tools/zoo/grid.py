"""The zoo's lat-lon grids, and subclasses of Earth2Studio wrappers on a smaller one.

Every public class of the zoo is published as ``earth2studio_compile.tools.zoo.NAME``
(:func:`published`), wherever its module: the model table, the compile cache and the
ahead-of-time artifacts name a class by ``module.QualName``, so those names do not
change when the zoo's modules are reorganized.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

#: The module path the zoo's classes are published under (the package).
ZOO = __name__.rpartition(".")[0]

T = TypeVar("T", bound=type)


def published(cls: T) -> T:
    """Give ``cls`` the module path :data:`ZOO`, where the package re-exports it."""
    cls.__module__ = ZOO
    return cls


@published
@dataclass(frozen=True)
class Grid:
    """A lat-lon grid (``nlat`` x ``nlon``), optionally with the south pole."""

    nlat: int
    nlon: int
    south_pole: bool = False

    @property
    def lat(self) -> np.ndarray:
        if self.south_pole:
            return np.linspace(90, -90, self.nlat)
        return np.linspace(90, -90, self.nlat, endpoint=False)

    @property
    def lon(self) -> np.ndarray:
        return np.linspace(0, 360, self.nlon, endpoint=False)


def subclass(base: Any, name: str, **methods: Callable[..., Any]) -> type:
    """A subclass of ``base`` named ``name``, overriding ``methods``.

    The model table is keyed by ``module.QualName``: both are set here (the module
    is :data:`ZOO`), so the key does not depend on where the class is built.
    """
    names = {"__module__": ZOO, "__qualname__": name}
    return type(name, (base,), {**methods, **names})


def on_grid(cls: Any, grid: Grid) -> type:
    """Subclass of an Earth2Studio wrapper whose fixed lat-lon grid is ``grid``."""

    def input_coords(self: Any) -> OrderedDict:
        coords = cls.input_coords(self)
        coords["lat"], coords["lon"] = grid.lat, grid.lon
        return coords

    def output_coords(self: Any, input_coords: OrderedDict) -> OrderedDict:
        coords = cls.output_coords(self, input_coords)
        coords["lat"], coords["lon"] = grid.lat, grid.lon
        return coords

    name = f"{cls.__name__}{grid.nlat}x{grid.nlon}"
    return subclass(cls, name, input_coords=input_coords, output_coords=output_coords)
